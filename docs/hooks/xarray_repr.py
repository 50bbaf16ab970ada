"""MkDocs hook: xarray objects on notebook pages render as in Jupyter.

A notebook cell that shows a Dataset carries xarray's stylesheet in its output. On the site, the theme's rules
for lists, list items and form inputs (``.md-typeset ul``, specificity 0-1-1) outrank xarray's single-class
selectors (``.xr-sections``, 0-1-0): the grid collapses, the section toggles show as raw checkboxes and the
plain-text fallback shows as well. This hook scopes each of xarray's rules under ``body .md-typeset``, which
adds one class and one element to its specificity, so xarray's layout wins inside its own output and nowhere
else. Rules for ``:root``, ``html`` and ``body`` (the colour variables) are left as they are.
"""

from __future__ import annotations

import re

XARRAY_STYLE = re.compile(r"(<style>/\* CSS stylesheet for displaying xarray objects in notebooks \*/)(.*?)(</style>)",
                          re.S)
RULE = re.compile(r"(\s*)([^{}]+)\{([^{}]*)\}")
SCOPE = "body .md-typeset "


def scope_selectors(css: str) -> str:
    """Every rule of ``css`` (no nested at-rules, as xarray's stylesheet has none) with its selectors scoped."""

    def scoped(match: re.Match) -> str:
        space, selectors, body = match.group(1), match.group(2), match.group(3)
        parts = []
        for sel in selectors.split(","):
            sel = sel.strip()
            comment = ""
            if sel.startswith("/*"):  # a comment before the selector
                end = sel.index("*/") + 2
                comment, sel = sel[:end] + "\n", sel[end:].strip()
            keep = sel.startswith((":root", "html", "body")) or not sel
            parts.append(comment + (sel if keep else SCOPE + sel))
        return space + ",\n".join(parts) + " {" + body + "}"

    return RULE.sub(scoped, css)


def on_post_page(output: str, page, config) -> str:  # noqa: ARG001 (MkDocs hook signature)
    if not page.file.src_uri.endswith(".ipynb"):
        return output
    return XARRAY_STYLE.sub(lambda m: m.group(1) + scope_selectors(m.group(2)) + m.group(3), output)
