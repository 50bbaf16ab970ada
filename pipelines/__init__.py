"""Data pipelines: raw files → analysis-ready zarr (heat diffusion, ERA5, CMIP6, ENS-10)."""
