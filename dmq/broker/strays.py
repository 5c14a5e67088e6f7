"""Stray partition data: set aside, reported, never opened as a replica nor deleted.

A partition directory (`partitions/<topic>-<n>`) is stray when another cluster wrote it
(its `cluster_id` file names another cluster: reconcile.py, `_judge_cluster`), or when
this cluster's catalogue does not know it: its topic id was never handed out here (at or above the catalogue's
`next_topic_id` once this broker has registered, so the catalogue is not lagging), or the
catalogue gives that id to a topic of another name. Its Raft directory
(`raft/groups/<group id>`) goes with it when the topic id was never handed out (else that
group id is the catalogue topic's own); a Raft directory of a newer id found alone is
left where it is, unjudged, as before (it may be another kind of group). Such data came from elsewhere: another cluster, a restored
backup, a directory copied by hand. Opening it as a replica would mix its records into a
log of this cluster; deleting it would lose records nobody may have copied. So the
reconciler (reconcile.py) hands it here and this service:

1. renames it into `<data-dir>/set-aside/<unix ms>-<partitions|raft-groups>-<name>` (one
   rename on the same file system, then an fsync of both parent directories: the data is
   never half in one place and half in the other);
2. writes next to it `<that name>.json`: where it came from, its topic id and partition,
   why, and when;
3. logs one warning naming both paths, and lists it in `GET /v1/storage/set-aside`
   (http_api/identity.py) until an operator moves it back or deletes it (`rm -r`).

Directories of topics the cluster deleted (an id below `next_topic_id` that no topic has
any more), and replicas moved to other brokers, are not stray: the catalogue decided
those, and the reconciler deletes them as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Final

from dmq.metadata.service import wall_ms
from log.segment import fsync_directory

_log = logging.getLogger("dmq.broker")

SET_ASIDE_DIR: Final = "set-aside"  # in the data directory
# Entries listed by GET /v1/storage/set-aside at most (the listing walks each one's files).
SET_ASIDE_LISTED_MAX: Final = 1000


def _size_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total


class StrayData:
    """This broker's set-aside data (module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self.root = data_dir / SET_ASIDE_DIR

    def set_aside(self, path: Path, topic_id: int | None, partition: int, reason: str) -> Path:
        """Move `path` (a directory under the data directory) into the set-aside directory;
        the new path."""
        now_ms = wall_ms()
        kind = path.parent.name.replace("groups", "raft-groups")
        target = self.root / f"{now_ms}-{kind}-{path.name}"
        self.root.mkdir(exist_ok=True)
        os.rename(path, target)
        fsync_directory(path.parent)
        manifest = {
            "original": str(path.relative_to(self._data_dir)),
            "topic_id": topic_id,
            "partition": partition,
            "reason": reason,
            "set_aside_ms": now_ms,
        }
        target.with_name(target.name + ".json").write_text(json.dumps(manifest) + "\n")
        fsync_directory(self.root)
        _log.warning(
            "set aside %s as %s: %s; it is never opened as a replica nor deleted: move it "
            "back or delete it (GET /v1/storage/set-aside lists it)",
            path,
            target,
            reason,
        )
        return target

    def report(self) -> dict[str, Any]:
        """`{"data_dir", "set_aside": [...]}`: each entry's path, size and manifest."""
        entries: list[dict[str, Any]] = []
        names = sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.exists() else []
        for path in names[:SET_ASIDE_LISTED_MAX]:
            try:
                manifest = json.loads(path.with_name(path.name + ".json").read_text())
            except (OSError, ValueError):
                manifest = {}
            entries.append(
                {
                    "path": str(path),
                    "bytes": _size_bytes(path),
                    "original": manifest.get("original"),
                    "topic_id": manifest.get("topic_id"),
                    "partition": manifest.get("partition"),
                    "reason": manifest.get("reason"),
                    "set_aside_ms": manifest.get("set_aside_ms"),
                }
            )
        return {
            "data_dir": str(self._data_dir),
            "set_aside": entries,
            "truncated": len(names) > SET_ASIDE_LISTED_MAX,
        }
