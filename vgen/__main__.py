"""``python -m vgen`` is the ``vgen`` command (so ``torchrun -m vgen ...`` works)."""

import sys

from vgen.apps.cli import main

sys.exit(main())
