# The two front-door commands: `make demo` and `make test`. Each creates/refreshes .venv as needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch for .venv: TORCH_PIN from your pip index (PyPI's Linux wheel is the CUDA build); TORCH_INDEX=URL takes it from
# that index instead, e.g. https://download.pytorch.org/whl/cpu for the CPU build. A torch already in .venv is kept.
TORCH_PIN ?= torch==2.13.0
TORCH_INDEX ?=
DEMO_OUT ?= demo_output
# the suite in 4 pytest-xdist workers, whole files per worker (module fixtures built once), also on 2 cores: a large
# part of it waits on child processes (DDP, notebooks, dask clusters): measured 14.2 min with 2 workers and 5.7 min
# with 4 on one quiet 2-core machine. PYTEST_ARGS="-n 0" runs it in one process
PYTEST_ARGS ?= -n 4 --dist loadfile

.PHONY: venv demo demo-full test lint docs benchmarks wheel-smoke clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_PIN)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[dev,docs,gcm,earth2studio]"  # earth2studio: tests/interop/test_earth2studio.py runs its workflows
	touch $(STAMP)

# the first demo (150 steps a model, minutes); demo-full: 362 steps a model, the run docs/guide/results-reading.md reads
demo: $(STAMP)
	$(VENV)/bin/smoe demo --out $(DEMO_OUT)

demo-full: $(STAMP)
	$(VENV)/bin/smoe demo --full --out $(DEMO_OUT)

# pytest's exit code 5 (no tests collected) is a failure here, never a silent pass.
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: pytest collected no tests"; exit 1; fi; exit $$rc

lint: $(STAMP)
	$(VENV)/bin/ruff check smoeweather pipelines tests benchmarks

# The documentation site (mkdocs.yml) → build/site/index.html, offline and strict: any warning fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# A real (non-editable) install: build the wheel and install it into a fresh environment with ONLY its declared
# dependencies and the maps extra (CPU torch first, then the wheel; nothing is borrowed from .venv), and run from
# outside the clone:
# --version, the demo at 2 steps, a built-in config by name, and the scoring of an ensemble.
WHEEL_DIR := build/wheel
WHEEL_ENV := build/wheel-env
wheel-smoke: $(STAMP)
	rm -rf $(WHEEL_DIR) $(WHEEL_ENV) build/wheel-run
	$(PY) -m pip wheel . --no-deps --no-build-isolation -q -w $(WHEEL_DIR)
	$(PYTHON) -m venv $(WHEEL_ENV)
	$(WHEEL_ENV)/bin/python -m pip install -q --upgrade pip
	$(WHEEL_ENV)/bin/python -m pip install -q "$(TORCH_PIN)"
	$(WHEEL_ENV)/bin/python -m pip install -q "$$(ls $(WHEEL_DIR)/*.whl)[maps]"  # the demo draws maps (cartopy)
	mkdir -p build/wheel-run
	cd build/wheel-run && ../wheel-env/bin/python -c "import smoeweather, sys; \
	    assert 'wheel-env' in smoeweather.__file__, smoeweather.__file__"
	cd build/wheel-run && ../wheel-env/bin/smoe --version
	cd build/wheel-run && ../wheel-env/bin/smoe demo --steps 2 --out demo > demo.log
	cd build/wheel-run && ../wheel-env/bin/smoe train --config weatherbench/world_dense \
	    data.store=demo/data/default_world.zarr trainer.max_steps=2 output_dir=runs/by_name > train.log
	test -f build/wheel-run/runs/by_name/checkpoints/last.ckpt
	cd build/wheel-run && ../wheel-env/bin/python ../../.ci/score_ensemble.py
	@echo "wheel-smoke: the wheel, with only its declared dependencies, ran --version, the demo, a built-in config and scored an ensemble"

benchmarks: $(STAMP)
	$(PY) -m benchmarks.smoe_layer

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache
