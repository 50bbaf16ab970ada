"""The heat-diffusion benchmark of the SMoE paper (§3.1, Tables 1–2), self-contained: its data
(:mod:`~smoeweather.heat.data`), its networks (:mod:`~smoeweather.heat.models`, registered for task ``heat``),
the paper table (:mod:`~smoeweather.heat.table`, ``smoe heat benchmark``) and its figures
(:mod:`~smoeweather.heat.plots`). Each module sits in its stage's layer (``docs/development.md``)."""
