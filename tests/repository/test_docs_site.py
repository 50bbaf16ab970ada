"""The built documentation site works offline: search from file://, no network assets,
no raw Sphinx roles, figures that open at full size.

Uses ``build/site`` when ``make docs`` has just built it (CI builds the site before the tests), otherwise
builds the site once into a temporary folder (~20 s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "docs" / "hooks"


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(name, HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _newest_source() -> float:
    files = [ROOT / "mkdocs.yml", *(ROOT / "docs").rglob("*"), *(ROOT / "smoeweather").rglob("*.py")]
    return max(f.stat().st_mtime for f in files if f.is_file())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = ROOT / "build" / "site"
    index = built / "search" / "search_index.js"
    if index.is_file() and index.stat().st_mtime >= _newest_source():
        return built
    out = tmp_path_factory.mktemp("site")
    mkdocs = shutil.which("mkdocs", path=str(Path(os.sys.executable).parent)) or "mkdocs"
    done = subprocess.run([mkdocs, "build", "--strict", "-q", "-d", str(out)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def test_search_index_is_a_script_holding_the_json_index(site: Path) -> None:
    script = (site / "search" / "search_index.js").read_text()
    prefix = "var __index = "
    assert script.startswith(prefix)
    index = json.loads(script[len(prefix):])
    assert index == json.loads((site / "search" / "search_index.json").read_text())
    locations = {d["location"].split("#")[0] for d in index["docs"]}
    assert {"getting-started.html", "guide/results-reading.html", "reference/cli.html"} <= locations


@pytest.mark.skipif(shutil.which("node") is None,
                    reason="needs Node.js to run the site's search worker: install it (e.g. apt install nodejs)")
def test_search_works_from_the_file_system(site: Path) -> None:
    """The site's own lunr search worker, fed the offline index as the page feeds it, finds pages."""

    def search(query: str) -> list[str]:
        done = subprocess.run(["node", str(ROOT / "tests" / "site_search.js"), str(site), query],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["hits"]

    assert any(h.startswith("reference/api/nn.html#smoeweather.nn.SpatialMoE2d") for h in search("SpatialMoE2d"))
    assert any(h.startswith("guide/results-reading.html") for h in search("spread skill"))
    assert search("xyzzyqqq") == []


def test_pages_load_nothing_from_the_network(site: Path) -> None:
    remote = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.I)
    for page in _pages(site):
        text = page.read_text()
        assert not remote.search(text), f"{page}: loads {remote.search(text).group(0)}"
    assert (site / "assets" / "javascripts" / "iframe-worker-shim.js").is_file()
    assert 'src="assets/javascripts/iframe-worker-shim.js"' in (site / "index.html").read_text()


def test_no_raw_sphinx_role_in_any_page(site: Path) -> None:
    roles = _hook("docstring_roles")
    left = {str(p.relative_to(site)): roles.raw_roles(p.read_text()) for p in _pages(site)}
    assert not {k: v for k, v in left.items() if v}
    api = "".join((site / "reference" / "api" / f).read_text() for f in ("core.html", "nn.html", "training.html"))
    assert api.count('class="autorefs autorefs-internal"') > 50  # the roles became links


def test_every_figure_links_to_its_full_size_file(site: Path) -> None:
    fig = _hook("figures")
    linked = re.compile(r'<a class="smoe-figure" href="([^"]+)"')
    for page in _pages(site):
        if page.parent.name == "notebooks":  # notebook outputs are inline images
            continue
        text = page.read_text()
        assert fig.link_figures(text) == text, f"{page}: an image is not inside a link"
        for src in linked.findall(text):
            assert (page.parent / src).is_file(), f"{page}: figure link {src} has no file"
    assert linked.search((site / "index.html").read_text())


def test_roles_rewrite_to_optional_autorefs() -> None:
    roles = _hook("docstring_roles")
    html = "see :class:<code>~smoeweather.config.Arguments</code> and :func:<code>run</code>"
    out = roles.rewrite_roles(html)
    assert out == ('see <autoref identifier="smoeweather.config.Arguments" optional><code>Arguments</code></autoref>'
                   ' and <autoref identifier="run" optional><code>run</code></autoref>')
    assert roles.raw_roles(out) == []
    assert roles.raw_roles("a :mod:`x` b") and roles.raw_roles("<pre>:mod:`x`</pre>") == []
    known = {"smoeweather.nn.SpatialMoE2d", "smoeweather.nn.smoe.SpatialMoE2d", "smoeweather.run"}
    assert roles.qualify('<autoref identifier="SpatialMoE2d" optional>', known) == (
        '<autoref identifier="smoeweather.nn.SpatialMoE2d" optional>')
    assert roles.qualify('<autoref identifier="Missing" optional>', known) == '<autoref identifier="Missing" optional>'


def test_figures_hook_wraps_bare_images_only() -> None:
    fig = _hook("figures")
    assert fig.link_figures('<p><img src="a.png" alt="x"></p>') == (
        '<p><a class="smoe-figure" href="a.png" title="full size"><img src="a.png" alt="x"></a></p>')
    linked = '<a href="b.html"><img src="a.png"></a>'
    assert fig.link_figures(linked) == linked
