"""``python -m cosparse ...``: the command line, as the ``cosparse`` script runs it (so that
launchers that start a module, such as ``torchrun -m cosparse``, can start it)."""

import sys

from cosparse.cli import main

sys.exit(main())
