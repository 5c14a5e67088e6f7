"""Faults: partitions (iptables), kill -9 and restart, SIGSTOP/SIGCONT, power loss.

Partitions are DROP rules in an iptables chain of this run's own (`DMQJ-<pid>-<n>`),
jumped to from INPUT (loopback packets pass OUTPUT then INPUT, so one hook sees both
directions). Every rule matches the two hosts *and* this cluster's ports (source or
destination: the Raft and HTTP listeners), so other clusters on the same loopback
addresses, and the clients on 127.0.0.1, keep their traffic. The chain is removed by
`close()` (the runner calls it in `finally`, also on Ctrl-C), and chains left by a
harness process that no longer exists are removed at start.

A power loss kills every broker (-9) and cuts each Raft journal and segment file back to
the last length the broker recorded as flushed (DMQ_DURABLE_TRACE=1, see
tests/cluster/test_cluster_power_loss.py): exactly what a power cut may drop.

A reassignment (`reassign`) asks for a partition to move (`POST /v1/cluster/reassignments`)
to a rotated replica set: with as many nodes as replicas, the same brokers with the next
one first (a preferred-leader change: the brokers' leader balancing then moves the
leadership there, dmq's public way to transfer a leader); with more nodes, every replica
shifted to the next node (replicas added, caught up, leadership moved, replicas removed,
raft/README.md "Cluster operations"). It runs on its own, in the metadata group, while the
other faults strike; nothing is undone at its stop.

Membership (`join`, `leave`): a join starts the next node (its own loopback address) with
`dmq serve --join <live brokers' URLs, a random one first>` and a fresh data directory
(the joiner asks them in turn until one answers); it is a broker of the
cluster at once (clients and faults use it) and the join ends when the catalogue lists it
and it is ready. A leave decommissions a registered broker that is not a metadata voter
(`POST /v1/cluster/brokers/{id}/decommission`, the voters read from `GET /v1/cluster`
each time), polls until the catalogue no longer lists it (its replicas moved away and it
unregistered), then stops it (SIGTERM) and deletes its data directory. Both run in a
thread of their own across fault windows (a leave cut off by a partition finishes after
healing: `settle` waits for them); a 4xx refusal (too few brokers would stay) ends the
leave as `refused`, except 409 `operation_conflict` (a metadata voter change runs: the
broker says to wait for it), after which the leave asks again. At most `nodes + MEMBERSHIP_EXTRA_MAX` brokers at once, one join or
leave per node at a time. `self.lock` serialises process actions (faults, heals, a
departing broker's stop) so a heal never restarts a broker that just left.

An upgrade (`upgrade`) stops one broker gracefully and heals by starting it on the other
release: this tree's go back to 0.1.0 (a worktree of git history), 0.1.0's come forward;
before a strike, sometimes, while no broker runs 0.1.0, it finalizes the feature level,
after which every restart is on this tree (jepsen/upgrade.py).

Metadata voter changes (`voters`): from the recorded voter set, 3 -> 5 (two live
registered non-voters added) or 5 -> 3 (two voters dropped, half the time the metadata
leader among them), `POST /v1/cluster/metadata-voters`; a 4xx (409: a change runs) is a
recorded no-op; then, in a thread like a leave, the newest catalogue's operations doc is
polled until `metadata_voters.target` is null. With `voters` on, a leave may pick a
metadata voter too (the broker swaps it for a live non-voter first), never leaving fewer
than BROKERS_MIN registered brokers.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from jepsen import diskfull
from jepsen.cluster import Broker, Cluster, HarnessError, http
from jepsen.focus import Aim, Focus
from jepsen.history import NEMESIS, History
from jepsen.schedule import variants
from jepsen.upgrade import Releases

FAULTS = (
    "partition", "kill", "pause", "power", "disk", "clock", "disk-full", "upgrade",
    "reassign", "join", "leave", "voters",
)  # fmt: skip
# Run on their own while a process or network fault strikes (never alone, never with power).
MEMBERSHIP = ("join", "leave", "voters")  # each ends in a thread of its own (settle)
BACKGROUND = ("reassign", *MEMBERSHIP)
VOTERS_SMALL = 3  # the voters nemesis alternates between these metadata voter counts
VOTERS_LARGE = 5
BROKERS_MIN = 3  # a leave never takes the registered brokers below this
MEMBERSHIP_EXTRA_MAX = 2  # brokers beyond --nodes at once
MEMBERSHIP_POLL_S = 0.5
PIN_LEAD_S = 0.5  # for the pinned workers to reach their node before it is cut off or paused
SETTLE_WAIT_S = 150.0  # after healing, for joins and leaves in flight to end
CHAIN_PREFIX = "DMQJ-"
# The brokers' file names and trace format (raft/journal.py, log/segment.py); jepsen/ may
# not import those layers, tests/jepsen checks the copies.
JOURNAL_FILE = "journal"
JOURNAL_TRACE_FILE = "journal.durable"
JOURNAL_HEADER_BYTES = 16
SEGMENT_TRACE_SUFFIX = ".durable"
# The clock nemesis: Debian's libfaketime (`apt-get install faketime`) preloaded in every
# broker, its offset read from a file the nemesis rewrites (checked at most once a second).
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
CLOCK_JUMP_S = (60.0, 3600.0)  # the size of a jump, either way

_chains = itertools.count()


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True)
    except FileNotFoundError as error:
        raise HarnessError("iptables is not installed (make system-deps)") from error
    if check and done.returncode != 0:
        raise HarnessError(f"iptables {' '.join(args)}: {done.stderr.strip()}")
    return done


def _remove_chain(chain: str) -> None:
    while _iptables("-D", "INPUT", "-j", chain, check=False).returncode == 0:
        pass
    _iptables("-F", chain, check=False)
    _iptables("-X", chain, check=False)


def remove_stale_chains() -> list[str]:
    """Remove chains whose harness process is gone (a run killed hard); return them."""
    listing = _iptables("-S").stdout
    stale = []
    for match in re.finditer(rf"^-N ({CHAIN_PREFIX}(\d+)-\d+)$", listing, re.M):
        chain, pid = match.group(1), int(match.group(2))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove_chain(chain)
            stale.append(chain)
        except PermissionError:
            pass  # someone else's live process
    return stale


class Net:
    """This run's iptables chain: cut and heal links between brokers' hosts."""

    def __init__(self, ports: tuple[int, ...]) -> None:
        self.ports = ",".join(str(p) for p in ports)
        self.chain = f"{CHAIN_PREFIX}{os.getpid()}-{next(_chains)}"
        self.created = False

    def setup(self) -> None:
        remove_stale_chains()
        _iptables("-N", self.chain)
        self.created = True
        _iptables("-I", "INPUT", "-j", self.chain)

    def cut(self, a: str, b: str) -> None:
        for src, dst in ((a, b), (b, a)):
            _iptables(
                "-A", self.chain, "-s", src, "-d", dst, "-p", "tcp",
                "-m", "multiport", "--ports", self.ports, "-j", "DROP",
            )  # fmt: skip

    def heal(self) -> None:
        if self.created:
            _iptables("-F", self.chain)

    def close(self) -> None:
        if self.created:
            _remove_chain(self.chain)
            self.created = False


def _last_traced(trace: Path, default: int, size: int) -> int:
    """The last durable length a trace records; after a journal rewrite only later lines
    describe the file (a rewritten journal was synced whole)."""
    lines = trace.read_text().split() if trace.exists() else []
    if "rewrite" in lines:
        lines = lines[len(lines) - lines[::-1].index("rewrite") :]
        default = size
    return min(int(lines[-1]) if lines else default, size)


def cut_to_durable(data_dir: Path, torn: random.Random | None = None) -> int:
    """Truncate every journal and segment to its last traced durable length; bytes cut.
    With `torn`, each file is cut at a length drawn in [durable, size] instead: a power
    loss that persisted part of what was not synced yet, ending mid-record (a torn
    write, which recovery must find and truncate)."""
    cut = 0
    files = [
        (j, j.with_name(JOURNAL_TRACE_FILE), JOURNAL_HEADER_BYTES)
        for j in data_dir.glob(f"raft/groups/*/{JOURNAL_FILE}")
    ] + [
        (s, s.with_name(s.name + SEGMENT_TRACE_SUFFIX), 0)
        for s in data_dir.glob("partitions/*/*.log")
    ]
    for path, trace, default in files:
        size = path.stat().st_size
        durable = _last_traced(trace, default, size)
        if torn is not None:
            durable = torn.randint(durable, size)
        os.truncate(path, durable)
        cut += size - durable
    return cut


class Catalogue(NamedTuple):
    """What a leave or join reads of the cluster (GET /v1/cluster, /v1/cluster/operations)."""

    version: int  # metadata_version
    registered: set[str]
    leaving: set[str]  # brokers being decommissioned
    voters: list[str]
    voters_target: list[str] | None  # the metadata voter change running, if any
    operations: bool  # the operations doc answered (else leaving, target unknown)


@dataclass
class Fault:
    kind: str
    variant: str
    targets: list[str]
    start: float
    stop: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class Nemesis:
    """Starts and stops faults on a cluster, logging each in the history."""

    def __init__(
        self,
        cluster: Cluster,
        history: History,
        kinds: list[str],
        seed: int,
        topic: str,
        partitions: int,
        focus: Focus | None = None,
    ) -> None:
        unknown = set(kinds) - set(FAULTS)
        if unknown:
            raise HarnessError(f"unknown nemesis {sorted(unknown)}; known: {', '.join(FAULTS)}")
        self.cluster = cluster
        self.history = history
        self.kinds = kinds
        self.rng = random.Random(seed * 7919 + 1)
        self.topic = topic
        self.partitions = partitions
        self.net = Net(cluster.ports) if "partition" in kinds else None
        self.active: list[Fault] = []
        self.windows: list[Fault] = []
        self.lock = threading.RLock()
        self.max_brokers = len(cluster.brokers) + MEMBERSHIP_EXTRA_MAX
        self.moving: dict[str, threading.Thread] = {}  # node -> its join or leave
        self.settle_by = float("inf")  # monotonic deadline for joins and leaves
        self.closing = threading.Event()
        self._seeds = itertools.count(seed * 7919 + 2)
        self.focus = focus or Focus()
        self.mounted: list[Path] = []  # disk-full: the brokers' tmpfs (jepsen/diskfull.py)
        # upgrade: which release each broker runs, and the previous one's tree (upgrade.py)
        self.releases = Releases() if "upgrade" in kinds else None

    @property
    def ids(self) -> list[str]:
        return list(self.cluster.brokers)

    def setup(self) -> None:
        """Before the brokers start: the chain, and with `clock` each broker's clock file."""
        if self.net is not None:
            self.net.setup()
        if self.releases is not None:
            self.releases.setup()
        if "disk-full" in self.kinds:
            self.mounted = diskfull.mount_all(list(self.cluster.brokers.values()))
        if "clock" in self.kinds:
            if not FAKETIME_LIB.exists():
                raise HarnessError(
                    f"the clock nemesis needs {FAKETIME_LIB} (apt-get install faketime)"
                )
            for broker in self.cluster.brokers.values():
                self._fake_clock(broker)

    def _clock_file(self, node_id: str) -> Path:
        return self.cluster.directory / f"{node_id}.faketime"

    def _fake_clock(self, broker: Broker) -> None:
        """Start `broker` under libfaketime at offset 0. Only the wall clock moves
        (FAKETIME_DONT_FAKE_MONOTONIC): a real clock step (NTP, an operator, a resumed
        VM) moves CLOCK_REALTIME, never CLOCK_MONOTONIC, which Raft's timers, the read
        leases and asyncio run on; faking it would test a fault no kernel makes."""
        path = self._clock_file(broker.node_id)
        path.write_text("+0\n")
        broker.env = {
            **broker.env,
            "LD_PRELOAD": str(FAKETIME_LIB),
            "FAKETIME_TIMESTAMP_FILE": str(path),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_CACHE_DURATION": "1",
        }

    def close(self) -> None:
        self.closing.set()
        try:
            self.heal_all()
            for thread in list(self.moving.values()):
                thread.join(30)
        finally:
            if self.net is not None:
                self.net.close()
            diskfull.unmount_all(self.mounted)
            if self.releases is not None:  # its brokers stop before their tree goes
                for node_id in self.releases.old:
                    self.cluster.every[node_id].stop()
                self.releases.close()

    def _leaders(self) -> tuple[dict[int, str], str | None]:
        """One status read: the topic's partition -> leader (current brokers only) and
        the metadata leader."""
        status = self.cluster.status() or {}
        found: dict[int, str] = {}
        metadata = None
        for group in status.get("groups", []):
            leader = group.get("leader")
            if leader not in self.cluster.brokers:
                continue
            if group["topic"] is None:
                metadata = leader
            elif group["topic"] == self.topic:
                found[int(group["partition"])] = leader
        return found, metadata

    def _leader(self) -> str | None:
        """The leader of a partition drawn at random, if one is known."""
        part = self.rng.randrange(self.partitions)
        return self._leaders()[0].get(part)

    def _aimed(self, variant: str) -> str | None:
        """The node a leader variant aims at: a data partition's leader, or the
        metadata leader; None if no broker reports one."""
        if variant == "metadata-leader":
            return self._leaders()[1]
        return self._leader()

    def wait_leaders(self, timeout_s: float) -> float:
        """Before a window: wait (timeout_s at most) until every group reports a leader
        among the live brokers, so that a fault aimed at a leader finds one (after a kill
        or a power cut the brokers take seconds to serve again); the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s and not self.closing.is_set():
            live = {b.node_id for b in self.cluster.live()}
            groups = (self.cluster.status() or {}).get("groups", [])
            if groups and all(g.get("leader") in live for g in groups):
                break
            time.sleep(0.2)
        return time.monotonic() - started

    def start(self, faults: tuple[tuple[str, str], ...]) -> None:
        """Start a window's faults: (kind, variant) pairs from the schedule (a
        background kind's variant is "": it chooses at its start). Background kinds
        first: a leave or a voter change reads the catalogue, which a kill of every
        broker in the same window would deny it."""
        ordered = sorted(faults, key=lambda f: f[0] not in BACKGROUND)  # stable
        with self.lock:
            for kind, variant in ordered:
                if kind in BACKGROUND:
                    getattr(self, f"_start_{kind}")()
                else:
                    getattr(self, f"_start_{kind.replace('-', '_')}")(variant)

    def _pin(self, nodes: list[str]) -> dict[str, Any]:
        """Aim the pinned workers at `nodes` (the side about to be cut off or paused),
        sending to the partitions they lead now, and give them PIN_LEAD_S to get there
        (their operation in flight ends first); the fault's detail to record."""
        led = tuple(sorted(p for p, n in self._leaders()[0].items() if n in nodes))
        self.focus.strike(Aim(tuple(nodes), led))
        time.sleep(PIN_LEAD_S)
        return {"pinned": nodes, "pinned_partitions": list(led)}

    def _record(self, fault: Fault, f: str) -> None:
        value = {
            "kind": fault.kind,
            "variant": fault.variant,
            "targets": fault.targets,
            **fault.detail,
        }
        self.history.add(NEMESIS, "info", f, None, value)

    def _begin(self, kind: str, variant: str, targets: list[str], **detail: Any) -> Fault:
        """A fault's window: in `windows` (reports) and in `active` (heals)."""
        fault = self._begin_background(kind, variant, targets, **detail)
        self.active.append(fault)
        return fault

    def _begin_background(
        self, kind: str, variant: str, targets: list[str], **detail: Any
    ) -> Fault:
        """A join or leave's window: in `windows` (reports), not in `active` (heals)."""
        fault = Fault(kind, variant, targets, self.history.now(), detail=detail)
        self.windows.append(fault)
        self._record(fault, f"start-{kind}")
        return fault

    def _stop(self, fault: Fault) -> None:
        fault.stop = self.history.now()
        self._record(fault, f"stop-{fault.kind}")

    # --- partitions -----------------------------------------------------------------

    def _grudge(self, variant: str) -> tuple[list[list[str]], list[str]]:
        """Links to cut, and the nodes the variant is about."""
        ids = self.ids
        n = len(ids)
        shuffled = self.rng.sample(ids, n)
        if variant in ("one", "leader", "metadata-leader"):
            if variant == "one":
                alone = shuffled[0]
            else:
                found = self._aimed(variant)
                alone = found if found in ids else shuffled[0]
            return [[alone, other] for other in ids if other != alone], [alone]
        if variant in ("majority-minority", "minority-leader"):
            minority = shuffled[: (n - 1) // 2]
            leader = self._aimed(variant) if variant == "minority-leader" else None
            if leader in ids and leader not in minority:
                minority = [leader, *minority[:-1]]
            return [[a, b] for a in minority for b in ids if b not in minority], minority
        if variant == "ring":  # each node sees its two ring neighbours: a majority of 5
            return [
                [shuffled[i], shuffled[j]]
                for i in range(n)
                for j in range(i + 1, n)
                if (j - i) % n not in (1, n - 1)
            ], shuffled
        # bridge: two halves that only the middle node links
        half = (n - 1) // 2
        left, bridge, right = shuffled[:half], shuffled[half], shuffled[half + 1 :]
        return [[a, b] for a in left for b in right], [bridge]

    def _variant(self, kind: str, variant: str) -> str:
        """The schedule's variant, or one drawn here if it does not apply to the
        brokers there are now (joins and leaves change their number)."""
        allowed = variants(kind, len(self.ids))
        return variant if variant in allowed else self.rng.choice(allowed)

    def _start_partition(self, variant: str = "") -> None:
        assert self.net is not None
        variant = self._variant("partition", variant)
        cuts, about = self._grudge(variant)
        pinned = {} if variant in ("bridge", "ring") else self._pin(about)  # the cut-off side
        for a, b in cuts:
            self.net.cut(self.cluster.hosts[a], self.cluster.hosts[b])
        self._begin("partition", variant, about, cuts=cuts, **pinned)
        self.focus.strike(None)

    # --- processes ------------------------------------------------------------------

    def _pick(self, variant: str, candidates: list[str]) -> list[str]:
        if variant == "all":
            return candidates
        if variant in ("leader", "metadata-leader"):
            leader = self._aimed(variant)
            return [leader] if leader in candidates else candidates[:1]
        k = 1 if variant == "one" else (len(self.ids) - 1) // 2
        if variant == "minority-leader":
            leader = self._aimed(variant)
            if leader in candidates:
                rest = [c for c in candidates if c != leader]
                return [leader, *self.rng.sample(rest, min(k - 1, len(rest)))]
        return self.rng.sample(candidates, min(k, len(candidates)))

    def _free(self) -> list[str]:
        """Nodes no other active process fault holds, nor the aim of this window's other
        fault (a cut-off leader killed at once would acknowledge nothing meanwhile)."""
        held = {
            t
            for f in self.active
            if f.kind in ("kill", "pause", "power", "disk", "disk-full", "upgrade")
            for t in f.targets
        }
        aim = self.focus.aim
        held |= set(aim.nodes if aim is not None else ())
        return [i for i in self.ids if i not in held and self.cluster.brokers[i].alive]

    def _start_kill(self, variant: str = "") -> None:
        variant = self._variant("kill", variant)
        targets = self._pick(variant, self._free())
        for node_id in targets:
            self.cluster.brokers[node_id].kill9()
        self._begin("kill", variant, targets)
        self.focus.strike(None)

    def _start_upgrade(self, variant: str = "") -> None:
        """Maybe finalize first; then stop brokers (SIGTERM) that the heal starts on the
        other release, or on this tree once finalized (jepsen/upgrade.py)."""
        assert self.releases is not None
        variant = self._variant("upgrade", variant)
        urls = [b.url for b in self.cluster.brokers.values() if b.alive]
        finalized = self.releases.maybe_finalize(self.rng, urls) or {}
        free = self._free()
        # A broker on the old release comes forward first, as an operator ends a rollback
        # before touching another broker: every run goes both ways.
        back = [node_id for node_id in free if node_id in self.releases.old][:1]
        targets = back or self._pick(variant, free)
        releases: dict[str, str] = {}
        for node_id in targets:
            self.cluster.brokers[node_id].stop()
            releases[node_id] = self.releases.flip(self.cluster.brokers[node_id])
        self._begin("upgrade", variant, targets, releases=releases, **finalized)
        self.focus.strike(None)

    def _start_pause(self, variant: str = "") -> None:
        """SIGSTOP; the pinned workers' requests wait on the paused nodes and are
        answered the moment they resume (a resumed leader, a resumed follower)."""
        variant = self._variant("pause", variant)
        targets = self._pick(variant, self._free())
        pinned = self._pin(targets)
        for node_id in targets:
            self.cluster.brokers[node_id].pause()
        self._begin("pause", variant, targets, **pinned)

    def _start_power(self, variant: str = "all") -> None:
        targets = self._free()
        for node_id in targets:
            self.cluster.brokers[node_id].kill9()
        cut = sum(cut_to_durable(self.cluster.brokers[i].data_dir) for i in targets)
        self._begin(
            "power", "all" if len(targets) == len(self.ids) else "some", targets, bytes_cut=cut
        )
        self.focus.strike(None)

    def _start_disk(self, variant: str = "") -> None:
        """Torn writes: kill -9 one node, a partition leader or every node, then cut
        each of its journals and segments at a length drawn between the last traced
        durable length and its size (mid-record, mostly); the heal restarts them."""
        variant = self._variant("disk", variant)
        free = self._free()
        targets = free if variant == "all" else self._pick(variant, free)
        for node_id in targets:
            self.cluster.brokers[node_id].kill9()
        cut = sum(cut_to_durable(self.cluster.brokers[i].data_dir, self.rng) for i in targets)
        self._begin("disk", variant, targets, bytes_cut=cut)
        self.focus.strike(None)

    def _start_disk_full(self, variant: str = "") -> None:
        """Fill the filesystem of one node, a leader or a minority (jepsen/diskfull.py):
        it refuses produce and keeps serving; the heal frees it."""
        variant = self._variant("disk-full", variant)
        mounted = [i for i in self._free() if self.cluster.brokers[i].data_dir in self.mounted]
        targets = self._pick(variant, mounted)
        filled = {i: diskfull.fill(self.cluster.brokers[i]) for i in targets}
        self._begin("disk-full", variant, targets, bytes_filled=filled)

    def _start_clock(self, variant: str = "") -> None:
        """Jump the wall clock of one node, a leader, the metadata leader, or every node
        (each its own way) by CLOCK_JUMP_S, forwards or backwards; the heal jumps back."""
        variant = self._variant("clock", variant)
        live = [b.node_id for b in self.cluster.brokers.values() if b.alive]
        targets = live if variant == "all" else self._pick(variant, live)
        offsets = {
            node_id: round(self.rng.choice((-1, 1)) * self.rng.uniform(*CLOCK_JUMP_S))
            for node_id in targets
        }
        for node_id, offset_s in offsets.items():
            self._clock_file(node_id).write_text(f"{offset_s:+d}\n")
        self._begin("clock", variant, targets, offsets_s=offsets)
        self.focus.strike(None)

    # --- membership -----------------------------------------------------------------

    def _ask(
        self, path: str, body: Any = None, rng: random.Random | None = None
    ) -> tuple[int, Any]:
        """The first live broker's answer (status, JSON) to a request; (0, error) if none."""
        last: Any = "no live broker"
        brokers = self.cluster.brokers
        for node_id in (rng or self.rng).sample(list(brokers), len(brokers)):
            if not brokers[node_id].alive:
                continue
            try:
                answer = http(
                    brokers[node_id].url + path,
                    "GET" if body is None else "POST",
                    body,
                    timeout_s=5.0,
                )
            except OSError as error:
                last = repr(error)
                continue
            if answer.status < 500:
                return answer.status, answer.json() if answer.body else None
            last = answer.error_code()
        return 0, last

    def _start_reassign(self) -> None:
        part = self.rng.randrange(self.partitions)
        status, doc = self._ask(f"/v1/topics/{self.topic}")
        if status != 200:
            self._begin("reassign", "none", [], partition=part, error=f"{status} {doc}")
            return
        replicas: list[str] = doc["partitions"][part]["replicas"]
        ids = sorted(self.ids)
        if not set(replicas) <= set(ids):  # a broker left meanwhile (joins and leaves)
            self._begin("reassign", "none", [], partition=part, replicas=replicas)
            return
        if len(replicas) >= len(ids):
            variant, target = "rotate-leader", replicas[1:] + replicas[:1]
        else:
            variant, target = "move", [ids[(ids.index(r) + 1) % len(ids)] for r in replicas]
        body = {"topic": self.topic, "partition": part, "replicas": target}
        status, answer = self._ask("/v1/cluster/reassignments", body)
        self._begin(
            "reassign",
            variant,
            target,
            partition=part,
            replicas=replicas,
            status=status,
            answer=answer if status != 202 else None,
        )

    # --- joins and leaves -------------------------------------------------------------

    def _noop(self, kind: str, reason: str, **detail: Any) -> None:
        """A join or leave that could not start: recorded, with no window left open."""
        fault = self._begin_background(kind, "none", [], reason=reason, **detail)
        self._end(fault, "skipped")

    def _end(self, fault: Fault, outcome: str, **detail: Any) -> None:
        fault.detail.update(outcome=outcome, **detail)
        self._stop(fault)

    def _spawn(
        self, fault: Fault, node_id: str, target: Callable[[Fault, str, random.Random], None]
    ) -> None:
        rng = random.Random(next(self._seeds))

        def run() -> None:
            try:
                target(fault, node_id, rng)
            except Exception as error:  # the operation ends "error"; settle reports it
                traceback.print_exc()
                self._end(fault, "error", error=repr(error))

        thread = threading.Thread(target=run, name=f"{fault.kind}-{node_id}", daemon=True)
        self.moving[node_id] = thread
        thread.start()

    def _busy(self) -> set[str]:
        return {n for n, t in self.moving.items() if t.is_alive()}

    def _start_join(self, fallback: bool = True) -> None:
        if len(self.cluster.brokers) >= self.max_brokers:
            if fallback and "leave" in self.kinds:  # full: shrink instead
                self._start_leave(fallback=False)
                return
            self._noop("join", "at-limit", brokers=len(self.cluster.brokers))
            return
        busy = self._busy()
        via = [b for b in self.cluster.live() if b.node_id not in busy]
        status, doc = self._ask("/v1/cluster")
        if not via or status != 200:
            self._noop("join", "no-live-broker", status=status)
            return
        contact = self.rng.choice(via)
        urls = [contact.url, *(b.url for b in via if b is not contact)]
        try:
            broker = self.cluster.add_broker(",".join(urls), list(doc["metadata_voters"]))
        except HarnessError as error:  # ports taken on its address, or none left: skip
            self._noop("join", "no-address", error=str(error))
            return
        if "clock" in self.kinds:
            self._fake_clock(broker)
        broker.start()
        fault = self._begin_background(
            "join", "join", [broker.node_id], via=contact.node_id, host=broker.host
        )
        self._spawn(fault, broker.node_id, self._finish_join)

    def _finish_join(self, fault: Fault, node_id: str, rng: random.Random) -> None:
        """Until the catalogue lists the node and it is ready. A process that exits on
        its own before it registered (no --join broker answered within its join timeout)
        is a failed join: the node is retired; a kill fault's restart goes on with its
        peers and voters."""
        broker = self.cluster.every[node_id]
        while not self._settle_over():
            view = self._catalogue()
            registered = view is not None and node_id in view.registered
            if registered and broker.ready():
                self._end(fault, "joined")
                return
            with self.lock:
                proc = broker.proc
                exited = proc is not None and proc.poll() is not None and not broker.killed
                if exited and not registered and proc is not None:  # on its own, not a fault
                    self.cluster.retire(node_id)
                    self._end(fault, "failed", exit_code=proc.returncode)
                    return
            time.sleep(MEMBERSHIP_POLL_S)
        self._end(fault, "unfinished")

    def _catalogue(self) -> Catalogue | None:
        """The newest catalogue (highest metadata_version) any live broker answers, with
        the decommissions its broker lists; None if none answers. It may still be old:
        right after every broker restarted, each answers from a catalogue it is still
        replaying (a leave once took that for its broker's departure); callers compare
        versions."""
        best: dict[str, Any] | None = None
        source = None
        for broker in self.cluster.live():
            try:
                answer = http(broker.url + "/v1/cluster", timeout_s=2.0)
            except OSError:
                continue
            doc = answer.json() if answer.status == 200 else None
            if doc and (best is None or doc["metadata_version"] > best["metadata_version"]):
                best, source = doc, broker
        if best is None or source is None:
            return None
        leaving: set[str] = set()
        target: list[str] | None = None
        answered = False
        try:
            ops = http(source.url + "/v1/cluster/operations", timeout_s=2.0)
            if ops.status == 200:
                answered, doc = True, ops.json()
                leaving = {d["broker_id"] for d in doc.get("decommissions", [])}
                target = (doc.get("metadata_voters") or {}).get("target")
        except OSError:
            pass
        return Catalogue(
            int(best["metadata_version"]),
            {b["node_id"] for b in best["brokers"]},
            leaving,
            list(best["metadata_voters"]),
            sorted(target) if target else None,
            answered,
        )

    def _start_leave(self, fallback: bool = True) -> None:
        view = self._catalogue()
        if view is None:
            self._noop("leave", "no-catalogue")
            return
        staying = view.registered - view.leaving - self._busy()
        candidates = sorted(set(self.ids) & staying)
        if "voters" not in self.kinds:  # only the voters nemesis lets a voter leave
            candidates = [c for c in candidates if c not in view.voters]
        if len(staying) <= BROKERS_MIN:
            candidates = []
        if not candidates:
            if fallback and "join" in self.kinds:  # nothing removable: grow instead
                self._start_join(fallback=False)
                return
            self._noop("leave", "no-candidate", voters=view.voters)
            return
        node_id = self.rng.choice(candidates)
        fault = self._begin_background(
            "leave",
            "decommission-voter" if node_id in view.voters else "decommission",
            [node_id],
            voters=view.voters,
            listed_at=view.version,
        )
        self._spawn(fault, node_id, self._finish_leave)

    def _finish_leave(self, fault: Fault, node_id: str, rng: random.Random) -> None:
        """Decommission (repeated while its outcome is unknown or the catalogue shows the
        node not decommissioning), poll until a catalogue newer than the last one that
        listed the node drops it (catalogue versions only grow and only the unregister
        step removes a broker), then retire it, unless it was restarted since that poll
        began (a restarted unregistered broker registers again: poll again)."""
        broker = self.cluster.every[node_id]
        listed_at = int(fault.detail["listed_at"])
        asked = conflicts = 0
        conflict = False  # the last ask met another change (409 operation_conflict)
        while not self._settle_over():
            starts = broker.starts
            view = self._catalogue()
            if view is not None and node_id in view.registered:
                listed_at = max(listed_at, view.version)
            if asked and view is not None and view.version > listed_at:  # it left
                with self.lock:
                    if broker.starts == starts:
                        self.cluster.retire(node_id)
                        self._end(fault, "left", requests=asked, gone_at=view.version)
                        return
                continue
            current = view is not None and view.version >= listed_at
            if (
                not asked
                or conflict
                or (current and view is not None and node_id not in view.leaving)
            ):
                asked += 1
                path = f"/v1/cluster/brokers/{node_id}/decommission"
                status, answer = self._ask(path, {}, rng)
                conflict = status == 409 and _error_code(answer) == "operation_conflict"
                if conflict:  # a voter change runs: "wait for it", as an operator would
                    conflicts += 1
                elif 400 <= status < 500 and status != 404:
                    self._end(fault, "refused", status=status, answer=answer)
                    return
            time.sleep(MEMBERSHIP_POLL_S)
        self._end(fault, "unfinished", requests=asked, conflicts=conflicts)

    # --- metadata voter changes -----------------------------------------------------

    def _voters_target(self, view: Catalogue) -> tuple[str, list[str]] | None:
        """(variant, target): 3 -> 5 adds two live registered non-voters; 5 -> 3 drops two
        voters, half the time the metadata leader among them. None: no such change."""
        voters = sorted(view.voters)
        if len(voters) == VOTERS_SMALL:
            free = view.registered - view.leaving - set(voters) - self._busy()
            spare = [b.node_id for b in self.cluster.live() if b.node_id in free]
            if len(spare) < VOTERS_LARGE - VOTERS_SMALL:
                return None
            return "grow", sorted(voters + self.rng.sample(spare, VOTERS_LARGE - VOTERS_SMALL))
        if len(voters) == VOTERS_LARGE:
            leader = self.cluster.leader_of(None, None)
            drop = self.rng.sample(voters, VOTERS_LARGE - VOTERS_SMALL)
            variant = "shrink"
            if leader in voters and self.rng.random() < 0.5:
                others = [v for v in voters if v != leader]
                drop, variant = [leader, self.rng.choice(others)], "shrink-leader"
            return variant, sorted(v for v in voters if v not in drop)
        return None  # a change ran halfway (4 voters recorded): the next one goes on

    def _start_voters(self) -> None:
        """Ask for the next voter set (POST /v1/cluster/metadata-voters) from the recorded
        one, even while a change runs (the broker must refuse another: 409). A refusal
        (409; 400: a broker left meanwhile) is a recorded no-op."""
        view = self._catalogue()
        if view is not None and not view.operations:
            view = None  # whether a change runs is unknown
        choice = None if view is None else self._voters_target(view)
        if view is None or choice is None:
            voters = None if view is None else view.voters
            self._noop("voters", "no-target", voters=voters)
            return
        variant, target = choice
        status, answer = self._ask("/v1/cluster/metadata-voters", {"voters": target})
        fault = self._begin_background(
            "voters",
            variant,
            target,
            voters=view.voters,
            running=view.voters_target,
            status=status,
            answer=answer if status != 202 else None,
        )
        if 400 <= status < 500:
            self._end(fault, "refused")
            return
        self._spawn(fault, f"voters-{len(self.windows)}", self._finish_voters)

    def _finish_voters(self, fault: Fault, _: str, rng: random.Random) -> None:
        """Ask again while the answer is unknown (no answer, 5xx: repeating the running
        target is a no-op, so is asking for the recorded set), then poll the newest
        catalogue until no voter change runs: ours ended once a catalogue newer than the
        last one showing it running shows none, or the recorded voters are the target."""
        target = sorted(fault.targets)
        status, asked, seen_at = int(fault.detail["status"]), 1, None
        while not self._settle_over():
            if status != 202:
                time.sleep(MEMBERSHIP_POLL_S)
                status, answer = self._ask("/v1/cluster/metadata-voters", {"voters": target}, rng)
                asked += 1
                if 400 <= status < 500:  # another change started meanwhile
                    self._end(fault, "refused", requests=asked, status=status, answer=answer)
                    return
                continue
            view = self._catalogue()
            if view is not None and view.operations:  # else "no target" means no answer
                if view.voters_target == target:
                    seen_at = max(seen_at or 0, view.version)
                ended = seen_at is not None and view.version > seen_at
                if view.voters_target is None and (ended or sorted(view.voters) == target):
                    self._end(fault, "changed", requests=asked, final=sorted(view.voters))
                    return
            time.sleep(MEMBERSHIP_POLL_S)
        self._end(fault, "unfinished", requests=asked)

    def _settle_over(self) -> bool:
        return self.closing.is_set() or time.monotonic() > self.settle_by

    # --- healing --------------------------------------------------------------------

    def heal_all(self) -> None:
        """Stop every active fault: heal the network, resume, restart (not a broker that
        left meanwhile)."""
        with self.lock:
            for fault in self.active:
                if fault.kind == "partition" and self.net is not None:
                    self.net.heal()
                for node_id in fault.targets:
                    broker: Broker | None = self.cluster.brokers.get(node_id)
                    if broker is None:
                        continue
                    if fault.kind == "pause":
                        broker.resume()
                    elif fault.kind in ("kill", "power", "disk", "upgrade"):
                        broker.start()
                    elif fault.kind == "clock":
                        self._clock_file(node_id).write_text("+0\n")
                    elif fault.kind == "disk-full":
                        diskfull.free(broker)
                self._stop(fault)
            self.active = []
            self.focus.clear()

    def settle(self, timeout_s: float = SETTLE_WAIT_S) -> None:
        """After healing: wait for every join and leave in flight to end; HarnessError
        if one does not within timeout_s (a leave that cannot finish on a healed
        cluster is a finding to look at, not a verdict)."""
        self.settle_by = time.monotonic() + timeout_s
        for thread in list(self.moving.values()):
            thread.join(max(0.0, self.settle_by - time.monotonic()) + 10.0)
        unfinished = [
            f
            for f in self.windows
            if f.kind in MEMBERSHIP and f.detail.get("outcome") in (None, "unfinished", "error")
        ]
        if unfinished:
            raise HarnessError(
                "membership operations unfinished "
                f"{timeout_s} s after healing: {[(f.kind, f.targets) for f in unfinished]}"
            )


def _error_code(answer: object) -> str | None:
    """The `error.code` of a JSON error answer, else None."""
    error = answer.get("error") if isinstance(answer, dict) else None
    return error.get("code") if isinstance(error, dict) else None
