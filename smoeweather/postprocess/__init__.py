"""Post-processing of ensemble forecasts into Gaussian (μ, σ) forecasts: EMOS, ENS-10 networks, cross-validation.

Ensemble sources, truth and forecast stores are read and written by :mod:`smoeweather.data.ensembles`.
Modules: :mod:`.emos` (EMOS fit/apply), :mod:`.drn` (distributional regression network with a location
embedding), :mod:`.distributions` (Gaussian and truncated-normal CRPS, quantiles), :mod:`.crossval`
(leave-one-year-out scores), :mod:`.neural` (apply an ENS-10 U-Net/SMoE-U-Net checkpoint), :mod:`.synthetic`
(a seeded imperfect ensemble from a canonical store).
"""
