# The two front-door commands: `make demo` and `make test`. Each creates/refreshes .venv as needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU build of torch for this project's machines; GPU users: install your CUDA torch first, then `pip install -e .`
TORCH_PIN ?= torch==2.13.0
DEMO_OUT ?= demo_output
PYTEST_ARGS ?=

.PHONY: venv demo test lint docs benchmarks clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[dev,docs,gcm]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/smoe demo --out $(DEMO_OUT)

# pytest's exit code 5 (no tests collected) is a failure here, never a silent pass.
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: pytest collected no tests"; exit 1; fi; exit $$rc

lint: $(STAMP)
	$(VENV)/bin/ruff check smoeweather pipelines tests benchmarks

# The documentation site (mkdocs.yml) → build/site/index.html, offline and strict: any warning fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

benchmarks: $(STAMP)
	$(PY) benchmarks/smoe_layer.py

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache
