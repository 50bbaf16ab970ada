"""smoeweather.models: the networks of every task, each registered in :mod:`smoeweather.models.registry`.

Importing the package imports every model module (the weather networks here, the heat and vision ones in their
task packages), so the registry is complete whichever module is used."""

import smoeweather.heat.models  # noqa: F401 - model modules register their networks on import
import smoeweather.vision.models  # noqa: F401
from smoeweather.models import ensemble, resnet, unet  # noqa: F401
