"""``python -m cosparse.cli ...``: the command line (how PS shards and data workers are started)."""

import sys

from cosparse.cli import main

sys.exit(main())
