"""The ``smoe`` front: --version, a description for every verb, plain-text help, and "did you mean"."""

from __future__ import annotations

import argparse

import pytest

from smoeweather import __version__
from smoeweather.cli import build_parser, main


def _all_parsers(parser: argparse.ArgumentParser, path: str = "smoe"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _all_parsers(child, f"{path} {name}")


def test_version(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"smoe (smoeweather) {__version__}"


def test_every_verb_has_a_description_and_plain_help() -> None:
    parsers = list(_all_parsers(build_parser()))
    assert len(parsers) > 20
    for path, parser in parsers:
        assert parser.description, f"{path} has no description"
        text = parser.format_help()
        assert "``" not in text, f"{path} --help shows reST double backticks"


def _options_without_help(parser: argparse.ArgumentParser) -> list[str]:
    """'smoe forecast --batch-size', 'smoe postprocess apply MODEL' …: every option or positional of every
    (sub)parser whose help is empty (argparse.SUPPRESS hides an option on purpose and counts as help)."""
    missing = []
    for path, p in _all_parsers(parser):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{path} {c.dest}" for c in action._choices_actions if not (c.help or "").strip()]
            elif not (action.help or "").strip():
                missing.append(f"{path} {'/'.join(action.option_strings) or action.metavar or action.dest}")
    return missing


def test_every_option_of_every_verb_has_help() -> None:
    assert not _options_without_help(build_parser()), "options without help text (add help=...): " + ", ".join(
        _options_without_help(build_parser()))


def test_an_option_without_help_is_named() -> None:
    """The walk above can fail: an option added without help, deep in the tree, is reported by its command."""
    parser = build_parser()
    fit = next(p for path, p in _all_parsers(parser) if path == "smoe postprocess fit")
    fit.add_argument("--undocumented", type=int)
    fit.add_argument("unnamed", nargs="?", help="")
    assert _options_without_help(parser) == ["smoe postprocess fit --undocumented", "smoe postprocess fit unnamed"]


def test_postprocess_help_keeps_its_synopsis_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The indented synopsis of a description is printed line by line; its prose is still wrapped to the
    terminal; a one-paragraph description wraps as argparse wraps it."""
    from smoeweather.commands import postprocess

    monkeypatch.setenv("COLUMNS", "100")
    parser = next(p for path, p in _all_parsers(build_parser()) if path == "smoe postprocess")
    text = parser.format_help()
    synopsis = [line.strip() for line in postprocess.__doc__.splitlines() if line.startswith("    ")]
    assert len(synopsis) > 5
    printed = [line.strip() for line in text.splitlines()]
    at = printed.index(synopsis[0])
    assert printed[at:at + len(synopsis)] == synopsis, "the synopsis of 'smoe postprocess --help' lost its lines"
    assert all(len(line) <= 100 for line in text.splitlines()), "a line of 'smoe postprocess --help' is too wide"
    prose = text[text.index("ENS/NEW:"):text.index("positional arguments:")].strip().splitlines()
    assert len(prose) > 5 and max(len(line) for line in prose) > 80, "the prose after the synopsis is not wrapped"
    top = build_parser().format_help()
    description = top[top.index("Spatial"):top.index("positional arguments:")].strip().splitlines()
    assert len(description) > 2 and max(len(line) for line in description) <= 100  # one paragraph: wrapped


def test_unknown_option_is_reported_under_the_verb_with_a_suggestion(capsys: pytest.CaptureFixture) -> None:
    # --out is required by 'postprocess fit'; the misspelt option must still be what is reported
    with pytest.raises(SystemExit) as stop:
        main(["postprocess", "fit", "--forcast", "x.zarr"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith("usage: smoe postprocess fit"), err
    assert "unrecognized option --forcast; did you mean --forecast?" in err
    assert "required" not in err


def test_unknown_option_without_close_match_points_to_help(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["evaluate", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "usage: smoe evaluate" in err and "'smoe evaluate --help' lists the options" in err


def test_values_that_look_like_options_are_not_reported() -> None:
    from smoeweather.cli import check_unknown_options

    parser = build_parser()
    check_unknown_options(parser, ["evaluate", "--truth", "-1.5", "--out=-3"])  # no SystemExit
    check_unknown_options(parser, ["train", "--conf", "x.yaml"])  # an abbreviation argparse resolves
    check_unknown_options(parser, ["train", "--config", "x.yaml", "--", "--not-an-option"])
