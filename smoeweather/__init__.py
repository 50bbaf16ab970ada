"""smoeweather: Spatial Mixture-of-Experts for weather and scientific fields on fixed grids."""

import sys as _sys
import warnings as _warnings

__version__ = "0.1.0"

# Native-library load order (forecast → evaluate → plot in one process aborted at interpreter
# exit with `double free or corruption` / `free(): invalid pointer`, exit 134, or a segfault, exit 139).
#
# Cause: the eccodes wheel (here 2.50: eccodes → eccodeslib → eckitlib) loads its libraries through `findlibs`,
# which opens every eckitlib library with RTLD_GLOBAL. eckitlib.libs bundles its own PROJ (libproj 9.8),
# sqlite3, libcurl 7.61 and OpenSSL 1.1, so their symbols become global. Any wheel loaded AFTER that binds
# its proj_*/sqlite3_*/curl_* calls to eckitlib's copies instead of its own bundled ones: pyproj (PROJ 9.5;
# cartopy imports it) then reports `proj_version_str == "9.8.1"`, warns "unable to set PROJ database path",
# and both PROJ copies run exit destructors on the same objects → double free. netCDF4's libnetcdf likewise
# binds to eckitlib's libcurl 7.61 (no crash seen, but mixed curl for remote reads). Upstream: the same
# mechanism as ecmwf/eccodes-python#140 (eckitlib ≥ 1.29.2 bundled libcurl clashes with libraries loaded
# later), introduced when eckit's wheel started bundling curl and PROJ (ecmwf/eckit#163).
# xarray imports cfgrib → eccodes whenever it guesses an engine (`xr.open_dataset` without `engine=`), so the
# chain hits this without any GRIB file.
#
# Fix: load pyproj and netCDF4 (each binds its own bundled PROJ/curl at load time) before anything can import
# eccodes; every smoeweather entry point imports this package first. If eccodes was already imported (a
# notebook that ran `import cfgrib` before smoeweather), loading them now would bind them to eckitlib's
# copies, so we leave them alone and say how to avoid the abort.
_EARLY = ("pyproj", "netCDF4")
if "gribapi" in _sys.modules:
    _late = [name for name in _EARLY if name not in _sys.modules]
    if _late:
        _warnings.warn(
            f"eccodes (cfgrib) was imported before smoeweather; {', '.join(_late)} loaded after it use eccodes' "
            "bundled PROJ/curl and the interpreter can abort at exit (double free). Import smoeweather (or "
            f"{', '.join(_late)}) before cfgrib/eccodes.",
            RuntimeWarning,
            stacklevel=2,
        )
else:
    for _name in _EARLY:
        try:
            __import__(_name)
        except ImportError:  # optional here: pyproj comes with the `maps` extra (cartopy)
            pass


def __getattr__(name: str) -> object:
    """``smoeweather.load_model(PATH, map_location="cpu")``: the trained network of a ``smoe train`` checkpoint or
    of its export folder (:func:`smoeweather.models.loader.load_network`; nothing is unpickled), looked up when
    first used: the package root sits below the models layer and never imports it at import time (PEP 562)."""
    if name == "load_model":
        import importlib

        return importlib.import_module("smoeweather.models.loader").load_network
    raise AttributeError(f"module 'smoeweather' has no attribute {name!r}")
