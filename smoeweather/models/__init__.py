"""smoeweather.models: the networks of every task, each registered in :mod:`smoeweather.models.registry`.

Importing the package imports every model module, so the registry is complete whichever module is used."""

from smoeweather.models import ensemble, heat, resnet, unet, vision  # noqa: F401 - they register their networks
