"""MkDocs hook: a bullet or numbered list glued to the paragraph above it fails the build.

Python-Markdown starts a list only after a blank line; without one, "text:\\n- a\\n- b" renders as one run-on
paragraph ("text: - a - b"). This check reads the Markdown source of every page (code blocks, tables, HTML
and lines already inside a list are left alone) and names the page and line of each glued list.
"""

from __future__ import annotations

import re

from mkdocs.exceptions import PluginError

LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")
FENCE = re.compile(r"^\s*(```|~~~)")


def glued_lists(markdown: str) -> list[int]:
    """1-based line numbers of list items that follow a paragraph line with no blank line between."""
    bad: list[int] = []
    in_code = False
    previous = ""  # the previous line outside code blocks
    in_list = False
    for number, line in enumerate(markdown.splitlines(), start=1):
        if FENCE.match(line):
            in_code = not in_code
            previous, in_list = "", False
            continue
        if in_code:
            continue
        if not line.strip():
            previous = ""
            continue
        is_item = bool(LIST_ITEM.match(line))
        paragraph = previous and not previous.lstrip().startswith(("|", "<", "#", ">", "!", "*[")) and not in_list
        if is_item and paragraph:
            bad.append(number)
        if is_item:
            in_list = True
        elif not previous and not line.startswith((" ", "\t")):  # a new unindented block after a blank line
            in_list = False
        previous = line
    return bad


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs hook signature)
    lines = glued_lists(markdown)
    if lines:
        raise PluginError(
            f"{page.file.src_uri}: a list is glued to the paragraph above it at line(s) "
            f"{', '.join(map(str, lines))}; put a blank line before the list, or it renders as one paragraph"
        )
    return markdown
