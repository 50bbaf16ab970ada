"""smoeweather: Spatial Mixture-of-Experts for weather and scientific fields on fixed grids."""

__version__ = "0.1.0"
