"""Post-processing of ensemble forecasts into Gaussian (μ, σ) forecasts: EMOS, ENS-10 networks, cross-validation.

Modules: :mod:`.stores` (read ensemble stores and their truth, write ``gaussian`` stores), :mod:`.emos`
(EMOS fit/apply), :mod:`.crossval` (leave-one-year-out scores), :mod:`.neural` (apply an ENS-10
U-Net/SMoE-U-Net checkpoint), :mod:`.synthetic` (a seeded imperfect ensemble from a canonical store).
"""
