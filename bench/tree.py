"""The tree a benchmark runs: every Python process bench/ starts imports this tree's code.

`python -m MODULE` puts its working directory first on sys.path, ahead of PYTHONPATH and
of the editable install. A broker started from the caller's working directory therefore
runs whatever tree that directory holds, whichever tree the benchmark itself came from:
`PYTHONPATH=/tmp/old dmq bench broker`, run from a checkout to measure another tree (`git
archive REV | tar -x -C /tmp/old`), ran the old client against the checkout's brokers.
Started in the root of the tree this module was imported from, a child runs the same code
as the benchmark that started it.

The child's working directory is then not the caller's, so every path handed to it (data
directories, files named in its arguments) must be absolute: resolve it where it is made.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TREE_ROOT = Path(__file__).resolve().parents[1]


def start_python(args: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """`python ARGS` (this interpreter) started in TREE_ROOT, so that it imports this
    tree's code; `popen` goes to subprocess.Popen (its own `cwd` would be an error)."""
    return subprocess.Popen([sys.executable, *args], cwd=TREE_ROOT, **popen)
