"""The ``smoe`` command: one verb per stage of the pipeline (``smoe --help`` lists them).

Each verb lives in ``smoeweather/commands/<verb>.py``; this module only assembles the parser and turns
the errors a user can cause (bad path, bad option, bad data, a file it cannot read or a folder it cannot
write) into one clear line and exit status 2; ``--debug`` (anywhere on the line) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
import textwrap
import traceback
import warnings
from collections.abc import Callable
from types import ModuleType

from pipelines.atomic import printable
from smoeweather import __version__
from smoeweather.commands import VERBS

DESCRIPTION = (
    "Spatial Mixture-of-Experts forecasting of weather on fixed grids. One verb per stage: data (prepare a "
    "store) -> train -> forecast -> evaluate -> postprocess -> plot; demo runs the whole chain on the embedded "
    "default world, study runs seeded comparisons. 'smoe VERB --help' lists a verb's options."
)
USER_ERRORS = (ValueError, FileExistsError, FileNotFoundError, KeyError, NotADirectoryError, IsADirectoryError,
               PermissionError)
DEBUG_FLAG = "--debug"
_RST_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str | None) -> str | None:
    """Help text as a terminal shows it: reST double backticks (``x``) become 'x'."""
    return None if text is None else _RST_LITERAL.sub(r"'\1'", text)


_BLANK_LINE = re.compile(r"\n[ \t]*\n")


class _PlainHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with reST literals turned into plain quotes in every help string, and the
    indented blocks of a description (a synopsis) kept line by line.

    A description is split into paragraphs at blank lines: a paragraph whose every line is indented is
    printed as written (dedented to two spaces); any other paragraph is re-wrapped to the terminal width,
    as argparse wraps a one-paragraph description."""

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action)) or ""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text) or "")

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for block in _BLANK_LINE.split(text.strip("\n")):
            lines = block.splitlines()
            if all(line[:1].isspace() for line in lines):
                paragraphs.append(textwrap.indent(textwrap.dedent(block), indent + "  "))
            else:
                paragraphs.append(super()._fill_text(block, width, indent))
        return "\n\n".join(paragraphs)


def _verb_modules() -> dict[str, ModuleType]:
    return {name: importlib.import_module(f"smoeweather.commands.{name}") for name in VERBS}


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _finish(parser: argparse.ArgumentParser) -> None:
    """Every (sub)parser: the plain formatter, and its one-line help as description where it has none."""
    parser.formatter_class = _PlainHelpFormatter
    sub = _subcommands(parser)
    if sub is None:
        return
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, child in sub.choices.items():
        if child.description is None and helps.get(name):
            child.description = helps[name][:1].upper() + helps[name][1:] + "."
        _finish(child)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smoe", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"smoe (smoeweather) {__version__}")
    parser.add_argument(DEBUG_FLAG, action="store_true",
                        help="show the traceback of an error instead of its one-line message (also after the verb)")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _verb_modules().values():
        module.add_parser(sub)
    _finish(parser)
    return parser


def _selected_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The deepest (sub)parser that ``argv`` names: 'smoe postprocess fit …' → the 'fit' parser."""
    for token in argv:
        if token == "--":
            break
        sub = _subcommands(parser)
        if sub is None:
            break
        if token in sub.choices:
            parser = sub.choices[token]
    return parser


def _is_option(token: str) -> bool:
    if not token.startswith("-") or token in ("-", "--"):
        return False
    try:
        float(token)  # a negative number is a value, not an option
        return False
    except ValueError:
        return True


def check_verbs(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Report a missing or misspelt verb (``smoe trian``, ``smoe data gcm-enz``) by name, with a "did you
    mean", before any option of the line is looked at (argparse would blame the first option it does not know,
    or say ``invalid choice`` / ``argument data_verb``)."""
    tokens = iter(argv)
    while (sub := _subcommands(parser)) is not None:
        token = next((t for t in tokens if not _is_option(t)), None)
        verbs = list(sub.choices)
        if token is None or token == "--":
            if any(t in ("-h", "--help", "--version") for t in argv):
                return
            parser.error(f"say what to do: one of {', '.join(verbs)} ('{parser.prog} --help' describes them)")
        if token not in sub.choices:
            close = difflib.get_close_matches(token, verbs, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else f"; expected one of {', '.join(verbs)}"
            parser.error(f"unknown command {token!r}{hint}")
        parser = sub.choices[token]


def check_unknown_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Report an unknown option under the usage of the verb it was given to, with a "did you mean".

    argparse itself reports it under the top-level usage, or first complains about a missing required
    option; this check runs before parsing so the real mistake comes first."""
    target = _selected_parser(parser, argv)
    known = list(target._option_string_actions)
    for token in argv:
        if token == "--":
            break
        if not _is_option(token):
            continue
        name = token.split("=", 1)[0]
        if name in known or any(option.startswith(name) for option in known if name.startswith("--")):
            continue  # exact, or an unambiguous-prefix abbreviation argparse resolves itself
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f"; '{target.prog} --help' lists the options"
        target.error(f"unrecognized option {name}{hint}")


def user_message(err: BaseException) -> str | None:
    """The one-line message of an error a user caused, or None for a bug (which keeps its traceback).

    An OSError with a file name (a truncated netCDF: HDF error, a full disk, a read-only file system) names
    the file; an error text of several lines is joined into one."""
    if isinstance(err, KeyError) and err.args:
        text = str(err.args[0])
    elif isinstance(err, USER_ERRORS):
        text = str(err)
        if isinstance(err, OSError) and err.filename is not None and err.strerror:  # "[Errno 13] …: 'x'"
            text = f"{err.filename}: {err.strerror}"
    elif isinstance(err, OSError) and err.filename is not None:
        reason = err.strerror or str(err)
        if "HDF" in reason or "NetCDF" in reason:
            text = (f"{err.filename}: cannot read this netCDF file ({reason}): truncated or corrupt? Write or "
                    "download it again")
        else:
            text = f"{err.filename}: {reason}"
    else:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return printable("; ".join(lines)) if lines else type(err).__name__  # no escape sequence of a file reaches it


def warning_line(command: str) -> Callable[..., str]:
    """A :func:`warnings.formatwarning` that prints a warning as one line of ours, ``smoe VERB: warning: <message>
    (<category>)``, instead of Python's file:line and the line of source code that warned."""

    def formatwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
        text = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
        return f"smoe {command}: warning: {printable(text)} ({category.__name__})\n"

    return formatwarning


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = DEBUG_FLAG in argv[: argv.index("--")] if "--" in argv else DEBUG_FLAG in argv
    if debug:
        argv.remove(DEBUG_FLAG)
    parser = build_parser()
    check_verbs(parser, argv)
    check_unknown_options(parser, argv)
    args = parser.parse_args(argv)
    module = _verb_modules()[args.command]
    python_format = warnings.formatwarning
    if not debug:  # --debug keeps Python's warnings, with the file and line that warned
        warnings.formatwarning = warning_line(args.command)
    try:
        return int(module.run(args) or 0)
    except Exception as err:
        message = None if debug else user_message(err)
        if message is None:
            if not debug:
                raise
            traceback.print_exc()
            return 2 if user_message(err) is not None else 1
        print(f"smoe {args.command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = python_format


if __name__ == "__main__":
    sys.exit(main())
