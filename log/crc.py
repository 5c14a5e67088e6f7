"""CRC-32C (Castagnoli), the checksum of every batch.

Backed by the `crc32c` package (C, SSE4.2 when the CPU has it): the stdlib only has
zlib's CRC-32 (a different polynomial), and a pure-Python CRC-32C runs at a few MB/s.
"""

from __future__ import annotations

import crc32c as _crc32c

Buffer = bytes | bytearray | memoryview


def crc32c(data: Buffer, value: int = 0) -> int:
    """CRC-32C of data, continuing from `value` (the CRC of the bytes before it)."""
    return int(_crc32c.crc32c(data, value))
