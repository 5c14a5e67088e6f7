"""Records sections walked in whole numpy arrays: the produce path's batch check (#22).

`records_are_valid` is `validate_batch`'s walk of a large batch. The same checks as the
scalar walk (log/records.py `_check_records`), in two steps:

1. the chain of record lengths (`record_chain`): where every record starts, each one
   inside the section and nothing after the last; read in Python one varint per record,
   or in runs of records of one size checked at once in numpy;
2. every other field of every record in whole arrays (`varints`: one numpy pass per
   byte of the longest varint), each wholly inside its record: the offset deltas exactly
   0..record_count-1, key and value lengths -1 (null) or more, every limit, and the
   fields ending exactly at the record's length. A record with headers has them walked
   by the scalar walk's own code (log/records.py `_check_headers`: counts, lengths,
   limits, UTF-8 keys), which the caller passes in.

It answers only "valid for certain": anything else (a damaged batch, a limit broken, a
10-byte varint that int64 cannot hold) returns False and the caller runs the scalar walk,
which raises the exact error (class, message, field, limit) or, for what the arrays could
not read, accepts. So this walk never accepts what the scalar one refuses, and an honest
producer's batch never needs the scalar walk.

spark_io/_arrow.py reads fetch answers with `record_chain` and `varints` too (the one
place outside log/ allowed to import it: tests/test_layering.py ALLOWED). numpy is
imported here only, and this module only when a batch is large enough to use it, so
that clients importing log.records do not pay numpy's import.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from log.errors import InvalidRecordError
from log.varint import get_varint

I64 = npt.NDArray[np.int64]
# The shift of a varint's 9th byte: the arrays read up to 9 bytes (< 2**63 in int64).
VARINT_SHIFT_MAX = 56
# record_chain: a guessed run of records of one size shorter than this is a miss.
RUN_RECORDS_MIN = 8


class NeedsScalarWalk(Exception):
    """The arrays met what only a scalar walk reads exactly (a 10-byte varint; for
    spark_io also an offset or timestamp at the edge of int64)."""


def records_are_valid(
    section: bytes,
    start: int,
    record_count: int,
    record_bytes_max: int,
    key_bytes_max: int,
    check_headers: Callable[[int, int, int], int],
) -> bool:
    """True if the records of section[start:] pass every check of `_check_records`
    (the batch header's own checks done by the caller); False if the scalar walk must
    decide: it then raises the exact error, or accepts what the arrays could not read.
    `check_headers(pos, record_end, i)` is the scalar walk's check of record i's header
    count at pos and its headers, returning the position after them.

    Fields are read as raw zigzag values z (the length is z >> 1, -1 is z == 1, any other
    odd z is negative) and without a bound per field: positions only grow within a record
    (lengths below 0 are refused, -1 adds nothing), so a record whose header count is its
    last byte had every field inside it. A read past the section is an IndexError."""
    buf = np.frombuffer(section, np.uint8)
    starts: list[I64] = []
    walked: list[int] = []
    try:
        record_chain(section, buf, start, len(section), record_count, starts, walked)
        if walked:
            starts.append(np.array(walked, np.int64))
        z, fields_at = zigzags(buf, np.concatenate(starts))
        length = z >> 1  # >= 0 and inside the section: record_chain checked both
        if length.max() > record_bytes_max:
            return False
        record_end = fields_at + length
        _, pos = zigzags(buf, fields_at + 1)  # after the attributes: the timestamp delta
        z, pos = zigzags(buf, pos)
        if not (z == np.arange(0, 2 * record_count, 2)).all():  # offset delta == index
            return False
        z, pos = zigzags(buf, pos)  # the key's length
        if (z * (z & 1) > 1).any() or (z >> 1).max() > max(key_bytes_max, 0):
            return False
        z, pos = zigzags(buf, pos + (z >> 1))  # the value's length
        if (z * (z & 1) > 1).any():
            return False
        pos += z >> 1  # the header count
        with_headers = np.flatnonzero(buf[pos])
        if len(with_headers) == 0:
            return bool((pos + 1 == record_end).all())
        last = pos + 1 == record_end
        last[with_headers] = True
        if not last.all():
            return False
        for i in with_headers.tolist():
            end = int(record_end[i])
            if pos[i] >= end or check_headers(int(pos[i]), end, i) != end:
                return False
    except (ValueError, IndexError, UnicodeDecodeError, InvalidRecordError, NeedsScalarWalk):
        return False  # a header limit broken (RecordTooLargeError) included
    return True


def record_chain(
    data: bytes | bytearray,
    buf: npt.NDArray[np.uint8],
    pos: int,
    end: int,
    count: int,
    starts: list[I64],
    walked: list[int],
) -> int:
    """The chain of record lengths of one records section data[pos:end]: append where
    each record starts to `starts`, or, for records walked one by one, to `walked` (moved
    into `starts` before the next run, and by the caller at the end, so that batches of a
    record or two cost no numpy call); return how many records. Checked as the scalar
    walk does: every record inside the section, nothing after the last.

    Each length is read in Python, then a run is guessed: the next records are as long
    as this one if their length varints are the same bytes, checked at once in numpy
    (record k of the run starts at pos + k * size only if record k-1 had that size, so the
    run ends at the first mismatch). Records of one size (fixed-width keys and values)
    come in long runs, broken where a delta's varint grows a byte. After a run shorter
    than RUN_RECORDS_MIN (or none: the next record's length differs, seen without numpy),
    twice as many records as before go one by one before the next guess, so that records
    of varied sizes cost little more than the plain loop."""
    left = count
    pause = RUN_RECORDS_MIN  # records walked one by one after the next short run
    while left > 0:
        first = pos
        length, pos = get_varint(data, pos)  # once per run or guess: the loops inline it
        width = pos - first
        size = width + length
        if length < 0 or first + size > end:
            raise ValueError("record length runs past the records section")
        fits = min(left, (end - first) // size)  # size >= width >= 1
        if fits < RUN_RECORDS_MIN:
            walked.append(first)
            pos = first + size
            left -= 1
            continue
        if data[first + size : first + size + width] != data[first:pos]:
            matched = 1  # the next record is another size: no run, and no numpy call
            walked.append(first)
        else:
            run = first + size * np.arange(fits, dtype=np.int64)
            same = buf[run] == data[first]
            for j in range(1, width):
                same &= buf[run + j] == data[first + j]
            matched = fits if same.all() else int(np.argmin(same))
            if walked:
                starts.append(np.array(walked, np.int64))
                walked.clear()
            starts.append(run[:matched])
        pos = first + size * matched
        left -= matched
        if matched < RUN_RECORDS_MIN:
            alone = min(pause, left)
            pos = record_chain_one_by_one(data, pos, end, alone, walked)
            left -= alone
            pause *= 2
        else:
            pause = RUN_RECORDS_MIN
    if pos != end:
        raise ValueError("bytes left after the last record")
    return max(count, 0)


def record_chain_one_by_one(
    data: bytes | bytearray, pos: int, end: int, count: int, walked: list[int]
) -> int:
    """record_chain's plain loop for `count` records from pos: their starts appended to
    `walked`, each checked inside the section; return the position after them."""
    append = walked.append
    for _ in range(count):
        append(pos)
        b = data[pos]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            pos += 1
        elif data[pos + 1] < 0x80:
            z = (b & 0x7F) | (data[pos + 1] << 7)
            length = (z >> 1) ^ -(z & 1)
            pos += 2
        else:
            length, pos = get_varint(data, pos)
        pos += length
        if length < 0 or pos > end:
            raise ValueError("record length runs past the records section")
    return pos


def varints(buf: npt.NDArray[np.uint8], pos: I64, limit: I64) -> tuple[I64, I64]:
    """The zigzag varint at each pos, each wholly before its limit: (values, positions
    after). Raises NeedsScalarWalk at a 10th byte (only the scalar walk reads those, with
    Python's unbounded ints)."""
    if (pos >= limit).any():
        raise ValueError("record fields run past the record's length")
    z, after = zigzags(buf, pos, limit)
    return (z >> 1) ^ -(z & 1), after


def zigzags(buf: npt.NDArray[np.uint8], pos: I64, limit: I64 | None = None) -> tuple[I64, I64]:
    """The varint at each pos as its zigzag value z, not undone (z >> 1 is the magnitude,
    z & 1 the sign): (z, positions after). One numpy pass per byte of the longest; with
    `limit`, each byte after the first must lie before it (ValueError). Raises
    NeedsScalarWalk at a 10th byte."""
    b = buf[pos]
    after = pos + 1
    if b.max(initial=0) < 0x80:  # one byte each: the common case, in four numpy calls
        return b.astype(np.int64), after
    # One or two bytes each (nearly all the rest) without indexing by the records that
    # continue: every record's second byte, used only where the first continues.
    longer = b >= 0x80
    second = buf.take(after, mode="clip")  # clipped: a varint cut by the end continues
    ends = ~longer | (second < 0x80)
    if ends.all() and (limit is None or ((after < limit) | ~longer).all()):
        z = (b & 0x7F).astype(np.int64)
        z |= np.where(longer, second.astype(np.int64) << 7, 0)
        return z, after + longer
    z = (b & 0x7F).astype(np.int64)
    more = np.flatnonzero(longer)
    shift = 7
    while len(more):
        if shift > VARINT_SHIFT_MAX:
            raise NeedsScalarWalk
        at = after[more]
        if limit is not None and (at >= limit[more]).any():
            raise ValueError("record fields run past the record's length")
        b = buf[at]
        z[more] |= (b & 0x7F).astype(np.int64) << shift
        after[more] = at + 1
        more = more[b >= 0x80]
        shift += 7
    return z, after
