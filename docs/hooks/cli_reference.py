"""MkDocs hook: the CLI reference page, generated at build time from ``smoeweather.cli.build_parser()``.

Every parser and sub-parser of ``smoe`` is walked and its ``--help`` text is written into
``docs/reference/cli.md`` in place of the ``{{ cli_reference }}`` marker, so the page cannot drift from
the code. ``tests/test_docs.py`` checks that each block equals what ``smoe <verb> ... --help`` prints.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager

MARKER = "{{ cli_reference }}"
PAGE = "reference/cli.md"
# argparse wraps help at the terminal width (COLUMNS); one fixed width makes the page reproducible.
COLUMNS = 100


@contextmanager
def fixed_width(columns: int = COLUMNS) -> Iterator[None]:
    """Make argparse wrap at ``columns`` (it reads ``COLUMNS`` through ``shutil.get_terminal_size``)."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Yield ``(words after "smoe", help text)`` for ``parser`` and every sub-parser below it, depth first."""
    with fixed_width():
        text = parser.format_help()
    yield path, text
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


def help_texts() -> list[tuple[tuple[str, ...], str]]:
    """The help text of ``smoe`` and of every verb and sub-verb, in parser order."""
    from smoeweather.cli import build_parser

    return list(walk(build_parser()))


def markdown() -> str:
    """The generated part of the CLI reference: one section and one ``text`` block per command."""
    out = []
    for path, text in help_texts():
        command = " ".join(("smoe", *path))
        level = "#" * min(2 + max(len(path) - 1, 0), 4)
        out.append(f"{level} `{command}`\n\n```text\n$ {command} --help\n{text.rstrip()}\n```\n")
    return "\n".join(out)


def on_page_markdown(markdown_text: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs hook signature)
    if page.file.src_uri != PAGE:
        return markdown_text
    if MARKER not in markdown_text:
        raise ValueError(f"{PAGE} lost its {MARKER} marker")
    return markdown_text.replace(MARKER, markdown())
