"""smoeweather networks inside other frameworks' workflows (:mod:`smoeweather.interop.earth2studio`).

An outward-facing layer: it may import the models and the forecast code; nothing of the package imports it, and
the framework it adapts to is an optional dependency imported only by the module that needs it.
"""
