"""CPU time of the produce path's batch check (log/records.py `validate_batch`), #22.

    python -m bench.records_bench [--quick] [--against OLD_RECORDS_PY]

For a producer's batch of 1000 x 1 KiB records (uncompressed and zstd), 1000 x 100 B
records with a key, 1000 records of 50-500 B and 128 x 1 KiB (under
VECTORISED_RECORDS_MIN: the scalar walk): CPU microseconds per batch (`time.process_time`,
so other work on a shared machine moves it little) of `validate_batch`, of its parts (the
CRC-32C, the scalar per-record walk and the numpy one, log/record_walk.py) and of
`decode_batch` for scale; medians of the repeats. With
`--against`, a copy of an older log/records.py (e.g. `git show main:log/records.py >
/tmp/old.py`) is loaded beside this one and both are measured alternately in the same
process, with the ratio new/old.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from functools import partial

from bench import alternated_cpu_medians, load_module
from log import records as current
from log.crc import crc32c


def _batches() -> dict[str, bytes]:
    ts = 1_700_000_000_000
    big = [
        current.Record(key=None, value=os.urandom(1024), timestamp_ms=ts + i) for i in range(1000)
    ]
    small = [
        current.Record(key=b"k%d" % i, value=os.urandom(100), timestamp_ms=ts + i)
        for i in range(1000)
    ]
    varied = [
        current.Record(key=None, value=os.urandom(50 + i * 37 % 450), timestamp_ms=ts + i)
        for i in range(1000)
    ]
    return {
        "1000 x 1 KiB, none": current.encode_batch(big),
        "1000 x 1 KiB, zstd": current.encode_batch(big, codec=current.Codec.ZSTD),
        "1000 x 100 B + key, none": current.encode_batch(small),
        "1000 x 50-500 B, none": current.encode_batch(varied),
        "128 x 1 KiB, none (cluster_bench's batch)": current.encode_batch(big[:128]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--repeats", type=int, default=7, help="medians of this many")
    parser.add_argument("--against", help="path of an older log/records.py to compare with")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    loops = 20 if args.quick else 100
    old = load_module(args.against, "records_against") if args.against else None
    print(f"load average at start: {os.getloadavg()}")
    print("CPU us per batch, median of", repeats, "repeats of", loops, "loops")
    for name, batch in _batches().items():
        header = current.read_header(batch)
        cases: dict[str, Callable[[], object]] = {
            "validate_batch": partial(current.validate_batch, batch),
            "  CRC-32C alone": partial(crc32c, memoryview(batch)[current.CRC_START :]),
            "decode_batch": partial(current.decode_batch, batch),
        }
        if header.codec == current.Codec.NONE:
            cases["  record walk alone, scalar"] = partial(
                current._check_records, batch, header, current.DEFAULT_LIMITS, current.HEADER_BYTES
            )
            cases["  record walk alone, arrays"] = partial(
                current._records_are_valid,
                batch,
                current.HEADER_BYTES,
                header.record_count,
                current.DEFAULT_LIMITS,
            )
        if old is not None:
            cases["validate_batch, --against"] = partial(old.validate_batch, batch)
        seconds = alternated_cpu_medians(cases, repeats, loops)
        medians = {case: s * 1e6 for case, s in seconds.items()}
        print(f"{name} ({len(batch)} bytes)")
        for case, median in medians.items():
            print(f"  {case:30} {median:10.1f}")
        if old is not None:
            ratio = medians["validate_batch"] / medians["validate_batch, --against"]
            print(f"  {'new / --against':30} {ratio:10.2f}")
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
