"""``python -m vfltorch`` is ``vfl``; torchrun starts it with ``torchrun ... -m vfltorch METHOD ...``."""

import sys

from .cli import entry

sys.exit(entry())
