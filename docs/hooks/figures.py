"""MkDocs hook: every figure opens at full size.

Wide figures (the overview is 2075 px wide) shrink to the page's width; a click on one opens the image file
itself at full resolution, which a browser zooms and pans. Images already inside a link keep that link.
"""

from __future__ import annotations

import re

IMG = re.compile(r"<img\b[^>]*\bsrc=\"(?P<src>[^\"]+)\"[^>]*>")
LINK = re.compile(r"<a\b[^>]*>.*?</a>", re.S)


def link_figures(html_text: str) -> str:
    """Wrap each ``<img>`` that is not inside an ``<a>`` in a link to its own ``src``."""
    spans = [m.span() for m in LINK.finditer(html_text)]

    def wrap(match: re.Match) -> str:
        if any(a <= match.start() < b for a, b in spans) or match.group("src").startswith("data:"):
            return match.group(0)
        return f'<a class="smoe-figure" href="{match.group("src")}" title="full size">{match.group(0)}</a>'

    return IMG.sub(wrap, html_text)


def on_page_content(html_text: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs hook signature)
    if page.file.src_uri.endswith(".ipynb"):  # notebook outputs are inline data, no file to open
        return html_text
    return link_figures(html_text)
