"""The data directory's identity: `<data-dir>/meta.properties`, which broker of which cluster
owns it (Kafka keeps the same in its log directories' `meta.properties`).

Format (UTF-8 text, one `key=value` a line, values as JSON strings or integers, in this
order; the last line checks the others):

    # dmq data directory identity: written once by the broker, never edit it
    format="dmq-data-dir"
    version=1
    cluster_id="6f1c0e6b9d6a4c3e9a8f2b7d5e4c3b2a"
    node_id="n1"
    crc32c=1a2b3c4d

`crc32c` is the CRC-32C (hex) of every byte before its line. Every later format keeps a
`version=N` line: a file naming a version above FORMAT_VERSION is refused first, as
written by a newer dmq (FormatTooNew, dmq/compat.py), whatever else it holds. Reading refuses (MetaFileCorrupt,
naming the file and what is wrong) anything else: another key, order or version, a torn or
edited file. A broker then refuses to start rather than guess whose directory it is.

The file is written once per data directory, when the broker first learns its cluster's id
from the metadata group (dmq/broker/identity.py), atomically and durably: a temp file,
fsync, rename, fsync of the directory. A directory without it is fresh (or from a dmq
before cluster ids): it gets the file from the cluster it starts in (with `--join` only
if it holds no data or joined that way before: dmq/cli/serve.py).

What a broker refuses at start, before it changes anything in the directory
(`check_start`; each a one-line error naming both ids and the remedy):

- the file names another node id than `--node-id`;
- (with `--join`, in dmq/cli/serve.py) the file names another cluster than the brokers
  joined; and at run time, once the catalogue's id is known, any other mismatch
  (dmq/broker/identity.py).

This module is small and imports no broker code: the `dmq` command reads it before it
starts a broker (`dmq serve --join`, `dmq storage`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from dmq.compat import too_new_message
from dmq.errors import DataDirMismatch, FormatTooNew, MetaFileCorrupt

META_FILE: Final = "meta.properties"
FORMAT: Final = "dmq-data-dir"
FORMAT_VERSION: Final = 1
# The file is a few lines; anything larger is not one of ours (read no further).
META_FILE_BYTES_MAX: Final = 4096
# The per-broker id that dmq before cluster ids kept (one per data directory, not per
# cluster): proposed as the cluster's id by the first upgraded broker, else unused.
LEGACY_CLUSTER_ID_FILE: Final = Path("meta") / "cluster_id"
_HEADER: Final = "# dmq data directory identity: written once by the broker, never edit it\n"
_KEYS: Final = ("format", "version", "cluster_id", "node_id", "crc32c")


@dataclass(frozen=True, slots=True)
class DataDirMeta:
    cluster_id: str
    node_id: str
    version: int = FORMAT_VERSION


def encode(meta: DataDirMeta) -> bytes:
    body = (
        _HEADER
        + f"format={json.dumps(FORMAT)}\n"
        + f"version={meta.version}\n"
        + f"cluster_id={json.dumps(meta.cluster_id)}\n"
        + f"node_id={json.dumps(meta.node_id)}\n"
    ).encode()
    return body + f"crc32c={crc32c.crc32c(body):08x}\n".encode()


def decode(data: bytes, where: str = META_FILE) -> DataDirMeta:
    """The identity in `data`; MetaFileCorrupt naming `where` and the fault otherwise."""

    def corrupt(why: str) -> MetaFileCorrupt:
        return MetaFileCorrupt(
            f"{where} is not a valid dmq data directory identity ({why}); the broker will "
            f"not guess whose directory this is: restore the file, or empty the directory "
            f"with `dmq storage reset`"
        )

    if len(data) > META_FILE_BYTES_MAX:
        raise corrupt(f"{len(data)} bytes, at most {META_FILE_BYTES_MAX}")
    found = written_version(data)
    if found is not None and found > FORMAT_VERSION:  # before any other check: its layout
        raise FormatTooNew(too_new_message(where, found, FORMAT_VERSION))  # may differ
    body, sep, last = data.rstrip(b"\n").rpartition(b"\n")
    if not sep or not last.startswith(b"crc32c="):
        raise corrupt("no crc32c line at the end")
    body += b"\n"
    digits = last[len(b"crc32c=") :]
    if len(digits) != 8 or not set(digits) <= set(b"0123456789abcdef"):
        raise corrupt("crc32c is not 8 lowercase hex digits")  # int() would take " 1a"
    stored = int(digits, 16)
    if crc32c.crc32c(body) != stored or data != body + last + b"\n":
        raise corrupt("crc32c mismatch: torn or edited")
    try:
        lines = body.decode().splitlines()
        if not lines or lines[0] + "\n" != _HEADER:
            raise ValueError("no header line")
        pairs = [line.split("=", 1) for line in lines[1:]]
        if [p[0] for p in pairs] != list(_KEYS[:-1]) or any(len(p) != 2 for p in pairs):
            raise ValueError(f"keys must be {', '.join(_KEYS)} in that order")
        values = {key: json.loads(value) for key, value in pairs}
    except (UnicodeDecodeError, ValueError) as exc:
        raise corrupt(str(exc)) from None
    if values["format"] != FORMAT or values["version"] != FORMAT_VERSION:
        raise corrupt(f"format {values['format']!r} v{values['version']!r}")
    cluster_id, node_id = values["cluster_id"], values["node_id"]
    if not (isinstance(cluster_id, str) and cluster_id and isinstance(node_id, str) and node_id):
        raise corrupt("cluster_id and node_id must be non-empty strings")
    return DataDirMeta(cluster_id, node_id)


def written_version(data: bytes) -> int | None:
    """The `version=N` a file names (every format of it keeps that line), else None."""
    for line in data.splitlines():
        if line.startswith(b"version="):
            digits = line[len(b"version=") :]
            return int(digits) if digits.isdigit() and len(digits) < 10 else None
    return None


def read(data_dir: Path) -> DataDirMeta | None:
    """The directory's identity; None if it has none (fresh, or from before cluster ids)."""
    path = data_dir / META_FILE
    try:
        with open(path, "rb") as f:
            data = f.read(META_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MetaFileCorrupt(f"cannot read {path}: {exc}") from exc
    return decode(data, str(path))


def write(data_dir: Path, meta: DataDirMeta) -> None:
    """Write the identity atomically and durably (temp file, fsync, rename, fsync dir)."""
    path = data_dir / META_FILE
    tmp = path.with_name(META_FILE + ".tmp")
    with open(tmp, "wb") as f:
        f.write(encode(meta))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_legacy_cluster_id(data_dir: Path) -> str:
    """The per-broker id an older dmq kept in `meta/cluster_id` ("" if none)."""
    try:
        return (data_dir / LEGACY_CLUSTER_ID_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def check_start(data_dir: Path, node_id: str) -> DataDirMeta | None:
    """Before a broker changes anything in `data_dir`: its identity (None if it has none),
    or DataDirMismatch if it belongs to another broker than `node_id`."""
    meta = read(data_dir)
    if meta is not None and meta.node_id != node_id:
        raise DataDirMismatch(
            f"data directory {data_dir} belongs to broker {meta.node_id} of cluster "
            f"{meta.cluster_id}, not to --node-id {node_id}: start it with --node-id "
            f"{meta.node_id}, or give broker {node_id} its own --data-dir (nothing was changed)"
        )
    return meta


def mismatch_message(data_dir: Path, own: str, other: str, where: str) -> str:
    """The one line of every cluster refusal: both ids and the remedy."""
    return (
        f"data directory {data_dir} belongs to cluster {own}, {where} is cluster {other}: "
        f"a broker never changes cluster; start it without --join to serve its own data, "
        f"or move the directory to cluster {other} with `dmq storage reset --data-dir "
        f"{data_dir}` (deletes its data) (nothing was changed)"
    )
