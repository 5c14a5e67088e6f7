"""`python -m dmq ...` runs the `dmq` command (dmq/cli/__init__.py)."""

import sys

from dmq.cli import main

sys.exit(main())
