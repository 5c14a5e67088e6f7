"""Test support: a cluster of real `python -m raft.demo` node processes on loopback.

Each node gets its own loopback address (127.0.0.11, .12, ...) and the same port, as the
fault harness will; `RaftCluster` starts them, talks to each over its stdin/stdout JSON
protocol (see raft/demo.py) from one reader thread per process, and on `close()` kills
every process it started, so a failing test leaves nothing running.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.loopback import common_free_port as free_port_on  # re-exported for tests/raft

ROOT = Path(__file__).resolve().parents[2]
FIRST_HOST = 11  # node k listens on 127.0.0.(11 + k)


class Register:
    """The smallest state machine: the last command applied (for in-process RaftNodes)."""

    def __init__(self) -> None:
        self.value = b""

    def apply(self, command: bytes) -> bytes:
        self.value = command
        return command

    def snapshot(self) -> bytes:
        return self.value

    def restore(self, snapshot: bytes) -> None:
        self.value = snapshot


class RequestFailed(Exception):
    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(f"{answer.get('error')}: {answer.get('message')}")
        self.error = answer.get("error")


class NodeProcess:
    """One demo node process and the answers it writes on stdout."""

    def __init__(self, node_id: str, args: list[str], log_path: Path) -> None:
        self.node_id = node_id
        self.args = args
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self._answers: dict[Any, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None
        self.acked: list[str] = []  # values from {"event": "acked"} lines (propose_stream)

    def start(self, timeout_s: float = 20.0) -> NodeProcess:
        log = open(self.log_path, "a")  # noqa: SIM115 - handed to the child
        self._ready.clear()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raft.demo", *self.args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            bufsize=1,
        )
        log.close()
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"{self.node_id} not ready:\n{self.log()}")
        return self

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            if message.get("event") == "ready":
                self._ready.set()
                continue
            if message.get("event") == "acked":
                self.acked.append(message["value"])
                continue
            with self._lock:
                box = self._answers.get(message.get("id"))
            if box is not None:
                box.put(message)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def request(self, op: str, timeout_s: float = 15.0, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its answer; raise RequestFailed if ok is false."""
        assert self.proc is not None and self.proc.stdin is not None
        request_id = next(self._ids)
        box: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._answers[request_id] = box
        try:
            self.proc.stdin.write(json.dumps({"id": request_id, "op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            answer = box.get(timeout=timeout_s)
        finally:
            with self._lock:
                self._answers.pop(request_id, None)
        if not answer.get("ok"):
            raise RequestFailed(answer)
        return answer

    def send_only(self, op: str, **fields: Any) -> None:
        """Send a request whose answer nobody waits for (the node may be killed first)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": f"x{next(self._ids)}", "op": op, **fields}) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is flushed or closed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close_pipes()

    def stop(self) -> None:
        """Ask the node to exit cleanly; kill it if it does not within 5 s."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self._close_pipes()

    def _close_pipes(self) -> None:
        if self.proc is None:
            return
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):  # broken pipe: the process is gone
                self.proc.stdin.close()
        if self._reader is not None:
            self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return ""


class RaftCluster:
    """n demo nodes on 127.0.0.11.. with one shared port; close() kills them all."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        nodes: int = 3,
        groups: int = 1,
        extra_args: list[str] | None = None,
    ) -> None:
        self.node_ids = [f"n{k + 1}" for k in range(nodes)]
        hosts = [f"127.0.0.{FIRST_HOST + k}" for k in range(nodes)]
        port = free_port_on(hosts)
        self.peers = {
            node: f"{host}:{port}" for node, host in zip(self.node_ids, hosts, strict=True)
        }
        peers_arg = ",".join(f"{node}={address}" for node, address in self.peers.items())
        self.tmp_path = tmp_path
        self.nodes: dict[str, NodeProcess] = {}
        for node_id in self.node_ids:
            args = [
                "--node-id", node_id, "--peers", peers_arg,
                "--data-dir", str(tmp_path / node_id), "--groups", str(groups),
                *(extra_args or []),
            ]  # fmt: skip
            self.nodes[node_id] = NodeProcess(node_id, args, tmp_path / f"{node_id}.log")

    def start(self) -> RaftCluster:
        for node in self.nodes.values():
            node.start()
        return self

    def close(self) -> None:
        for node in self.nodes.values():
            node.stop()
        for node in self.nodes.values():
            node.kill()

    def __enter__(self) -> RaftCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def kill_all(self) -> None:
        """SIGKILL every node at once (then reap them), as a power cut would stop them."""
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
        for node in self.nodes.values():
            node.kill()

    def live(self) -> list[NodeProcess]:
        return [node for node in self.nodes.values() if node.alive]

    def leader(self, group: int = 0, timeout_s: float = 10.0) -> NodeProcess:
        """The live node that says it leads `group` and that the other live nodes follow."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = {n.node_id: n.request("state", group=group, values=False) for n in self.live()}
            leaders = [node_id for node_id, state in states.items() if state["is_leader"]]
            if len(leaders) == 1 and all(s["leader_id"] == leaders[0] for s in states.values()):
                return self.nodes[leaders[0]]
            time.sleep(0.05)
        raise AssertionError(f"no single leader for group {group} within {timeout_s}s")

    def propose(self, node: NodeProcess, value: str, group: int = 0, timeout_s: float = 5.0) -> int:
        answer = node.request(
            "propose", timeout_s=timeout_s + 5, group=group, value=value, timeout=timeout_s
        )
        return int(answer["result"])

    def wait_converged(self, group: int = 0, timeout_s: float = 10.0) -> dict[str, Any]:
        """Wait until every live node applied the same values; return one node's state."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            states = {n.node_id: n.request("state", group=group) for n in self.live()}
            digests = {(s["count"], s["digest"]) for s in states.values()}
            if len(digests) == 1:
                return next(iter(states.values()))
            time.sleep(0.05)
        summary = {k: (v["count"], v["digest"]) for k, v in states.items()}
        raise AssertionError(f"group {group} did not converge: {summary}")


def task_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def wait_until_async(condition: Any, timeout_s: float, what: str) -> float:
    """Poll `condition` every 20 ms (on the event loop) until true; the seconds it took."""
    import asyncio

    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, what
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def ready_leader(replicas: dict[str, Any]) -> str | None:
    """The one node whose replica leads and applied its election no-op, if exactly one."""
    leaders = [n for n, r in replicas.items() if r.status().is_leader and r.status().leader_ready]
    return leaders[0] if len(leaders) == 1 else None


class InProcessCluster:
    """RaftNodes in this process on loopback (one address each), with links that tests cut.

    `cut(a, b)` drops every frame between nodes a and b, both ways, at the receiver, before
    node liveness sees it (the TCP connections stay up, as in a partition that loses
    packets rather than resetting connections); `heal(a, b)` lets them through again.
    """

    def __init__(self, tmp_path: Path, size: int = 3, config: Any = None) -> None:
        from raft import RaftNode  # raft_harness is also used by tests without raft nodes

        hosts = [f"127.0.0.{11 + k}" for k in range(size)]
        port = free_port_on(hosts)
        self.peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}
        self.nodes = {n: RaftNode(n, self.peers, tmp_path / n, config) for n in self.peers}
        self.cuts: set[frozenset[str]] = set()
        for name, node in self.nodes.items():
            node.network._dispatch = self._filtered(name, node.network._dispatch)

    def _filtered(self, name: str, dispatch: Any) -> Any:
        def filtered(conn: Any) -> None:
            if conn.peer_id is not None and frozenset((name, conn.peer_id)) in self.cuts:
                for _ in conn.decoder.views():
                    pass  # lost on the way
                return
            dispatch(conn)

        return filtered

    def cut(self, a: str, b: str) -> None:
        self.cuts.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        self.cuts.discard(frozenset((a, b)))

    async def add_group(self, group_id: int) -> dict[str, Any]:
        return {n: await node.add_group(group_id, Register()) for n, node in self.nodes.items()}

    async def start(self) -> None:
        for node in self.nodes.values():
            await node.start()

    async def start_group(self, group_id: int) -> tuple[dict[str, Any], str]:
        """Add group `group_id` on every node, start them, wait for a ready leader:
        (replicas by node, the leader's node)."""
        replicas = await self.add_group(group_id)
        await self.start()
        await wait_until_async(lambda: ready_leader(replicas) is not None, 10, "no leader")
        return replicas, str(ready_leader(replicas))

    async def stop(self) -> None:
        for node in self.nodes.values():
            await node.stop()
