"""What a new user meets on day one with the `dmq` command, run as the real command
against a real broker process.

Proves:
- a keyed produce with a line lacking its separator stops there, sends the lines before
  it, and says so readably: the line, the separator as text (not a bytes repr), how many
  lines went, then "produced 1 record" (a singular for one);
- `dmq consume` reads read_committed by default (an aborted transaction's records and an
  open one's are not printed, as Kafka's consumers with transactions), and
  `--isolation read_uncommitted` prints them;
- SIGTERM stops a `dmq consume --group --follow` as Ctrl-C does: it leaves the group at
  once (the group is empty right after, not ~10 s later when its session expires), exit 143;
- `--group` with `--from latest` starts a partition without a committed offset at its end
  (it was silently ignored); `--from OFFSET`, `--from-time` and `--partition` with
  `--group` are usage errors naming what to use instead;
- durations: `--from-time 1h` means an hour ago, `--delay 3` (no unit) is refused
  naming the spellings it could mean;
- `consume --from 100` past a partition's end is an error naming its range (it printed
  nothing and exited 0); a topic that does not exist is an error saying what to do;
  `--config retention.ms=...` (Kafka's spelling) is taken; `topic describe` prints the
  API's JSON boolean config values as they are typed (`false`);
- `dmq share consume --output json` prints `dmq consume --output json`'s record shape
  (timestamp, headers, value_encoding only for non-UTF-8), plus delivery_count.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from dmq.client import Producer
from tests_support import BrokerProcess, wait_for


def dmq(
    broker: BrokerProcess, *argv: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dmq", "--url", broker.url, *argv],
        input=stdin, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _create(broker: BrokerProcess, name: str) -> None:
    assert broker.json("POST", "/v1/topics", {"name": name, "partitions": 1})[0] == 201


def test_a_keyed_line_without_its_separator_stops_produce_saying_what_was_sent(
    broker: BrokerProcess,
) -> None:
    _create(broker, "t")
    done = dmq(broker, "produce", "t", "--key-separator", ":", stdin="a:1\nb2\nc:3\n")
    assert done.returncode == 1, done
    assert "produced 1 record to t\n" in done.stderr, done.stderr
    assert (
        "error: invalid_request: line 2 has no key separator ':' (--key-separator): produce "
        "stopped there; the 1 line before it was sent, nothing from line 2 on"
    ) in done.stderr, done.stderr
    assert "b':'" not in done.stderr
    out = dmq(broker, "consume", "t", "--key-separator", ":")
    assert out.stdout == "a:1\n", out


def test_consume_reads_committed_transactions_only_unless_asked(broker: BrokerProcess) -> None:
    _create(broker, "t")
    with Producer(broker.url, linger_ms=0) as plain:
        plain.send("t", b"plain", partition=0).result(30)
    aborted = Producer(broker.url, transactional_id="tx-a", linger_ms=0)
    open_one = Producer(broker.url, transactional_id="tx-b", linger_ms=0)
    try:
        aborted.begin_transaction()
        aborted.send("t", b"aborted", partition=0).result(30)
        aborted.abort_transaction()
        open_one.begin_transaction()
        open_one.send("t", b"open", partition=0).result(30)
        committed = dmq(broker, "consume", "t")
        assert committed.returncode == 0 and committed.stdout == "plain\n", committed
        everything = dmq(broker, "consume", "t", "--isolation", "read_uncommitted")
        assert everything.stdout == "plain\naborted\nopen\n", everything
        grouped = dmq(broker, "consume", "t", "--group", "g")
        assert grouped.returncode == 0 and grouped.stdout == "plain\n", grouped
    finally:
        aborted.close()
        open_one.close()


def _members(broker: BrokerProcess, group: str) -> int:
    status, doc = broker.json("GET", f"/v1/groups/{group}")
    return len(doc["members"]) if status == 200 else 0


def test_sigterm_makes_a_group_consumer_leave_the_group_at_once(broker: BrokerProcess) -> None:
    _create(broker, "t")
    consumer = subprocess.Popen(
        [sys.executable, "-m", "dmq", "--url", broker.url,
         "consume", "t", "--group", "g", "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "DMQ_URL"},
    )  # fmt: skip
    try:
        wait_for(lambda: _members(broker, "g") == 1, 30, "the consumer to join")
        consumer.send_signal(signal.SIGTERM)
        assert consumer.wait(30) == 128 + signal.SIGTERM, consumer.communicate()
        # Left, not expired: the session is 10 s; a member that only stopped would stay.
        left_at = time.monotonic()
        wait_for(lambda: _members(broker, "g") == 0, 30, "the member to leave")
        assert time.monotonic() - left_at < 5.0
    finally:
        if consumer.poll() is None:
            consumer.kill()
        consumer.communicate()


def test_group_from_latest_is_honoured_and_other_starts_are_refused(
    broker: BrokerProcess,
) -> None:
    _create(broker, "t")
    old = {"records": [{"value": f"old{i}"} for i in range(3)]}
    assert broker.json("POST", "/v1/topics/t/records", old)[0] == 200
    follower = subprocess.Popen(
        [sys.executable, "-m", "dmq", "--url", broker.url,
         "consume", "t", "--group", "late", "--from", "latest", "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _members(broker, "late") == 1, 30, "the consumer to join")
        time.sleep(2)  # its partition assigned and its position resolved to the end
        new = {"records": [{"value": "new"}]}
        assert broker.json("POST", "/v1/topics/t/records", new)[0] == 200
        assert follower.stdout is not None
        assert follower.stdout.readline() == "new\n"  # not old0: --from latest was used
    finally:
        follower.terminate()
        follower.communicate(timeout=30)
    earliest = dmq(broker, "consume", "t", "--group", "early", "--from", "earliest")
    assert earliest.stdout == "old0\nold1\nold2\nnew\n", earliest
    for flags, named in (
        (("--from", "2"), "with --group, --from is earliest or latest"),
        (("--from-time", "1h"), "--from-time does not apply with --group"),
        (("--partition", "0"), "--partition does not apply with --group"),
    ):
        refused = dmq(broker, "consume", "t", "--group", "other", *flags)
        assert refused.returncode == 2 and named in refused.stderr, refused
        assert "dmq group reset" in refused.stderr, refused


def test_durations_take_units_and_a_bare_number_is_refused(broker: BrokerProcess) -> None:
    _create(broker, "t")
    two_hours_ago_ms = int(time.time() * 1000) - 2 * 3_600_000
    records = [{"value": "old", "timestamp": two_hours_ago_ms}, {"value": "recent"}]
    assert broker.json("POST", "/v1/topics/t/records", {"records": records})[0] == 200
    recent = dmq(broker, "consume", "t", "--from-time", "1h")
    assert recent.returncode == 0 and recent.stdout == "recent\n", recent
    both = dmq(broker, "consume", "t", "--from-time", "3h")
    assert both.stdout == "old\nrecent\n", both
    bare = dmq(broker, "produce", "t", "--delay", "3", stdin="x\n")
    assert bare.returncode == 2, bare
    assert "'3' has no unit: write 3ms, 3s, 3m, 3h or 3d" in bare.stderr, bare.stderr


def test_a_start_past_the_end_is_refused_and_kafka_config_keys_are_taken(
    broker: BrokerProcess,
) -> None:
    _create(broker, "t")
    records = {"records": [{"value": f"v{i}"} for i in range(3)]}
    assert broker.json("POST", "/v1/topics/t/records", records)[0] == 200
    past = dmq(broker, "consume", "t", "--from", "100")
    assert past.returncode == 1 and past.stdout == "", past
    assert "error: offset_out_of_range: offset 100 is outside t-0's [0, 3]" in past.stderr, past
    assert dmq(broker, "consume", "t", "--from", "3").stdout == ""  # the end: nothing yet
    assert dmq(broker, "consume", "t", "--from", "2").stdout == "v2\n"
    missing = dmq(broker, "consume", "brandnew", "--follow")
    assert missing.returncode == 1, missing
    assert (
        "error: topic_not_found: topic 'brandnew' does not exist: create it with `dmq topic "
        "create brandnew` (or produce to it), or consume with --group"
    ) in missing.stderr, missing.stderr
    created = dmq(broker, "topic", "create", "k", "--config", "retention.ms=60000")
    assert created.returncode == 0, created
    described = dmq(broker, "topic", "describe", "k").stdout
    assert "  retention_ms = 60000\n" in described, described
    # The API answers a JSON boolean since 0.2.0; the CLI prints it as typed, not as `False`.
    assert "  remote_storage_enable = false\n" in described, described


def test_share_consume_prints_the_record_shape_of_consume(broker: BrokerProcess) -> None:
    _create(broker, "t")
    record = {"key": "k", "value": "v", "headers": [{"key": "h", "value": "x"}]}
    assert broker.json("POST", "/v1/topics/t/records", {"records": [record]})[0] == 200
    plain = json.loads(dmq(broker, "consume", "t", "--output", "json").stdout)
    shared = dmq(broker, "share", "consume", "s", "t", "--output", "json", "--max-records", "1")
    assert shared.returncode == 0, shared
    assert json.loads(shared.stdout) == plain | {"delivery_count": 1}
    assert plain["headers"] == [{"key": "h", "value": "x"}] and "value_encoding" not in plain
