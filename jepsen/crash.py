"""`python -m jepsen.crash`: every crash point of a short workload, restarted and checked.

    python -m jepsen.crash                          # 1 broker, 2 partitions, 24 records
    python -m jepsen.crash --records 200 --snapshot-entries 16 --partitions 4

The ALICE / CrashMonkey method applied to dmq's own files (jepsen/README.md, "The
crash-point explorer"):

1. Run one `dmq serve` under strace (`-f -ttt -y -xx`, the calls in
   crashfs.TRACED_CALLS) on a new data directory with Raft snapshots every
   `--snapshot-entries` entries, so that journal compactions, snapshot writes and
   recycled journal files all happen within a few records.
2. Produce `--records` records one at a time with acks=all, round-robin over the
   partitions, noting when each acknowledgement arrived (wall clock, as strace's).
3. Kill the broker (-9), parse the trace (crashfs.parse_trace), and check the model: every
   call applied must give exactly the directory the broker left.
4. For each crash point (after each fsync, fdatasync or name change under the data
   directory, from the first produce on) and each variant (`synced`, `torn`, `process`:
   crashfs module docstring), skipping states already seen: write the directory the
   crash leaves, start a broker on it, and check that it becomes ready and that every
   record acknowledged before the crash point is read back at its offset with its value.
5. Print each failing crash point (the call after which the crash struck, the variant,
   what was wrong) and exit 1 if there was one.

The checks run `--jobs` brokers at a time. Nothing is left behind: the brokers are killed
and the temporary directories removed (`--keep` keeps the failing ones).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jepsen.cluster import Answer, http, listen_ports
from jepsen.crashfs import (
    TRACED_CALLS,
    VARIANTS,
    CrashPoint,
    CrashState,
    Replay,
    TraceError,
    crash_points,
    parse_trace,
    socket_sends,
    tree_of,
)

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "crash"
READY_TIMEOUT_S = 30.0  # a broker that is not ready by then on a crash state fails the check
ACK_MARKER = b'{"offsets":['  # what a produce's answer starts with
LEADER_WAIT_S = 15.0  # a partition with no leader for longer fails the check
STRACE_SIZE_BYTES = 1 << 26  # strace -s: no traced write is longer (journal writes: 1 MiB)


@dataclass(frozen=True, slots=True)
class Ack:
    time_s: float  # wall clock when the answer arrived
    partition: int
    offset: int | None  # None for acks=1, whose answer names no offset
    value: str


@dataclass(frozen=True, slots=True)
class Failure:
    point: CrashPoint
    problem: str

    def describe(self) -> str:
        return (
            f"crash after call {self.point.seq} ({self.point.call}, {self.point.variant}): "
            f"{self.problem}"
        )


def serve_args(data_dir: Path, host: str, ports: list[int], extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "dmq", "serve", "--data-dir", str(data_dir),
        "--http-addr", f"{host}:{ports[0]}", "--raft-addr", f"{host}:{ports[1]}", *extra,
    ]  # fmt: skip


def traced(trace: Path, command: list[str]) -> list[str]:
    """`command` under strace, writing the calls crashfs models to `trace`."""
    return [
        "strace", "-f", "--seccomp-bpf", "-qq", "-ttt", "-y", "-xx",
        "-s", str(STRACE_SIZE_BYTES), "-o", str(trace), "-e", "trace=" + TRACED_CALLS,
        *command,
    ]  # fmt: skip


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if http(url + "/readyz", timeout_s=1.0).status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_traced(proc: subprocess.Popen[bytes]) -> None:
    """Kill the broker strace runs, not strace: strace then writes the rest of its trace
    and exits (killed itself, it would lose what it had not written yet)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    with contextlib.suppress(OSError):
        for pid in children.read_text().split():
            os.kill(int(pid), signal.SIGKILL)
    try:
        proc.wait(timeout=30.0)
    except subprocess.TimeoutExpired:
        stop(proc)


def record_workload(
    work: Path, records: int, partitions: int, producers: int, broker_args: list[str]
) -> tuple[Path, Path, list[Ack], float]:
    """Steps 1-3: the data directory, the trace, the acknowledgements, and when the
    workload's first produce was sent. `producers` threads send at once: proposals that
    arrive while a snapshot is written are what a compaction must keep."""
    data_dir, trace = work / "data", work / "trace.txt"
    ports = listen_ports(["127.0.0.1"], 2, os.getpid())
    command = traced(trace, serve_args(data_dir, "127.0.0.1", ports, broker_args))
    log = open(work / "traced-broker.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
    log.close()
    url = f"http://127.0.0.1:{ports[0]}"
    acks: list[Ack] = []
    try:
        if not wait_ready(url, proc, 60.0):
            raise SystemExit(
                f"the traced broker did not start: {(work / 'traced-broker.log').read_text()[-2000:]}"
            )
        created = http(url + "/v1/topics", "POST", {"name": TOPIC, "partitions": partitions})
        if created.status != 201:
            raise SystemExit(f"topic not created: {created.status} {created.body!r}")
        started_s = time.time()

        def send(i: int, acks: str = "all") -> Ack | None:
            return produce_one(url, i % partitions, f"r{i}", acks)

        def send_acks_1() -> list[Ack]:
            # One thread, one partition: its answers leave in the order it sent them.
            sent = (send(records + k * partitions, "1") for k in range(records // 4))
            return [a for a in sent if a is not None]

        with ThreadPoolExecutor(max_workers=producers + 1) as pool:
            acks_1 = pool.submit(send_acks_1)
            acks = [a for a in pool.map(send, range(records)) if a is not None]
            acks += acks_1.result()
    finally:
        stop_traced(proc)
    return data_dir, trace, acks, started_s


def produce_one(
    url: str, partition: int, value: str, acks: str = "all", timeout_s: float = 10.0
) -> Ack | None:
    """One record to `partition` through the broker at `url`; its acknowledgement (timed
    when the answer arrived), or None if the produce failed."""
    answer = http(
        f"{url}/v1/topics/{TOPIC}/records?acks={acks}&partition={partition}",
        "POST",
        {"records": [{"value": value}]},
        timeout_s=timeout_s,
    )
    if answer.status != 200:
        return None
    return Ack(time.time(), partition, answer.json()["offsets"][0]["offset"], value)


Records = dict[tuple[int, int], str]  # (partition, offset) -> value, as read back


def check_state(
    state: CrashState, partitions: set[int], work: Path, broker_args: list[str], ports: list[int]
) -> tuple[str | None, Records]:
    """Step 4 for one state: start a broker on it and read every record of `partitions`:
    (None, the records) or (what went wrong, what was read)."""
    home = Path(tempfile.mkdtemp(prefix=f"state-{state.seq}-{state.variant}-", dir=work))
    data_dir = home / "data"
    data_dir.mkdir()
    state.materialize(data_dir)
    log = open(home / "broker.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        serve_args(data_dir, "127.0.0.1", ports, broker_args),
        cwd=ROOT, stdout=log, stderr=log, start_new_session=True,
    )  # fmt: skip
    log.close()
    url = f"http://127.0.0.1:{ports[0]}"
    found: Records = {}
    try:
        if not wait_ready(url, proc, READY_TIMEOUT_S):
            tail = (home / "broker.log").read_text(errors="replace").strip().splitlines()[-3:]
            problem: str | None = "the broker did not become ready: " + " | ".join(tail)
        else:
            problem = read_all(url, partitions, found)
    finally:
        stop(proc)
    if problem is None:
        shutil.rmtree(home, ignore_errors=True)
    return problem, found


def read_all(url: str, partitions: set[int], found: Records) -> str | None:
    """Every record of `partitions` into `found`; what went wrong, if something did."""
    for partition in sorted(partitions):
        offset = 0
        while True:
            answer = _fetch(
                f"{url}/v1/topics/{TOPIC}/partitions/{partition}/records?offset={offset}"
            )
            if answer.status == 404 and answer.error_code() == "topic_not_found":
                return None  # a crash before the topic was created: nothing to read
            if answer.status != 200:
                return f"partition {partition} from {offset}: {answer.status} {answer.body[:200]!r}"
            doc: dict[str, Any] = answer.json()
            for record in doc["records"]:
                found[(partition, record["offset"])] = record["value"]
            if not doc["records"] or doc["next_offset"] >= doc["high_watermark"]:
                break
            offset = doc["next_offset"]
    return None


def _fetch(url: str) -> Answer:
    """A fetch, retried while the partition has no leader yet (503) for up to
    LEADER_WAIT_S: a broker is ready before every partition has elected."""
    deadline = time.monotonic() + LEADER_WAIT_S
    while True:
        answer = http(url, timeout_s=10.0)
        if answer.status != 503 or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


def check_acks(found: Records, due: list[Ack]) -> str | None:
    """Every acknowledgement due is read back: at its offset, or for acks=1 (no offset
    answered) exactly once in its partition."""
    counts: dict[tuple[int, str], int] = {}
    for (partition, _), value in found.items():
        counts[(partition, value)] = counts.get((partition, value), 0) + 1
    for ack in due:
        if ack.offset is None:
            got: object = counts.get((ack.partition, ack.value), 0)
            if got == 1:
                continue
            where = f"held {got} times in partition {ack.partition}"
        else:
            got = found.get((ack.partition, ack.offset))
            if got == ack.value:
                continue
            where = f"at partition {ack.partition} offset {ack.offset} reads back as {got!r}"
        return f"acknowledged {ack.value!r} {where} ({len(due)} acknowledged before the crash)"
    return None


def check_monotonic(earlier: Records, later: Records) -> str | None:
    """What a crash at an earlier point served, a crash at a later one must serve too, at
    the same offsets: durable data never shrinks (retention is off in this workload).
    This catches a loss whether or not its acknowledgement had arrived before the crash."""
    for key, value in sorted(earlier.items()):
        if later.get(key) != value:
            return (
                f"partition {key[0]} offset {key[1]} held {value!r} after an earlier crash "
                f"point and {later.get(key)!r} after this one"
            )
    return None


def server_times(acks: list[Ack], sent: list[tuple[float, bytes]]) -> list[Ack]:
    """The acknowledgements, each timed when the broker wrote it to its socket (the
    answer names its partition and offset; acks=1 answers, which name no offset, in the
    order their one thread sent them) rather than when the client read it: a crash
    between the two must keep the record too."""
    when: dict[tuple[int, int], float] = {}
    unplaced: list[float] = []  # acks=1 answers, in the order they left
    for time_s, payload in sent:
        body = json.loads(payload[payload.index(ACK_MARKER) :].split(b"\r\n", 1)[0])
        for placed in body["offsets"]:
            if placed["offset"] is None:
                unplaced.append(time_s)
            else:
                when.setdefault((placed["partition"], placed["offset"]), time_s)
    timed: list[Ack] = []
    for ack in acks:
        sent_s = unplaced.pop(0) if ack.offset is None and unplaced else None
        if ack.offset is not None:
            sent_s = when.get((ack.partition, ack.offset))
        if sent_s is None:
            raise TraceError(f"an acknowledgement not seen sent: {ack}")
        timed.append(Ack(min(sent_s, ack.time_s), ack.partition, ack.offset, ack.value))
    return timed


def _check_states(
    states: list[CrashState], acks: list[Ack], work: Path, broker_args: list[str], jobs: int
) -> dict[str, tuple[str | None, Records]]:
    """Every state checked once, `jobs` at a time: digest -> (problem, records read)."""
    partitions = {a.partition for a in acks}
    # Each job owns a pair of ports: two brokers never race for one.
    free = listen_ports(["127.0.0.1"], 2 * jobs, os.getpid() + 1)
    pairs: queue.Queue[list[int]] = queue.Queue()
    for k in range(jobs):
        pairs.put(free[2 * k : 2 * k + 2])

    def check(state: CrashState) -> tuple[str, tuple[str | None, Records]]:
        ports = pairs.get()
        try:
            return state.digest(), check_state(state, partitions, work, broker_args, ports)
        finally:
            pairs.put(ports)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(pool.map(check, states))


def _judge(
    points: list[CrashPoint], results: dict[str, tuple[str | None, Records]], acks: list[Ack]
) -> list[Failure]:
    """Step 5: at each crash point, in order, the state's broker must have started, served
    every acknowledgement sent by then, and everything an earlier point of the same
    variant served. A state's failure to start is reported once."""
    failures: list[Failure] = []
    reported: set[str] = set()
    last: dict[str, Records] = {}  # per variant: what the previous point served
    for point in points:
        problem, found = results[point.digest]
        if problem is not None:
            if point.digest not in reported:
                reported.add(point.digest)
                failures.append(Failure(point, problem))
            continue
        due = [a for a in acks if a.time_s <= point.time_s]
        problem = check_acks(found, due)
        if problem is None and point.variant in last:
            problem = check_monotonic(last[point.variant], found)
        if problem is None:
            last[point.variant] = found
        else:
            failures.append(Failure(point, problem))
    return failures


def explore(args: argparse.Namespace) -> int:
    broker_args = ["--raft-snapshot-entries", str(args.snapshot_entries), *args.broker_arg]
    work = Path(tempfile.mkdtemp(prefix="dmq-crash-"))
    failures: list[Failure] = []
    try:
        data_dir, trace, acks, started_s = record_workload(
            work, args.records, args.partitions, args.producers, broker_args
        )
        calls = parse_trace(trace)
        acks = server_times(acks, socket_sends(calls, ACK_MARKER))
        replay = Replay(data_dir)
        for call in calls:
            replay.apply(call)
        if replay.final_tree() != tree_of(data_dir):
            raise TraceError("the model's final directory differs from the broker's")
        variants = tuple(v for v in args.variants.split(",") if v)
        after_s = 0.0 if args.from_start else started_s
        points, states = crash_points(calls, data_dir, variants, after_s, ACK_MARKER)
        print(
            f"{len(calls)} calls traced, {len(acks)} records acknowledged, "
            f"{len(points)} crash points, {len(states)} distinct states ({', '.join(variants)})",
            flush=True,
        )
        began = time.monotonic()
        results = _check_states(list(states.values()), acks, work, broker_args, args.jobs)
        failures = _judge(points, results, acks)
        for failure in failures:
            print("FAIL", failure.describe(), flush=True)
        summary = {
            "points": len(points),
            "states": len(states),
            "failed": len(failures),
            "acks": len(acks),
            "check_s": round(time.monotonic() - began, 1),
            "failures": [f.describe() for f in failures],
        }
        print(json.dumps(summary, indent=1))
    except TraceError:
        failures.append(Failure(CrashPoint(-1, 0.0, "trace", "", ""), "the trace"))
        raise
    finally:
        if not (args.keep and failures):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jepsen.crash", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--records", type=int, default=24, help="records produced, one a request")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the topic")
    parser.add_argument("--producers", type=int, default=4, help="producer threads at once")
    parser.add_argument(
        "--snapshot-entries", type=int, default=4, help="the broker's --raft-snapshot-entries"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="crash variants, comma-separated"
    )
    parser.add_argument("--jobs", type=int, default=2, help="brokers checked at once")
    parser.add_argument(
        "--from-start", action="store_true", help="also the crash points of start-up"
    )
    parser.add_argument("--keep", action="store_true", help="keep the failing states' directories")
    parser.add_argument(
        "--broker-arg", action="append", default=[], help="one more `dmq serve` argument"
    )
    return explore(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
