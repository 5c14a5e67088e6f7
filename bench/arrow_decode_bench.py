"""CPU time of spark_io's decoder: one binary fetch answer into an Arrow record batch, #22.

    python -m bench.arrow_decode_bench [--quick] [--against OLD_ARROW_PY]

For answers as a Spark task fetches them (8 MiB of stored batches of up to 1 MiB, as
`dmq bench spark`'s producer writes them): CPU milliseconds per answer
(`time.process_time`, so other work on a shared machine moves it little) of
`decode_into` + `to_record_batch`, the way spark_io/_read.py calls them, in each mode:
`vectorised` (spark_io/_arrow.py as it is), `scalar` (the same module with every answer
sent to its one-record-at-a-time loop, VECTORISED_RECORDS_MIN raised out of reach) and,
with `--against`, a copy of an older spark_io/_arrow.py (e.g. `git show
main:spark_io/_arrow.py > /tmp/old.py`) loaded beside this one. The modes alternate in
one process; medians of the repeats, and each mode's ratio to the first.

Cases: 1 KiB values with 16-byte keys (`dmq bench spark`'s records: one size, so
record_chain's runs apply), values of 512-1535 bytes (every record another size: the
chain walked one record at a time), 100-byte values, the 1 KiB records zstd-compressed,
the 1 KiB records with one header each read with includeHeaders, and an answer of
single-record batches of 1 KiB (a producer that does not batch).
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Callable
from functools import partial
from types import ModuleType

import pyarrow as pa

from bench import alternated_cpu_medians, load_module
from log.records import Codec, Header, Record, encode_batch
from spark_io import _arrow as current
from spark_io.source import arrow_schema, spark_schema

ANSWER_BYTES = 8 * 1024 * 1024  # fetchMaxBytes' default
BATCH_BYTES = 1024 * 1024  # bench/spark_bench.py's producer batch_bytes
TIMESTAMP_MS = 1_700_000_000_000
RECORDS_PER_MS = 10  # timestamps step every 10 records: deltas of 1 and 2 bytes


def _answer(
    value_bytes: Callable[[int], int],
    *,
    answer_bytes: int,
    batch_records_max: int = 1 << 30,
    codec: Codec = Codec.NONE,
    headers: tuple[Header, ...] = (),
) -> tuple[bytes, int]:
    """Batches of records (16-byte keys) up to answer_bytes of values: (answer, records)."""
    rng = random.Random(22)
    pool = rng.randbytes(2 * 1024 * 1024)
    body = bytearray()
    offset = 0
    while len(body) < answer_bytes:
        records: list[Record] = []
        size = 0
        while size < BATCH_BYTES and len(records) < batch_records_max:
            n = value_bytes(offset + len(records))
            at = rng.randrange(len(pool) - n)
            ts = TIMESTAMP_MS + (offset + len(records)) // RECORDS_PER_MS
            records.append(
                Record(b"%016d" % (offset + len(records)), pool[at : at + n], headers, ts)
            )
            size += n + 16
        body += encode_batch(records, base_offset=offset, codec=codec)
        offset += len(records)
    return bytes(body), offset


def _cases(answer_bytes: int) -> dict[str, tuple[bytes, int, bool]]:
    varied = random.Random(7)
    one_header = (Header("tag", b"eu-west"),)
    return {
        "1 KiB": (*_answer(lambda _: 1024, answer_bytes=answer_bytes), False),
        "512-1535 B": (
            *_answer(lambda _: varied.randrange(512, 1536), answer_bytes=answer_bytes),
            False,
        ),
        "100 B": (*_answer(lambda _: 100, answer_bytes=answer_bytes // 4), False),
        "1 KiB, zstd": (
            *_answer(lambda _: 1024, answer_bytes=answer_bytes, codec=Codec.ZSTD),
            False,
        ),
        "1 KiB, includeHeaders": (
            *_answer(lambda _: 1024, answer_bytes=answer_bytes, headers=one_header),
            True,
        ),
        "1 KiB, 1 record per batch": (
            *_answer(lambda _: 1024, answer_bytes=answer_bytes // 8, batch_records_max=1),
            False,
        ),
    }


def _decode(module: ModuleType, body: bytes, records: int, headers: bool) -> pa.RecordBatch:
    columns = module.Columns("bench", 0, headers)
    module.decode_into(columns, body, 0, records)
    batch: pa.RecordBatch = columns.to_record_batch(
        arrow_schema(spark_schema(include_headers=headers))
    )
    if batch.num_rows != records:
        raise AssertionError(f"{batch.num_rows} rows decoded of {records}")
    return batch


def _scalar(body: bytes, records: int, headers: bool) -> pa.RecordBatch:
    saved = current.VECTORISED_RECORDS_MIN
    current.VECTORISED_RECORDS_MIN = 1 << 62
    try:
        return _decode(current, body, records, headers)
    finally:
        current.VECTORISED_RECORDS_MIN = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small answers, fewer repeats")
    parser.add_argument("--repeats", type=int, default=7, help="medians of this many")
    parser.add_argument("--against", help="path of an older spark_io/_arrow.py to compare with")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    loops = 1 if args.quick else 5
    old = load_module(args.against, "arrow_against") if args.against else None
    cases = _cases(ANSWER_BYTES // 32 if args.quick else ANSWER_BYTES)
    print(f"load average at start: {os.getloadavg()}")
    print(f"CPU ms per answer (decode_into + to_record_batch), median of {repeats} repeats")
    for name, (body, records, headers) in cases.items():
        modes: dict[str, Callable[[], object]] = {
            "vectorised": partial(_decode, current, body, records, headers),
            "scalar": partial(_scalar, body, records, headers),
        }
        if old is not None:
            modes["--against"] = partial(_decode, old, body, records, headers)
        expected = modes["scalar"]()
        for mode, fn in modes.items():  # every mode decodes to the same batch
            if not fn().equals(expected):
                raise AssertionError(f"{name}: {mode} decodes to another batch than scalar")
        seconds = alternated_cpu_medians(modes, repeats, loops)
        medians = {mode: s * 1e3 for mode, s in seconds.items()}
        print(f"{name}: {records} records, {len(body) / 2**20:.2f} MiB")
        for mode, median in medians.items():
            mb_s = len(body) / median / 1e3
            ratio = median / medians["vectorised"]
            print(
                f"  {mode:12} {median:8.2f} ms {mb_s:8.0f} MB/s "
                f"{median / records * 1e3:6.2f} us/record  x{ratio:.2f} of vectorised"
            )
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
