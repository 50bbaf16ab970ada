"""``smoe evaluate``, one scoring engine for grids and sites: :mod:`~smoeweather.evaluate.inputs` opens the
forecasts and the truth, :mod:`~smoeweather.evaluate.run` scores gridded forecasts (:func:`~smoeweather.evaluate.
run.evaluate`), :mod:`~smoeweather.evaluate.sites` station forecasts, :mod:`~smoeweather.evaluate.assemble` puts
the tables together, :mod:`~smoeweather.evaluate.files` writes them, and :mod:`~smoeweather.evaluate.cluster`
scores on a dask.distributed cluster."""
