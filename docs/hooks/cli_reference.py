"""The CLI reference page, ``docs/reference/cli.md``, generated from ``smoeweather.cli.build_parser()``.

Every parser and sub-parser of ``smoe`` is walked and its ``--help`` text is written into the page, which is
committed, so it reads as it is on GitHub too. Regenerate it after changing an option or a help text::

    .venv/bin/python docs/hooks/cli_reference.py          # writes docs/reference/cli.md
    .venv/bin/python docs/hooks/cli_reference.py --check  # exit 1 if the committed page is out of date

As a MkDocs hook it only verifies: the build fails if the committed page differs from what the parsers
print now. ``tests/repository/test_docs.py`` checks the same, and that each block equals ``smoe <verb> ... --help``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PAGE = "reference/cli.md"
PAGE_PATH = Path(__file__).resolve().parents[1] / PAGE
REGENERATE = ".venv/bin/python docs/hooks/cli_reference.py"
INTRO = """# CLI reference

Every `smoe` command with its options: the `--help` text of each, as the command prints it (at a terminal
width of {columns} columns). This page is **generated** from the same argparse parsers the command uses
(`smoeweather.cli.build_parser()`, walked by `docs/hooks/cli_reference.py`): do not edit it by hand, but
regenerate it with `{regenerate}`. `tests/repository/test_docs.py` and the docs build fail when it is out of date.

Errors a user can cause (a bad path, option, config key or file) end in one line naming the file, variable
or key and what was expected, with exit status 2.
"""
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


def page_text() -> str:
    """The whole CLI reference page, as ``docs/reference/cli.md`` must hold it."""
    return INTRO.format(regenerate=REGENERATE, columns=COLUMNS) + "\n" + markdown()


def stale_message() -> str:
    """What to say when the committed page differs from :func:`page_text`."""
    return (f"docs/{PAGE} is out of date with the smoe parsers (an option or help text changed): "
            f"regenerate it with `{REGENERATE}` and commit it")


def on_page_markdown(markdown_text: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs hook signature)
    """Verify, never substitute: the committed page must be what the parsers print now."""
    if page.file.src_uri == PAGE and markdown_text.rstrip("\n") != page_text().rstrip("\n"):
        from mkdocs.exceptions import PluginError

        raise PluginError(stale_message())
    return markdown_text


def main(argv: list[str] | None = None) -> int:
    """Write the page (default), or with ``--check`` only say whether the committed one is current."""
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--check"]):
        print(f"usage: {REGENERATE} [--check]", file=sys.stderr)
        return 2
    text = page_text()
    current = PAGE_PATH.read_text(encoding="utf-8") if PAGE_PATH.exists() else None
    if argv == ["--check"]:
        if current != text:
            print(stale_message(), file=sys.stderr)
            return 1
        return 0
    if current != text:
        PAGE_PATH.write_text(text, encoding="utf-8")
        print(f"wrote docs/{PAGE}")
    else:
        print(f"docs/{PAGE} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
