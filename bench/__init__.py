"""bench/: benchmarks of dmq's layers, runnable alone (`python -m bench.log_bench`).

Each benchmark exposes `run(args) -> dict` so that `dmq bench ...` can call it, prints its
setup before its figures, and measures a baseline in the same run so that its figures can be
read as a fraction of what the machine does without dmq. See bench/README.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any


def main_of(
    doc: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], Any],
) -> Callable[..., int]:
    """A benchmark module's `main(argv)`: its options, one run, exit status 0."""

    def main(argv: Sequence[str] | None = None) -> int:
        parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
        add_arguments(parser)
        run(parser.parse_args(argv))
        return 0

    return main
