"""The typed option blocks of post-processing, one frozen dataclass per block, each field its one default, bounds,
one-line doc and command-line option (:func:`smoeweather.config.setting`):

- :class:`EMOSSettings`: the EMOS fit (per grid point or site, predictors, distribution, Newton iterations);
- :class:`DRNSettings`: the distributional regression network (:mod:`.drn`);
- :class:`NetworkSettings`: applying a post-processing network checkpoint (:mod:`.neural`).

``smoe postprocess fit/apply`` generate their options from these fields
(:func:`smoeweather.commands.options.add_settings`) and the calibrators of :mod:`.calibrator` take them; the
Python API parses a mapping with :meth:`Settings.of` (ConfigError naming ``drn.<key>``), the command line with
``by_option`` (naming ``--drn-<key>``). Also the site-table options shared with ``smoe evaluate``. Kept free of
heavy imports: the parser is built on every ``smoe`` call.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from smoeweather.config import option_of, parse_settings, setting

DistributionName = Literal["normal", "truncnormal"]
DISTRIBUTIONS: tuple[str, ...] = typing.get_args(DistributionName)
"""``normal``: N(μ, σ²); ``truncnormal``: N(μ, σ²) truncated to [0, ∞) (:mod:`.distributions`)."""
PredictorsName = Literal["mean", "members"]
PREDICTORS: tuple[str, ...] = typing.get_args(PredictorsName)
"""EMOS predictors: ``mean`` (μ = a + b · ensemble mean) or ``members`` (one weight per member)."""

S = TypeVar("S", bound="Settings")


class Settings:
    """What every option block shares: :meth:`of` a mapping (or the command line), :meth:`check` an instance
    built directly. ``block``: the block's name in messages (``drn.hidden``)."""

    block = ""

    @classmethod
    def of(cls: type[S], values: Mapping[str, Any] | None, where: str | None = None, by_option: bool = False) -> S:
        """Settings from a mapping, validated: ConfigError naming ``where.key`` (default: the block's name), or
        the key's command-line option with ``by_option`` (:func:`smoeweather.config.parse_settings`)."""
        return parse_settings(cls, values, cls.block if where is None else where, by_option=by_option)

    def check(self: S) -> S:
        """``self``, validated as :meth:`of` validates a mapping."""
        return type(self).of({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})  # type: ignore

    @classmethod
    def option(cls, name: str) -> str:
        """The command-line option of the field ``name`` (what a message about its value names)."""
        return str(option_of(next(f for f in dataclasses.fields(cls) if f.name == name)))  # type: ignore[arg-type]

    def as_attrs(self) -> dict[str, Any]:
        """The settings as plain netCDF attributes of a model file: a tuple joined by spaces, None as ``""``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            out[f.name] = "" if v is None else " ".join(map(str, v)) if isinstance(v, tuple) else v
        return out

    @classmethod
    def recorded(cls: type[S], attrs: Mapping[str, Any]) -> S:
        """The settings a model file records in its attributes (:meth:`as_attrs`), each read back by its field's
        type; a field the file lacks (written before the field was) takes its default."""
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: _from_attr(attrs[f.name], hints[f.name]) for f in dataclasses.fields(cls)  # type: ignore
                      if f.name in attrs})


def _from_attr(value: Any, hint: Any) -> Any:
    """A netCDF attribute back in the type ``hint`` of a settings field (the inverse of :meth:`Settings.as_attrs`)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if type(None) in typing.get_args(hint):
        return None if str(value) in ("", "None") else _from_attr(value, args[0])
    if hint is bool:
        return bool(int(value))
    if hint in (int, float):
        return hint(value)
    if typing.get_origin(hint) is tuple:
        return tuple(str(value).split())
    return str(value)  # str or a Literal of strings


def _distribution() -> Any:
    """The predictive distribution of every fit (EMOS and DRN share the one ``--distribution`` and its default)."""
    return setting("normal", option="--distribution",
                   doc="predictive distribution: normal, or truncnormal, a normal truncated at 0 for non-negative "
                       "targets such as wind speed")


@dataclass(frozen=True)
class EMOSSettings(Settings):
    """Settings of an EMOS fit (:mod:`.emos`, out of core: :mod:`.chunked`); rolling windows are the training
    data's (:mod:`.rolling`)."""

    block = "emos"

    per_gridpoint: bool = setting(False, option=("--per-gridpoint", "--per-site"),
                                  doc="one fit per grid point, or per site of site forecasts (default: global, "
                                      "pooled over grid points or sites)")
    predictors: PredictorsName = setting("mean", option="--predictors",
                                     doc="mean: mu = a + b * ensemble mean, for exchangeable members; members: "
                                         "one weight per member, mu = a + sum b_k x_k, for non-exchangeable "
                                         "members such as a multi-model ensemble")
    distribution: DistributionName = _distribution()
    iterations: int = setting(50, ge=1, option="--iterations", doc="max Newton iterations per fit")


@dataclass(frozen=True)
class DRNSettings(Settings):
    """Settings of a DRN fit (:mod:`.drn`). Defaults chosen on UWME January forecast dates only, then fixed.
    Parsed and checked like every typed config block (:func:`smoeweather.config.parse_settings`: unknown keys
    with did-you-mean, types, bounds): :meth:`of` a mapping, :meth:`check` an instance built directly."""

    block = "drn"

    hidden: int = setting(32, ge=1, option="--drn-hidden", doc="hidden ReLU units of each network")
    embedding: int = setting(2, ge=0, option="--drn-embedding", doc="size of the location embedding, 0 for none")
    epochs: int = setting(3, ge=1, option="--drn-epochs", doc="training epochs of each network")
    seeds: int = setting(3, ge=1, option="--drn-seeds", doc="networks averaged, one per seed")
    batch_size: int = setting(256, ge=1, option="--drn-batch-size", doc="cases per mini-batch")
    learning_rate: float = setting(1e-2, gt=0, option="--drn-learning-rate",
                                   doc="Adam learning rate, decaying linearly to 0")
    seed: int = setting(0, option="--drn-seed", doc="random seed of the first network")
    distribution: DistributionName = _distribution()
    extra_variables: tuple[str, ...] = setting((), option="--drn-extra", metavar="VAR",
                                               doc="extra predictors: ensemble means of these forecast variables")
    min_location_cases: int = setting(5, ge=1, option="--drn-min-location-cases",
                                      doc="fewest training cases of a location with its own embedding (fewer: "
                                          "the mean embedding)")
    warm_start_epochs: int | None = setting(None, ge=1, example=1, option="--drn-warm-start", metavar="EPOCHS",
                                            doc="with --window: train the dates in turn, each from the previous "
                                                "date's weights for EPOCHS epochs (default: every date from "
                                                "scratch, all dates at once)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_variables", tuple(self.extra_variables))  # a YAML or argparse list


@dataclass(frozen=True)
class NetworkSettings(Settings):
    """Settings of applying a post-processing network checkpoint of ``smoe train`` (:mod:`.neural`)."""

    block = "network"

    batch_size: int = setting(8, ge=1, option="--batch-size", doc="checkpoints: samples per network batch")


SETTINGS: dict[str, type[Settings]] = {"emos": EMOSSettings, "drn": DRNSettings, "network": NetworkSettings}
"""The option block of each post-processing method (``smoe postprocess fit --method``, ``apply --<method>``)."""
FIT_METHODS = ("emos", "drn")
"""The methods ``smoe postprocess fit --method`` fits (networks are trained by ``smoe train``)."""


def add_table_arguments(p: argparse.ArgumentParser) -> None:
    """The site-table column options (``--table-*``, ``--units``), shared with ``smoe evaluate``."""
    t = p.add_argument_group("site tables (CSV/Parquet: one row per station and date)")
    t.add_argument("--table-variable", default="2m_temperature", help="field name of the table's values")
    t.add_argument("--table-lead", default="48h", help="lead time of the table's forecasts (default 48h)")
    t.add_argument("--table-time", choices=["valid", "init"], default="valid",
                   help="the date column is the valid date (default, as ensembleBMA) or the init date")
    t.add_argument("--table-members", nargs="+", help="member columns (default: every other numeric column)")
    t.add_argument("--units", default=None,
                   help="units of the table's values, e.g. K, degC or m s-1 (a table carries none; default: unset)")


__all__ = ["DISTRIBUTIONS", "FIT_METHODS", "PREDICTORS", "SETTINGS", "DRNSettings", "EMOSSettings", "NetworkSettings",
           "Settings", "add_table_arguments"]
