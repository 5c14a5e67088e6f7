"""bench/: benchmarks of dmq's layers, runnable alone (`python -m bench.log_bench`).

Each benchmark exposes `run(args) -> dict` so that `dmq bench ...` can call it, prints its
setup before its figures, and measures a baseline in the same run so that its figures can be
read as a fraction of what the machine does without dmq. See bench/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
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


def load_module(path: str, name: str) -> ModuleType:
    """An older copy of a module (`--against FILE`), loaded beside the current one."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def alternated_cpu_medians(
    cases: dict[str, Callable[[], object]], repeats: int, loops: int
) -> dict[str, float]:
    """Per case, the median over `repeats` of the CPU seconds (`time.process_time`) one
    call takes, averaged over `loops` calls; the cases alternate within each repeat, so
    that a load drifting during the run weighs on them alike."""
    samples: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(repeats):
        for case, fn in cases.items():
            start = time.process_time()
            for _ in range(loops):
                fn()
            samples[case].append((time.process_time() - start) / loops)
    return {case: statistics.median(s) for case, s in samples.items()}
