"""Write tests/durations.json (seconds per test file, summed over setup, call and teardown)
from the output of a full run with `--durations=0`: `python tests/durations.py LOG`.
conftest.py runs the longest files first."""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (?:call|setup|teardown)\s+(\S+?)::")


def per_file(lines: list[str]) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for line in lines:
        if match := LINE.match(line):
            seconds[match.group(2)] += float(match.group(1))
    return {path: round(total, 1) for path, total in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main() -> None:
    found = per_file(Path(sys.argv[1]).read_text().splitlines())
    if not found:
        sys.exit(f"no duration lines in {sys.argv[1]}: run pytest with --durations=0")
    out = Path(__file__).with_name("durations.json")
    out.write_text(json.dumps(found, indent=0) + "\n")
    print(f"{len(found)} files, {sum(found.values()):.0f} s -> {out}")


if __name__ == "__main__":
    main()
