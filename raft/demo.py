"""A test and benchmark harness: one process = one node hosting N groups of a tiny state machine.

    python -m raft.demo --node-id n1 --peers n1=127.0.0.11:9090,n2=...,n3=... \\
        --data-dir DIR --groups 3 [--durability fsync|none] [--stock]
        [--heartbeat-s S --election-min-s S --election-max-s S --follower-tick-s S]

It prints `{"event": "ready", ...}` on stdout, then answers JSON requests read from stdin,
one per line, each with an "id" echoed in its answer (requests run concurrently):

    {"id": 1, "op": "propose", "group": 0, "value": "text", "timeout": 5}
        -> {"id": 1, "ok": true, "result": <position of the value in the group's list>}
        or {"id": 1, "ok": false, "error": "NotLeader", "message": "..."}
    {"id": 2, "op": "state", "group": 0}     -> count, digest, values (if kept) and status
    {"id": 3, "op": "states"}               -> count, digest and status of every group
    {"id": 4, "op": "threads"}              -> threads of this process (/proc/self/task)
    {"id": 5, "op": "load", "group": 0, "size": 1024, "concurrency": 256, "seconds": 3}
        -> commands and bytes committed with that many proposals in flight
    {"id": 6, "op": "latency", "group": 0, "size": 1024, "count": 500}
        -> commit latencies of proposals made one at a time, in ms
    {"id": 7, "op": "propose_many", "group": 0, "prefix": "a-", "count": 100, "concurrency": 8}
        -> the values ("a-0", "a-1", ...) whose proposals were acknowledged
    {"id": 8, "op": "propose_stream", ...same fields...}
        -> as propose_many, and {"event": "acked", "value": ...} as each one is acknowledged
    {"id": 9, "op": "stats"}                -> rounds, ticks, syncs and network counters

`--stock` runs one plain pysyncobj SyncObj instead (pysyncobj's TCPTransport, default
SyncObjConf plus its file journal, its own tick thread): the benchmark's baseline.

The state machine (`ListMachine`) appends each command to a list and returns its position;
its digest is a running CRC-32C of every command, so replicas can be compared cheaply.
Only the test harness uses this module; the broker hosts its own state machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

import crc32c
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from raft import safe_pickle
from raft.config import RaftConfig
from raft.errors import RaftError
from raft.node import RaftNode, Replica

VALUES_KEPT_MAX = 1_000_000  # ListMachine keeps values only up to this count (tests)


class ListMachine:
    """Appends commands to a list; apply returns the position. Deterministic."""

    def __init__(self, keep_values: bool = True) -> None:
        self.count = 0
        self.digest = 0
        self.values: list[bytes] = []
        self.keep_values = keep_values

    def apply(self, command: bytes) -> int:
        position = self.count
        self.count += 1
        self.digest = crc32c.crc32c(command, self.digest)
        if self.keep_values and len(self.values) < VALUES_KEPT_MAX:
            self.values.append(command)
        return position

    def snapshot(self) -> bytes:
        return pickle.dumps((self.count, self.digest, self.values))

    def restore(self, snapshot: bytes) -> None:
        # The snapshot is this machine's own (from its disk, or the leader's after the
        # hello's HMAC): still only through the restricted unpickler, which admits no
        # global at all for these plain tuples, lists and bytes.
        self.count, self.digest, self.values = safe_pickle.loads(snapshot)

    def describe(self, with_values: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count, "digest": self.digest}
        if with_values:
            out["values"] = [v.decode("utf-8", "replace") for v in self.values]
        return out


class _StockSyncObj(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped
    def __init__(self, machine: ListMachine, *args: Any, **kwargs: Any) -> None:
        self._machine = machine
        super().__init__(*args, **kwargs)

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, command: bytes) -> int:
        return self._machine.apply(command)


class StockGroup:
    """The baseline: stock pysyncobj, adapted to the same propose() shape."""

    def __init__(self, node_id: str, peers: dict[str, str], data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.machine = ListMachine(keep_values=False)
        self.node_id = node_id
        self.syncobj = _StockSyncObj(
            self.machine,
            peers[node_id],
            [address for peer, address in peers.items() if peer != node_id],
            # Defaults, plus the journal, and bindAddress: stock pysyncobj would bind
            # 0.0.0.0:port, and the three nodes share a port on different addresses.
            SyncObjConf(journalFile=str(data_dir / "journal"), bindAddress=peers[node_id]),
        )

    async def propose(self, command: bytes, *, timeout_s: float | None = None) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def done(result: Any, error: int) -> None:
            loop.call_soon_threadsafe(_resolve, future, result, error)

        self.syncobj.apply_command(command, callback=done)
        return await asyncio.wait_for(future, timeout_s or 10.0)

    def status(self) -> dict[str, Any]:
        leader = self.syncobj._getLeader()
        return {"is_leader": bool(self.syncobj._isLeader()), "leader_id": str(leader or "")}


def _resolve(future: asyncio.Future[Any], result: Any, error: int) -> None:
    if future.done():
        return
    if error == FAIL_REASON.SUCCESS:
        future.set_result(result)
    else:
        future.set_exception(RaftError(f"pysyncobj FAIL_REASON {error}"))


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.peers = dict(item.split("=", 1) for item in args.peers.split(","))
        self.machines: dict[int, ListMachine] = {}
        self.replicas: dict[int, Replica | StockGroup] = {}
        self.node: RaftNode | None = None

    async def start(self) -> None:
        data_dir = Path(self.args.data_dir)
        if self.args.stock:
            group = StockGroup(self.args.node_id, self.peers, data_dir)
            self.replicas[0] = group
            self.machines[0] = group.machine
            return
        default = RaftConfig()
        args = self.args
        config = RaftConfig(
            durability=args.durability,
            log_compaction_min_entries=args.compaction_entries,
            # Timing overrides (bench.raft_bench's idle mode compares candidate settings).
            heartbeat_interval_s=args.heartbeat_s or default.heartbeat_interval_s,
            election_timeout_min_s=args.election_min_s or default.election_timeout_min_s,
            election_timeout_max_s=args.election_max_s or default.election_timeout_max_s,
            follower_tick_interval_s=args.follower_tick_s or default.follower_tick_interval_s,
            leader_step_down_s=args.step_down_s or default.leader_step_down_s,
        )
        node = RaftNode(
            self.args.node_id,
            self.peers,
            data_dir,
            config,
            durable_trace=self.args.durable_trace,
        )
        for group_id in range(self.args.groups):
            machine = ListMachine(keep_values=not self.args.no_values)
            self.machines[group_id] = machine
            self.replicas[group_id] = await node.add_group(group_id, machine)
        await node.start()
        self.node = node

    async def stop(self) -> None:
        if self.node is not None:
            await self.node.stop()
        for replica in self.replicas.values():
            if isinstance(replica, StockGroup):
                replica.syncobj.destroy()

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "propose":
            replica = self.replicas[request.get("group", 0)]
            value = request["value"].encode()
            result = await replica.propose(value, timeout_s=request.get("timeout", 10.0))
            return {"result": result}
        if op == "state":
            group_id = request.get("group", 0)
            return self._state(group_id, with_values=request.get("values", True))
        if op == "states":
            return {"groups": {str(g): self._state(g, False) for g in self.replicas}}
        if op == "threads":
            return {
                "threads": threading.active_count(),
                "tasks": len(os.listdir("/proc/self/task")),
                "node_threads": self.node.thread_count() if self.node else None,
                "fds": len(os.listdir("/proc/self/fd")),
            }
        if op == "load":
            return await self._load(request)
        if op == "latency":
            return await self._latency(request)
        if op in ("propose_many", "propose_stream"):
            return await self._propose_many(request, stream=op == "propose_stream")
        if op == "stats":
            return self._stats()
        raise ValueError(f"unknown op {op!r}")

    def raft_replicas(self) -> list[Replica]:
        return [r for r in self.replicas.values() if isinstance(r, Replica)]

    def _state(self, group_id: int, with_values: bool) -> dict[str, Any]:
        replica = self.replicas[group_id]
        out = self.machines[group_id].describe(with_values)
        if isinstance(replica, Replica):
            status = replica.status()
            out.update(
                is_leader=status.is_leader,
                leader_id=status.leader_id,
                term=status.term,
                commit_index=status.commit_index,
                last_applied=status.last_applied,
                journal_entries=status.journal_entries,
                journal_memory_bytes=replica.journal.memory_bytes,
                snapshots_written=replica.snapshots_written,
                snapshots_restored=replica.snapshots_restored,
            )
        else:
            out.update(replica.status())
        return out

    def _stats(self) -> dict[str, Any]:
        if self.node is None:
            return {}
        stats = self.node.network.stats
        return {
            "rounds": self.node.rounds,
            "ticks": self.node.ticks,
            "syncs": self.node.syncs,
            "frames_sent": stats.frames_sent,
            "frames_received": stats.frames_received,
            "bytes_sent": stats.bytes_sent,
            "frames_dropped_full": stats.frames_dropped_full,
            "frames_dropped_down": stats.frames_dropped_down,
            "pings_sent": stats.pings_sent,
            # Read from the event loop while the tick thread may change it: a snapshot.
            "quiesced": sum(isinstance(r, Replica) and r.quiesced for r in self.replicas.values()),
        }

    async def _load(self, request: dict[str, Any]) -> dict[str, Any]:
        replica = self.replicas[request.get("group", 0)]
        size, concurrency = int(request["size"]), int(request["concurrency"])
        seconds = float(request["seconds"])
        # A distinct object per proposal: pickle would store one copy of a repeated object.
        pool = os.urandom(size + 4096)
        committed = 0
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + seconds

        async def worker() -> None:
            nonlocal committed
            while loop.time() < deadline:
                start = committed % 4096
                await replica.propose(pool[start : start + size], timeout_s=30.0)
                committed += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = loop.time() - started
        return {"commands": committed, "bytes": committed * size, "seconds": elapsed}

    async def _propose_many(self, request: dict[str, Any], stream: bool) -> dict[str, Any]:
        """Propose prefix0, prefix1, ... with `concurrency` in flight; list the acknowledged.

        With stream=True each acknowledgement is also written at once as an event line.
        """
        replica = self.replicas[request.get("group", 0)]
        prefix, timeout_s = request["prefix"], float(request.get("timeout", 5.0))
        numbers = iter(range(int(request["count"])))
        acked: list[str] = []
        failed = 0

        async def worker() -> None:
            nonlocal failed
            for k in numbers:
                value = f"{prefix}{k}"
                try:
                    await replica.propose(value.encode(), timeout_s=timeout_s)
                except RaftError:
                    failed += 1
                    continue
                acked.append(value)
                if stream:
                    _emit({"event": "acked", "value": value})

        await asyncio.gather(*(worker() for _ in range(int(request["concurrency"]))))
        return {"acked": acked, "failed": failed}

    async def _latency(self, request: dict[str, Any]) -> dict[str, Any]:
        replica = self.replicas[request.get("group", 0)]
        size, count = int(request["size"]), int(request["count"])
        interval_s = float(request.get("interval_s", 0.0))
        payload = os.urandom(size)
        latencies: list[float] = []
        for _ in range(count):
            started = time.perf_counter()
            await replica.propose(payload, timeout_s=30.0)
            latencies.append((time.perf_counter() - started) * 1000.0)
            if interval_s:
                await asyncio.sleep(interval_s)
        return {"latencies_ms": latencies}


async def _serve(args: argparse.Namespace) -> None:
    demo = Demo(args)
    if args.slow_follower_sync_ms:
        # Followers' entries stay written-but-not-durable for this long, the leader's not:
        # a follower reply that left before its sync would let the leader acknowledge a
        # command that a power cut then takes from every follower (the power-loss test).
        _slow_down_follower_fdatasync(demo, args.slow_follower_sync_ms / 1000.0)
    await demo.start()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    _emit({"event": "ready", "node_id": args.node_id, "pid": os.getpid()})
    tasks: set[asyncio.Task[None]] = set()
    while line := await reader.readline():
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("op") == "exit":
            break
        task = asyncio.create_task(_answer(demo, request))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in list(tasks):
        task.cancel()
    await demo.stop()


async def _answer(demo: Demo, request: dict[str, Any]) -> None:
    try:
        answer = {"id": request.get("id"), "ok": True, **(await demo.handle(request))}
    except Exception as error:
        answer = {
            "id": request.get("id"),
            "ok": False,
            "error": type(error).__name__,
            "message": str(error),
        }
    _emit(answer)


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m raft.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--peers", required=True, help="n1=host:port,n2=host:port,...")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--durability", choices=("fsync", "none"), default="fsync")
    parser.add_argument("--stock", action="store_true", help="stock pysyncobj baseline")
    parser.add_argument("--no-values", action="store_true", help="keep counts, not values")
    parser.add_argument("--durable-trace", action="store_true", help="power-loss test hook")
    parser.add_argument(
        "--slow-follower-sync-ms",
        type=float,
        default=0.0,
        help="fault injection: on a node that leads no group, fdatasync first sleeps this long",
    )
    parser.add_argument(
        "--compaction-entries",
        type=int,
        default=RaftConfig().log_compaction_min_entries,
        help="log compaction threshold (small values exercise snapshots)",
    )
    for option, field in _TIMING_OPTIONS.items():
        parser.add_argument(option, type=float, default=None, help=f"RaftConfig.{field}")
    return parser.parse_args(argv)


_TIMING_OPTIONS = {
    "--heartbeat-s": "heartbeat_interval_s",
    "--election-min-s": "election_timeout_min_s",
    "--election-max-s": "election_timeout_max_s",
    "--follower-tick-s": "follower_tick_interval_s",
    "--step-down-s": "leader_step_down_s",
}


def _slow_down_follower_fdatasync(demo: Demo, delay_s: float) -> None:
    real_fdatasync = os.fdatasync

    def slow_fdatasync(fd: Any) -> None:
        # Runs on the tick thread, which is also the one that updates the statuses.
        if not any(replica.status().is_leader for replica in demo.raft_replicas()):
            time.sleep(delay_s)
        real_fdatasync(fd)

    os.fdatasync = slow_fdatasync


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
