"""The documentation site: the committed CLI reference is current and equals `smoe ... --help`, and every page is
in the nav.

The site itself is built (strict, offline) by `make docs`, which .ci/run runs; these tests are the fast checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What `smoe WORDS --help` prints, for every WORDS, in one interpreter: `smoe` is `smoeweather.cli:main`.
_PRINT_HELPS = """
import contextlib, io, json, sys
from smoeweather.cli import main
out = {}
for words in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        main([*words, "--help"])
    out[" ".join(words)] = buf.getvalue()
print(json.dumps(out))
"""


def _run(argv: list[str], columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cli_reference_equals_help_of_every_verb() -> None:
    """Each block of the generated page is exactly what `smoe <verb> [<sub-verb>] --help` prints."""
    ref = _cli_reference()
    texts = ref.help_texts()
    from smoeweather.commands import VERBS

    assert set(VERBS) <= {w[0] for w, _ in texts if w}, "a verb is missing from the CLI reference"
    printed = json.loads(_run([sys.executable, "-c", _PRINT_HELPS, json.dumps([w for w, _ in texts])], ref.COLUMNS))
    smoe = Path(sys.executable).with_name("smoe")  # the installed console script itself, once
    if smoe.exists():
        assert _run([str(smoe), "--help"], ref.COLUMNS) == printed[""]
    page = ref.markdown()
    for words, text in texts:
        command = " ".join(("smoe", *words))
        assert printed[" ".join(words)] == text, f"`{command} --help` differs from the generated reference"
        assert f"$ {command} --help\n{text.rstrip()}\n```" in page


def test_committed_cli_reference_is_current() -> None:
    """docs/reference/cli.md, as committed (readable on GitHub), is what the generator writes from the parsers
    now; and the docs hook only verifies it, failing a build on a stale page."""
    import pytest
    from mkdocs.exceptions import PluginError

    ref = _cli_reference()
    committed = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert "{{" not in committed, "docs/reference/cli.md holds a template marker: it must be the generated page"
    assert committed == ref.page_text(), ref.stale_message()
    page = type("Page", (), {"file": type("File", (), {"src_uri": ref.PAGE})()})()
    assert ref.on_page_markdown(committed, page, None, None) == committed
    with pytest.raises(PluginError, match="out of date.*regenerate it with"):
        ref.on_page_markdown(committed.replace("--batch-size", "--batch-sise", 1), page, None, None)


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return [p for item in node for p in _nav_pages(item)]


def test_every_page_is_in_the_nav() -> None:
    """Every Markdown page and notebook is reachable from the site's navigation, and every nav entry exists."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = set(_nav_pages(config["nav"]))
    pages = set()
    for folder, dirs, files in os.walk(DOCS, followlinks=True):  # docs/notebooks links to notebooks/
        dirs[:] = [d for d in dirs if d not in ("hooks", ".ipynb_checkpoints")]
        rel = Path(folder).relative_to(DOCS)
        pages |= {(rel / f).as_posix() for f in files if f.endswith((".md", ".ipynb"))}
    assert pages == nav, f"not in the nav: {sorted(pages - nav)}; in the nav but missing: {sorted(nav - pages)}"


def _nav_titles(node) -> list[str]:
    if isinstance(node, dict):
        return [t for k, v in node.items() for t in ([k] if isinstance(v, str) else _nav_titles(v))]
    if isinstance(node, list):
        return [t for item in node for t in _nav_titles(item)]
    return []


def test_page_titles_are_unique() -> None:
    """No two pages share a title: neither in the navigation nor as their first heading."""
    titles = _nav_titles(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert len(titles) == len(set(titles)), sorted(t for t in titles if titles.count(t) > 1)
    headings = [p.read_text().splitlines()[0] for p in DOCS.rglob("*.md") if "hooks" not in p.parts]
    assert len(headings) == len(set(headings)), sorted(h for h in headings if headings.count(h) > 1)


def test_site_is_strict_and_offline() -> None:
    """Strict (warnings fail), no web fonts, no plugin that fetches from the network."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True
    assert config["theme"]["font"] is False
    names = {p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]}
    assert not names & {"privacy", "social", "offline-fetch"}, names


def _public_modules(package: str) -> set[str]:
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(p.startswith("_") for p in parts):
            found.add(".".join(parts))
    return found


def test_every_public_module_is_in_the_api_reference() -> None:
    """A module added to the code shows up in the API reference (packages rendered with show_submodules cover
    everything below them); the `smoe` verb modules are documented by the generated CLI reference."""
    covered, prefixes = set(), []
    for page in (DOCS / "reference" / "api").glob("*.md"):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("::: "):
                name = line[4:].strip()
                covered.add(name)
                block = "\n".join(lines[i + 1:i + 6])
                if "show_submodules: true" in block.split("\n::: ")[0]:
                    prefixes.append(name + ".")
    modules = _public_modules("smoeweather") | _public_modules("pipelines")
    missing = sorted(m for m in modules if m not in covered and not m.startswith(tuple(prefixes))
                     and not m.startswith("smoeweather.commands."))
    assert not missing, f"not in docs/reference/api/*.md: {missing}"


def _lists_hook():
    spec = importlib.util.spec_from_file_location("lists", DOCS / "hooks" / "lists.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_glued_list_fails_the_docs_build() -> None:
    import pytest
    from mkdocs.exceptions import PluginError

    hook = _lists_hook()
    glued = "Elsewhere it does not pay:\n- **T850 48 h**\n- **ResNet**\n"
    assert hook.glued_lists(glued) == [2]
    fine = (
        "Elsewhere:\n\n- a\n  continued\n- b\n\n  a loose paragraph of b\n- c\n\n"
        "```\ntext\n- not a list\n```\n| a |\n|---|\n1. one\n"
    )
    assert hook.glued_lists(fine) == []
    page = type("Page", (), {"file": type("File", (), {"src_uri": "guide/x.md"})()})()
    with pytest.raises(PluginError, match=r"guide/x.md: a list is glued .* line\(s\) 2;"):
        hook.on_page_markdown(glued, page, None, None)
    for path in DOCS.rglob("*.md"):  # and the site as it is has none
        assert hook.glued_lists(path.read_text()) == [], path


def test_xarray_styles_are_scoped_above_the_theme() -> None:
    """xarray's notebook stylesheet is scoped under ``body .md-typeset`` so the theme's list rules do not
    override its grid; the colour variables on :root/html/body stay global."""
    spec = importlib.util.spec_from_file_location("xarray_repr", DOCS / "hooks" / "xarray_repr.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    css = ":root {\n  --xr-a: 1;\n}\n\nhtml[theme=dark],\nbody.vscode-dark {\n  --xr-a: 2;\n}\n\n" \
          ".xr-sections {\n  display: grid;\n}\n\n.xr-a > input,\n.xr-b + label:before {\n  display: none;\n}\n"
    out = hook.scope_selectors(css)
    assert ":root {" in out and "html[theme=dark],\nbody.vscode-dark {" in out
    assert "body .md-typeset .xr-sections {\n  display: grid;\n}" in out
    assert "body .md-typeset .xr-a > input,\nbody .md-typeset .xr-b + label:before {" in out
    page = type("Page", (), {"file": type("File", (), {"src_uri": "notebooks/q.ipynb"})()})()
    html = "<style>/* CSS stylesheet for displaying xarray objects in notebooks */\n.xr-wrap {\n}</style>"
    assert "body .md-typeset .xr-wrap" in hook.on_post_page(html, page, None)
