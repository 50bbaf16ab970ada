"""The tests' name for the EMOS reference solver, which lives in :mod:`smoeweather.postprocess.emos_reference`."""

from smoeweather.postprocess.emos_reference import fit_groups_lbfgs

__all__ = ["fit_groups_lbfgs"]
