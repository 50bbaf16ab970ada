"""The `smoe` command lines the docs show are true to the parsers (`smoeweather.cli.build_parser()`).

Three kinds of text are checked:

* the synopsis block of docs/getting-started.md ("The `smoe` command"), which must also cover every command;
* the indented synopsis of a verb's own description (what `smoe postprocess --help` prints);
* every `smoe ...` line of a code block in README.md and docs/ (the guides among them), and every option an
  inline `smoe ...` of their prose names.

A line names only verbs and options that exist (spelt out in full: argparse's abbreviations are not documentation)
and parses. A synopsis is read as a usage line: ``[x]`` is optional, ``(a | b)`` and ``a|b`` are alternatives,
``{a,b}`` is a choice and ``...`` repeats; it must parse with its optional parts left out, and with each optional
part and each alternative put in, one at a time (values are not converted: ``N`` stands for a number). In a
guide's example, ``...`` or ``…`` elides part of the line, which is then only checked for its names.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from smoeweather.cli import _is_option, _subcommands, build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GETTING_STARTED = DOCS / "getting-started.md"
_CLOSE = {"[": "]", "(": ")"}
_TOKEN = re.compile(r""""[^"]*"|'[^']*'|\S+""")
_COMMENT = re.compile(r"""\s+#(?=(?:[^"']|"[^"]*"|'[^']*')*$).*$""")  # a '#' outside quotes, after a blank
_MESSAGE = re.compile(r"^smoe [\w-]+: ")  # 'smoe train: error: ...' is output, not a command
_ELISION = ("...", "…")
_OPTIONAL_PREFIX = re.compile(r"\[([^\[\]\s]+)\]([^\s\[\]]+)")  # '[NAME=]FC.zarr': FC.zarr or NAME=FC.zarr


@dataclass
class Seq:
    items: list = field(default_factory=list)


@dataclass
class Opt:
    body: Seq


@dataclass
class Alt:
    options: list[Seq]


@dataclass(frozen=True)
class Line:
    where: str  # 'docs/guide/x.md:12'
    text: str  # the command, continuation lines joined, without its comment


def _words(text: str) -> list[str]:
    """Tokens of a usage line: brackets at a word's edges are tokens of their own; quoted words are kept whole."""
    tokens = []
    for word in _TOKEN.findall(text):
        if word[0] in "\"'":
            tokens.append(word[1:-1])
            continue
        if _OPTIONAL_PREFIX.fullmatch(word):
            tokens.append(word)
            continue
        while word[:1] in _CLOSE and len(word) > 1:
            tokens.append(word[0])
            word = word[1:]
        closes = []
        while word[-1:] in ")]" and word.count(word[-1]) > word.count("[" if word[-1] == "]" else "("):
            closes.insert(0, word[-1])
            word = word[:-1]
        tokens += ([word] if word else []) + closes
    return tokens


def _word(token: str) -> Seq | Alt | str:
    """'a|b', '{a,b}' and '[a]b' (no blanks) are alternatives of one word; a word is its text."""
    if optional := _OPTIONAL_PREFIX.fullmatch(token):
        return Alt([Seq([optional[2]]), Seq([optional[1] + optional[2]])])
    if re.fullmatch(r"\{[^{}]+\}", token):
        return Alt([Seq([w]) for w in token[1:-1].split(",")])
    if "|" in token:
        return Alt([Seq([w]) for w in token.split("|")])
    return token


def grammar(text: str) -> Seq:
    """The tree of a usage line; a bracket left open or closed twice is an error naming the line."""
    tokens = _words(text)

    def parse(i: int, closer: str | None) -> tuple[Seq | Alt, int]:
        options = [Seq()]
        while i < len(tokens) and tokens[i] != closer:
            token = tokens[i]
            if token in _CLOSE:
                body, i = parse(i + 1, _CLOSE[token])
                if i >= len(tokens):
                    raise ValueError(f"unclosed {token!r} in: {text}")
                options[-1].items.append(Opt(body if isinstance(body, Seq) else Seq([body])) if token == "[" else body)
            elif token in ")]":
                raise ValueError(f"unopened {token!r} in: {text}")
            elif token == "|":
                options.append(Seq())
            else:
                options[-1].items.append(_word(token))
            i += 1
        return (options[0] if len(options) == 1 else Alt(options)), i

    tree, _ = parse(0, None)
    return tree if isinstance(tree, Seq) else Seq([tree])


def _picks(node, needed: dict[int, int]) -> Iterator[dict[int, int]]:
    """Every optional part present, and every alternative chosen, one at a time (with what encloses it)."""
    if isinstance(node, Seq):
        for item in node.items:
            yield from _picks(item, needed)
    elif isinstance(node, Opt):
        inside = {**needed, id(node): 1}
        yield inside
        yield from _picks(node.body, inside)
    elif isinstance(node, Alt):
        for k, option in enumerate(node.options):
            chosen = {**needed, id(node): k}
            if k:
                yield chosen
            yield from _picks(option, chosen)


def _render(node, picks: dict[int, int]) -> list[str]:
    if isinstance(node, str):
        return [] if node in _ELISION else [node]
    if isinstance(node, Seq):
        return [word for item in node.items for word in _render(item, picks)]
    if isinstance(node, Opt):
        return _render(node.body, picks) if picks.get(id(node)) else []
    return _render(node.options[picks.get(id(node), 0)], picks)


def expansions(text: str) -> list[list[str]]:
    """The argument lists a usage line stands for (after 'smoe'): the shortest, then one per choice in it."""
    tree = grammar(text)
    out: list[list[str]] = []
    for picks in [{}, *_picks(tree, {})]:
        argv = _render(tree, picks)[1:]
        if argv not in out:
            out.append(argv)
    return out


class _Refused(Exception):
    pass


def _strict(parser: argparse.ArgumentParser, convert: bool) -> argparse.ArgumentParser:
    """Every (sub)parser raises instead of exiting; without ``convert`` values stay text (``N``, ``T`` pass)."""

    def error(message: str, prog: str = parser.prog) -> None:
        raise _Refused(f"{prog}: {message}")

    parser.error = error
    for action in parser._actions:
        if not convert and action.choices is None:
            action.type = None
    sub = _subcommands(parser)
    for child in (sub.choices.values() if sub else ()):
        _strict(child, convert)
    return parser


def _leaf(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub)parser the first words of ``argv`` name, and those verbs; a missing or unknown verb is refused."""
    verbs = []
    while (sub := _subcommands(parser)) is not None:
        token = argv[len(verbs)] if len(verbs) < len(argv) else None
        if token is None or _is_option(token):
            raise _Refused(f"'{parser.prog}' needs one of: {', '.join(sub.choices)}")
        if token not in sub.choices:
            raise _Refused(f"'{parser.prog} {token}': no such command (one of {', '.join(sub.choices)})")
        parser = sub.choices[token]
        verbs.append(token)
    return parser, verbs


def problems(line: Line, parser: argparse.ArgumentParser, synopsis: bool) -> list[str]:
    """What is wrong with ``line`` against ``parser`` (made with :func:`_strict`), or nothing."""
    found = []
    elided = not synopsis and any(token in _ELISION for token in _words(line.text))
    for argv in expansions(line.text):
        try:
            leaf, _ = _leaf(parser, argv)
        except _Refused as err:
            return [f"{line.where}: {err}"]
        for token in argv:
            name = token.split("=", 1)[0]
            if _is_option(token) and name not in leaf._option_string_actions:
                found.append(f"{line.where}: '{leaf.prog}' has no option {name}")
        if elided or found:
            continue
        try:
            args = parser.parse_args(argv)
        except _Refused as err:
            found.append(f"{line.where}: 'smoe {' '.join(argv)}' does not parse: {err}")
            continue
        hidden = [a.dest for a in leaf._actions if a.help == argparse.SUPPRESS and a.default != argparse.SUPPRESS
                  and getattr(args, a.dest, a.default) != a.default]
        if hidden:
            found.append(f"{line.where}: 'smoe {' '.join(argv)}' uses a spelling the command refuses ({hidden})")
    return list(dict.fromkeys(found))


def code_lines(path: Path) -> list[Line]:
    """The `smoe ...` lines of the fenced code blocks of a Markdown page, continuation lines joined."""
    lines, entry, inside = [], None, False
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if raw.lstrip().startswith("```"):
            inside, entry = not inside, None
            continue
        stripped = _COMMENT.sub("", raw).strip()
        if entry is not None and (entry[1].endswith("\\") or (raw[:1].isspace() and stripped
                                                              and not stripped.startswith("smoe "))):
            entry[1] = entry[1].removesuffix("\\").rstrip() + " " + stripped
        elif inside and stripped.removeprefix("$ ").startswith("smoe ") and not _MESSAGE.match(stripped):
            entry = [number, stripped.removeprefix("$ ")]
            lines.append(entry)
        else:
            entry = None
    where = path.relative_to(ROOT).as_posix()
    return [Line(f"{where}:{n}", text.removesuffix("\\").strip()) for n, text in lines]


def synopsis_block() -> list[Line]:
    """The lines of the first code block under "## The `smoe` command" of docs/getting-started.md."""
    text = GETTING_STARTED.read_text(encoding="utf-8").splitlines()
    heading = text.index("## The `smoe` command")
    fences = [n for n, raw in enumerate(text, 1) if n > heading and raw.lstrip().startswith("```")][:2]
    assert len(fences) == 2, f"{GETTING_STARTED.relative_to(ROOT)}: no code block under its smoe heading"
    return [line for line in code_lines(GETTING_STARTED) if fences[0] < int(line.where.rsplit(":", 1)[1]) < fences[1]]


def description_synopses() -> list[Line]:
    """The `smoe ...` lines of the indented blocks of every (sub)parser's description."""
    out = []
    stack = [build_parser()]
    while stack:
        parser = stack.pop()
        sub = _subcommands(parser)
        stack += list(sub.choices.values()) if sub else []
        entry = None
        for raw in (parser.description or "").splitlines():
            if raw.strip().startswith("smoe ") and raw[:1].isspace():
                entry = [raw.strip()]
                out.append((parser.prog, entry))
            elif entry is not None and raw[:1].isspace() and raw.strip():
                entry.append(raw.strip())
            else:
                entry = None
    return [Line(f"'{prog} --help'", " ".join(entry)) for prog, entry in out]


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    sub = _subcommands(parser)
    if sub is None:
        yield words
        return
    for name, child in sub.choices.items():
        yield from _leaves(child, (*words, name))


def test_getting_started_synopsis_is_true_and_complete() -> None:
    lines = synopsis_block()
    assert len(lines) > 20, "the synopsis block of docs/getting-started.md was not found"
    parser = _strict(build_parser(), convert=False)
    assert [p for line in lines for p in problems(line, parser, synopsis=True)] == []
    named = {tuple(_leaf(parser, argv)[1]) for line in lines for argv in expansions(line.text)}
    missing = sorted(" ".join(("smoe", *words)) for words in _leaves(build_parser()) if words not in named)
    assert not missing, f"{GETTING_STARTED.relative_to(ROOT)}: the synopsis block does not show {missing}"


def test_verb_descriptions_synopses_are_true() -> None:
    lines = description_synopses()
    assert any(line.text.startswith("smoe postprocess apply") for line in lines)
    parser = _strict(build_parser(), convert=False)
    assert [p for line in lines for p in problems(line, parser, synopsis=True)] == []


# every page a user reads commands on; the CLI reference is the parsers' own output
PAGES = sorted([ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if "reference" not in p.relative_to(DOCS).parts)])
_SPAN = re.compile(r"(?<!`)`(smoe [^`]+)`(?!`)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_command_lines_of_the_docs_parse(page: Path) -> None:
    block = set(synopsis_block()) if page == GETTING_STARTED else set()
    lines = [line for line in code_lines(page) if line not in block]
    parser = _strict(build_parser(), convert=True)
    assert [p for line in lines for p in problems(line, parser, synopsis=False)] == []


def _options_below(parser: argparse.ArgumentParser) -> set[str]:
    sub = _subcommands(parser)
    return set(parser._option_string_actions).union(*(_options_below(c) for c in (sub.choices.values() if sub else ())))


def prose_problems(text: str, where: str) -> list[str]:
    """Options that an inline `smoe VERB ... --option` of ``text`` names and that verb (and those below it) lacks."""
    found = []
    for number, raw in enumerate(text.splitlines(), 1):
        for span in _SPAN.findall(raw):
            parser, words = build_parser(), span.split()[1:]
            while (sub := _subcommands(parser)) is not None and words and words[0] in sub.choices:
                parser = sub.choices[words.pop(0)]
            known = _options_below(parser)
            found += [f"{where}:{number}: '{parser.prog}' has no option {name} (in `{span}`)"
                      for name in re.findall(r"(?<![\w-])--[a-z][\w-]*", span) if name not in known]
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_options_named_in_the_prose_exist(page: Path) -> None:
    """An inline `smoe VERB ... --option` names an option of that verb (or of one of its sub-verbs)."""
    assert prose_problems(page.read_text(encoding="utf-8"), page.relative_to(ROOT).as_posix()) == []


def test_a_wrong_option_in_the_prose_is_reported() -> None:
    text = "Use `smoe plot routing --member m`, `smoe postprocess --emos` and\n`smoe plot routing --membr m`."
    assert prose_problems(text, "x.md") == ["x.md:2: 'smoe plot routing' has no option --membr (in `smoe plot "
                                            "routing --membr m`)"]


@pytest.mark.parametrize(("text", "expected"), [
    ("smoe postprocess apply MODEL.nc|CKPT --forecast NEW --out PP.zarr", "uses a spelling the command refuses"),
    ("smoe forecast CKPT --data S --init A B --out FC.zarr [--batch 4]", "'smoe forecast' has no option --batch"),
    ("smoe plot forecast FC --truth S --field F --lead L [--init T] --out D", "required: --init"),
    ("smoe data prepare {era5,gfs} --source P --out S.zarr", "invalid choice: 'gfs'"),
    ("smoe postprocess --forecast ENS --out M.nc", "'smoe postprocess' needs one of: fit, apply"),
    ("smoe evaluate FC.zarr --truth S --out D [--spectra", "unclosed '['"),
])
def test_a_wrong_synopsis_is_reported(text: str, expected: str) -> None:
    """The checks can fail: the line getting-started.md showed before, an abbreviation, an optional part that
    is required, a choice that does not exist, a missing sub-verb and a bracket left open are each reported."""
    parser = _strict(build_parser(), convert=False)
    try:
        found = problems(Line("x.md:1", text), parser, synopsis=True)
    except ValueError as err:
        found = [str(err)]
    assert any(expected in p for p in found), found


def test_expansions_of_a_usage_line() -> None:
    assert expansions("smoe x --a (B | C) [--d {1,2}] [--e [--f]] G ...") == [
        ["x", "--a", "B", "G"], ["x", "--a", "C", "G"], ["x", "--a", "B", "--d", "1", "G"],
        ["x", "--a", "B", "--d", "2", "G"], ["x", "--a", "B", "--e", "G"], ["x", "--a", "B", "--e", "--f", "G"]]
    assert _words('smoe train "model.widths=[32,64]" [--resume CKPT]') == [
        "smoe", "train", "model.widths=[32,64]", "[", "--resume", "CKPT", "]"]
