"""The options of ``smoe postprocess`` are generated from the typed option blocks
(:mod:`smoeweather.postprocess.options`): every field with an option is one argparse option whose default IS the
field's default (written once, in the field), listed by ``--help`` with that default, and refused out of its
bounds by a message naming the option."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from smoeweather.cli import build_parser
from smoeweather.commands.options import dest_of, settings_of_args
from smoeweather.config import ConfigError, option_of
from smoeweather.postprocess.options import SETTINGS, DRNSettings, EMOSSettings, NetworkSettings

REPO = Path(__file__).resolve().parents[2]
VERB_BLOCKS = {"fit": (EMOSSettings, DRNSettings), "apply": (NetworkSettings,)}


def _verb(name: str) -> argparse.ArgumentParser:
    pp = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["postprocess"]
    verbs = next(a for a in pp._actions if isinstance(a, argparse._SubParsersAction))
    return verbs.choices[name]


def _optioned(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if option_of(f)]


def _default(f: dataclasses.Field) -> object:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


@pytest.mark.parametrize("verb", sorted(VERB_BLOCKS))
def test_each_option_default_is_the_field_default(verb: str) -> None:
    parser = _verb(verb)
    actions = {s: a for a in parser._actions for s in a.option_strings}
    for cls in VERB_BLOCKS[verb]:
        for f in _optioned(cls):
            for option in f.metadata["option"]:
                action = actions[option]  # every option of the field is on the parser
                assert action.dest == dest_of(f), option
                assert action.default == _default(f) and type(action.default) is type(_default(f)), option
    crossval = {s: a for a in _verb("crossval")._actions for s in a.option_strings}
    assert crossval["--iterations"].default == EMOSSettings.iterations  # the class default is the field's


@pytest.mark.parametrize("verb", sorted(VERB_BLOCKS))
def test_help_lists_every_field_with_its_default(verb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # help on one line
    entries = re.split(r"\n(?=  -)", _verb(verb).format_help())  # one per option: its line and its help below
    for cls in VERB_BLOCKS[verb]:
        for f in _optioned(cls):
            line = next((" ".join(e.split()) for e in entries
                         if re.match(rf"{re.escape(option_of(f) or '')}[ ,]", e.strip())), None)
            assert line is not None, f"{verb} --help lacks {option_of(f)} ({cls.__name__}.{f.name})"
            default = _default(f)
            if default not in (None, False, ()):
                assert f"(default {default})" in line, line
            assert f.metadata["doc"].split(",")[0] in line, line


def test_the_options_are_only_generated() -> None:
    """No option of a settings field is declared by hand by post-processing (its default would be written twice)."""
    options = [o for cls in SETTINGS.values() for f in _optioned(cls) for o in f.metadata["option"]]
    package = REPO / "smoeweather"
    sources = [package / "commands" / "postprocess.py", *(package / "postprocess").glob("*.py")]
    for p in sources:
        text = p.read_text()
        for o in options:
            assert not re.search(rf"add_argument\([^)]*[\"']{re.escape(o)}[\"']", text), f"{p}: declares {o}"


def test_parsed_options_are_the_defaults_unless_given() -> None:
    args = build_parser().parse_args(["postprocess", "fit", "--forecast", "f.zarr", "--out", "m.nc"])
    assert settings_of_args(EMOSSettings, args) == EMOSSettings()
    assert settings_of_args(DRNSettings, args) == DRNSettings()
    args = build_parser().parse_args(["postprocess", "fit", "--forecast", "f.zarr", "--out", "m.nc", "--per-site",
                                      "--drn-extra", "a", "b", "--drn-warm-start", "2", "--distribution",
                                      "truncnormal", "--drn-learning-rate", "0.5"])
    assert settings_of_args(EMOSSettings, args) == EMOSSettings(per_gridpoint=True, distribution="truncnormal")
    assert settings_of_args(DRNSettings, args) == DRNSettings(extra_variables=("a", "b"), warm_start_epochs=2,
                                                              distribution="truncnormal", learning_rate=0.5)


@pytest.mark.parametrize("cls", list(SETTINGS.values()))
def test_out_of_bounds_values_are_refused_naming_the_option(cls: type) -> None:
    for f in _optioned(cls):
        bounds = f.metadata["bounds"]
        if not bounds:
            continue
        low = bounds.get("ge", bounds.get("gt"))
        bad = low - 1 if isinstance(low, int) and "ge" in bounds else low
        example = f.metadata["example"] if f.metadata["example"] is not None else _default(f)
        args = argparse.Namespace(**{dest_of(f): bad})
        with pytest.raises(ConfigError) as err:
            settings_of_args(cls, args)
        rule = f">= {low}" if "ge" in bounds else f"> {low}"
        assert str(err.value) == f"{option_of(f)} must be {rule}, got {bad!r}; set e.g. {option_of(f)} {example}"
        with pytest.raises(ConfigError, match=rf"config key '{cls.block}\.{f.name}' must be"):
            cls.of({f.name: bad})  # the Python API names the config key


def test_a_mapping_is_checked_as_a_config_block() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'drn\.epoch' \(did you mean 'epochs'\?\)"):
        DRNSettings.of({"epoch": 2})
    with pytest.raises(ConfigError, match=r"'emos\.predictors' must be one of 'mean', 'members'"):
        EMOSSettings.of({"predictors": "weights"})
    assert DRNSettings.of({"extra_variables": ["a"]}).extra_variables == ("a",)  # a YAML list: a tuple
    with pytest.raises(ConfigError, match=r"'drn\.hidden' must be >= 1, got 0"):
        DRNSettings(hidden=0).check()


@pytest.mark.parametrize("settings", [EMOSSettings(), EMOSSettings(per_gridpoint=True, predictors="members"),
                                      DRNSettings(), DRNSettings(extra_variables=("a", "b"), warm_start_epochs=2,
                                                                 learning_rate=0.5), NetworkSettings(batch_size=3)])
def test_settings_round_trip_through_model_file_attributes(settings: object) -> None:
    """A model file records its settings as plain attributes and they read back as they were."""
    attrs = settings.as_attrs()  # type: ignore[attr-defined]
    assert all(isinstance(v, str | int | float) for v in attrs.values())
    assert type(settings).recorded(attrs) == settings
    assert type(settings).recorded({}) == type(settings)()  # a field a file lacks: its default
