"""Post-processing of ensemble forecasts into predictive (μ, σ) forecasts: EMOS, DRN, ENS-10 networks,
cross-validation.

Ensemble sources, truth and forecast stores are read and written by :mod:`smoeweather.data.forecast_stores`.
Modules: :mod:`.calibrator` (the one interface: a Calibrator per method with fit, apply, save, load; what
``smoe postprocess fit/apply`` run), :mod:`.options` (the typed option block of each method, each default once),
:mod:`.pipeline` (opening and checking inputs, writing outputs: what every calibrator shares on files),
:mod:`.forms` (the predictive distribution and every output form of it), :mod:`.emos` (EMOS fit/apply) on
:mod:`.chunked` (out of core) and :mod:`.newton` (the solver), :mod:`.drn` (distributional regression network
with a location embedding), :mod:`.distributions` (Gaussian and truncated-normal CRPS, quantiles),
:mod:`.crossval` (leave-one-year-out scores), :mod:`.neural` (apply an ENS-10 U-Net/SMoE-U-Net checkpoint),
:mod:`.synthetic` (a seeded imperfect ensemble from a canonical store).
"""
