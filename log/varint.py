"""Zigzag varints (Kafka's varint/varlong encoding, up to 64 bits), one at a time.

The records section's lengths and deltas (log/README.md "RecordBatch format"): written by
log/records.py, read by it and by log/record_walk.py, which must not import log/records.py
(that imports it) and so finds them here.
"""

from __future__ import annotations


def put_varint(out: bytearray, n: int) -> None:
    """Append n as a zigzag varint (Kafka's varint/varlong encoding, up to 64 bits)."""
    z = (n << 1) ^ (n >> 63)
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


def get_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Read a zigzag varint at pos; returns (value, next position). IndexError if cut."""
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    z = b & 0x7F
    shift = 7
    while True:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
