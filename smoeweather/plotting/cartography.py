"""Global maps with cartopy, offline: coastlines from the Natural Earth files shipped in the package.

Cartopy downloads missing Natural Earth files on first use, which hangs on a machine without internet.
:func:`offline_cartopy` points ``cartopy.config["pre_existing_data_dir"]`` at
``smoeweather/resources/natural_earth`` (cartopy's own folder layout: ``shapefiles/natural_earth/
physical/ne_110m_coastline.shp``, public domain) and ``data_dir`` at the same place, so the downloader
finds every file it needs and never opens a URL. Cartopy is the optional ``maps`` extra.

Grids: 2-D fields (lat, lon) on regular global grids, latitude ascending (degrees north, cell centres),
longitude in [0, 360) (degrees east, cell centres, periodic). Cells are drawn with ``pcolormesh`` from
their edges (no interpolation, no contouring): a 5.625° cell is drawn as the 5.625° box it represents,
and because the edges span exactly 360° there is no seam at 0°/360°.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import patheffects  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from smoeweather.io import atomic_path  # noqa: E402

NATURAL_EARTH_DIR = Path(__file__).resolve().parents[1] / "resources" / "natural_earth"
COASTLINE_SHP = NATURAL_EARTH_DIR / "shapefiles" / "natural_earth" / "physical" / "ne_110m_coastline.shp"
PROJECTIONS = ("robinson", "platecarree")


def offline_cartopy() -> Any:
    """Import cartopy configured to read the packaged Natural Earth files (never download).

    Returns the ``cartopy`` module. Raises ImportError with the install hint when cartopy is missing.
    """
    try:
        import cartopy
    except ImportError as err:  # the optional 'maps' extra
        raise ImportError(
            "maps need cartopy, the 'maps' extra: pip install 'smoeweather[maps]' (or conda install cartopy)"
        ) from err
    if not COASTLINE_SHP.is_file():
        raise FileNotFoundError(f"packaged Natural Earth coastline {COASTLINE_SHP} is missing (broken install?)")
    cartopy.config["pre_existing_data_dir"] = str(NATURAL_EARTH_DIR)
    cartopy.config["data_dir"] = str(NATURAL_EARTH_DIR)
    return cartopy


def projection(name: str = "robinson", central_longitude: float = 0.0) -> Any:
    """A cartopy CRS by name: ``robinson`` (for global maps) or ``platecarree``."""
    offline_cartopy()
    import cartopy.crs as ccrs

    if name == "robinson":
        return ccrs.Robinson(central_longitude=central_longitude)
    if name == "platecarree":
        return ccrs.PlateCarree(central_longitude=central_longitude)
    raise ValueError(f"projection must be one of {PROJECTIONS}, got {name!r}")


def signed_degrees(angle: np.ndarray | float) -> np.ndarray | float:
    """An angle or longitude difference (degrees) as its equivalent in [-180, 180)."""
    return (angle + 180.0) % 360.0 - 180.0


def central_longitude_for(longitude: np.ndarray | None) -> float:
    """Central longitude within half a cell of 0° that puts the map's edge (central + 180°) on a cell edge.

    A cell cut by the map edge is split by cartopy and drawn with thin white gaps at the limb; with the
    edge on a cell boundary no cell is cut (5.625° grid: 2.8125°E; 22.5° U-Net level: −2.8125°E).
    """
    if longitude is None or len(longitude) < 2:
        return 0.0
    edges = cell_edges(np.asarray(longitude, dtype=np.float64))
    offsets = signed_degrees(edges - 180.0)  # candidate central longitudes in [-180, 180)
    return float(offsets[np.argmin(np.abs(offsets))])


def cell_edges(centres: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Edges (N+1,) of cells given their ascending centres (N,): midpoints inside, half a step outside,
    clipped to [lo, hi] (latitude: the poles)."""
    c = np.asarray(centres, dtype=np.float64)
    if c.ndim != 1 or c.size < 2:
        raise ValueError(f"need at least two cell centres in a 1-D array, got shape {c.shape}")
    if not np.all(np.diff(c) > 0):
        raise ValueError("cell centres must be strictly ascending")
    mid = 0.5 * (c[1:] + c[:-1])
    edges = np.concatenate([[c[0] - (mid[0] - c[0])], mid, [c[-1] + (c[-1] - mid[-1])]])
    return np.clip(edges, lo if lo is not None else -np.inf, hi if hi is not None else np.inf)


def refine_edges(edges: np.ndarray, k: int) -> np.ndarray:
    """Each of the N intervals of ``edges`` (N+1,) split into ``k`` equal parts: (N·k+1,)."""
    if k <= 1:
        return np.asarray(edges, dtype=np.float64)
    e = np.asarray(edges, dtype=np.float64)
    fractions = np.arange(k) / k
    inner = (e[:-1, None] + np.diff(e)[:, None] * fractions[None]).reshape(-1)
    return np.concatenate([inner, e[-1:]])


def check_global_grid(latitude: np.ndarray, longitude: np.ndarray, name: str = "field") -> None:
    """ValueError unless latitude ascends within [-90, 90] and longitude ascends within [0, 360)."""
    lat, lon = np.asarray(latitude), np.asarray(longitude)
    if lat.ndim != 1 or np.any(np.diff(lat) <= 0) or lat.min() < -90 or lat.max() > 90:
        raise ValueError(f"{name}: latitude must be ascending within [-90, 90], got {lat[:3]}...{lat[-3:]}")
    if lon.ndim != 1 or np.any(np.diff(lon) <= 0) or lon.min() < 0 or lon.max() >= 360:
        raise ValueError(f"{name}: longitude must be ascending within [0, 360), got {lon[:3]}...{lon[-3:]}")


def global_axes(fig: plt.Figure, position: Any = 111, proj: str = "robinson",
                longitude: np.ndarray | None = None) -> Any:
    """A GeoAxes showing the whole globe, centred near 0° so that no cell of the grid with these
    ``longitude`` centres is cut by the map edge (see :func:`central_longitude_for`)."""
    crs = projection(proj, central_longitude_for(longitude))
    ax = fig.add_subplot(position, projection=crs)
    ax.set_global()
    return ax


def draw_field(
    ax: Any,
    field: np.ndarray,
    latitude: np.ndarray,
    longitude: np.ndarray,
    coastline_color: str = "black",
    **pcolormesh_kwargs: Any,
) -> Any:
    """Draw a (lat, lon) field as grid cells on ``ax`` (a global GeoAxes), then coastlines on top.

    The longitude edges span exactly 360°, so the last column meets the first (no seam at 0°/360°).
    Returns the QuadMesh (for a colour bar).
    """
    offline_cartopy()
    import cartopy.crs as ccrs

    field = np.asarray(field)
    check_global_grid(latitude, longitude)
    if field.shape != (len(latitude), len(longitude)):
        raise ValueError(f"field shape {field.shape} does not match (lat, lon) = ({len(latitude)}, {len(longitude)})")
    lat_e = cell_edges(latitude, -90.0, 90.0)
    lon_e = cell_edges(longitude)
    if not np.isclose(lon_e[-1] - lon_e[0], 360.0, atol=1e-6):
        raise ValueError(f"longitude must cover the globe in regular cells; edges span {lon_e[-1] - lon_e[0]}°")
    if not isinstance(ax.projection, ccrs.PlateCarree):
        # quads have straight sides in the projection: split each cell into ≤ 2° sub-cells of the same
        # value so that cells at the curved limb of e.g. Robinson meet the map edge (no white slivers)
        k = int(np.ceil(max(np.max(np.diff(lat_e)), np.max(np.diff(lon_e))) / 2.0))
        lat_e, lon_e = refine_edges(lat_e, k), refine_edges(lon_e, k)
        field = np.repeat(np.repeat(field, k, axis=0), k, axis=1)
    corners = projected_corners(ax, lat_e, lon_e)
    if corners is None:  # a cell straddles the map edge: cartopy splits it (slow, see projected_corners)
        mesh = ax.pcolormesh(lon_e, lat_e, field, transform=ccrs.PlateCarree(), shading="flat", rasterized=True,
                             **pcolormesh_kwargs)
    else:
        x, y, start = corners
        # the base class's pcolormesh: the corners are already in the axes' coordinates
        mesh = Axes.pcolormesh(ax, x, y, np.roll(field, -start, axis=1), shading="flat", rasterized=True,
                               **pcolormesh_kwargs)
    # a white halo keeps the coastline visible on dark and light colours alike
    halo = [patheffects.withStroke(linewidth=1.8, foreground="white")]
    ax.coastlines(resolution="110m", color=coastline_color, linewidth=0.7, path_effects=halo)
    graticule(ax)
    return mesh


def projected_corners(ax: Any, lat_e: np.ndarray, lon_e: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Cell corners (x, y), each (len(lat_e), len(lon_e)), in the map's projection coordinates, the columns rolled
    to start at the map's left edge, and that roll ``start`` (the field's columns roll by it too); None when no cell
    edge lies on the map edge (central longitude + 180°).

    Written here because cartopy's ``pcolormesh`` takes every cell whose projected corners land on both sides of the
    map as wrapping around the globe and redraws it as a polygon cut by shapely: with the map edge on a cell edge that
    is the whole column at the edge, ~1 s per map (0.05 s this way). Here the edge column's outer corners are put on
    their own side of the map, so every cell is a plain quad of the projection."""
    import cartopy.crs as ccrs

    proj = ax.projection
    middle = 0.5 * (proj.x_limits[0] + proj.x_limits[1])
    centre = float(ccrs.PlateCarree().transform_point(middle, 0.0, proj)[0])  # the longitude at the map's centre
    edges = lon_e[:-1]
    to_edge = signed_degrees(edges - (centre + 180.0))  # signed distance to the map edge
    start = int(np.argmin(np.abs(to_edge)))
    if abs(to_edge[start]) > 1e-9:
        return None
    longitude = edges[start] + np.append((np.roll(edges, -start) - edges[start]) % 360.0, 360.0)  # ascending
    lon2, lat2 = np.meshgrid(longitude, lat_e)
    xyz = proj.transform_points(ccrs.PlateCarree(), lon2, lat2)
    x, y = xyz[..., 0], xyz[..., 1]
    x[:, 0] = middle - np.abs(x[:, 0] - middle)  # the map's left edge, and its right edge
    x[:, -1] = middle + np.abs(x[:, -1] - middle)
    return x, y, start


def graticule(ax: Any, dlon: int = 60, dlat: int = 30) -> None:
    """Thin meridians and parallels. Drawn as plain lines: cartopy's ``gridlines()`` costs ~4 s per
    Robinson map, these cost milliseconds and look the same without labels."""
    import cartopy.crs as ccrs

    style = dict(color="0.5", linewidth=0.3, alpha=0.6, transform=ccrs.PlateCarree(), zorder=3)
    dense_lon, dense_lat = np.linspace(-180, 180, 361), np.linspace(-90, 90, 181)
    for lat in range(-90 + dlat, 90, dlat):
        ax.plot(dense_lon, np.full_like(dense_lon, lat), **style)
    for lon in range(-180, 180, dlon):
        ax.plot(np.full_like(dense_lat, lon), dense_lat, **style)


def save_png(fig: plt.Figure, path: str | Path, dpi: int = 130) -> Path:
    """Write ``fig`` as PNG atomically (temp file, then rename) and close it."""
    path = Path(path)
    with atomic_path(path, overwrite=True) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    plt.close(fig)
    return path
