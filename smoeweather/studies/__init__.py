"""The study harness of ``smoe study``: a study file (:mod:`~smoeweather.studies.config`), its runs
(:mod:`~smoeweather.studies.run`), their cost (:mod:`~smoeweather.studies.cost`) and ensemble scores
(:mod:`~smoeweather.studies.ensembles`), paired statistics (:mod:`~smoeweather.studies.statistics`) and the
report (:mod:`~smoeweather.studies.report`)."""
