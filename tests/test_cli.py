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
