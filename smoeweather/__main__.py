"""``python -m smoeweather ...`` = the ``smoe`` command."""

import sys

from smoeweather.cli import main

sys.exit(main())
