"""`python -m dmq ...` runs the `dmq` command (dmq/cli.py)."""

import sys

from dmq.cli import main

sys.exit(main())
