"""The `dmq` command parses what its help says and reports errors as documented.

Proves that:
- `--url` works before or after the command, and defaults to $DMQ_URL, else localhost:8080;
- `--config KEY=VALUE` sends integers as numbers and the rest as strings; `--from` takes
  earliest, latest or an offset; `--from-time` takes epoch ms, ISO 8601 (UTC unless it
  has an offset) or a duration ago (1h); `--from` and `--from-time` exclude each other;
- usage errors exit 2, errors from the broker or the network exit 1 with
  `error: <code>: <message>` on stderr (a dead broker after --api-timeout-ms, named, and
  said once at its first failed attempt with how long it will be retried), `--help` exits 0;
- `--api-timeout-ms` (before or after the command), produce's `--delivery-timeout-ms` and
  `--retries` default to Kafka's values; a delivery timeout below linger + request
  timeout is a usage error naming the fields;
- `dmq serve` flags reach `load_config` (a bad value is `error: invalid_config`);
- `dmq bench log` has exactly the options of `bench.log_bench.add_arguments`;
- produce splits lines (\\n or \\r\\n, a last line without one, lines across read chunks)
  and keys at the first separator; consume formats lines and JSON (base64 when not UTF-8);
- the progress bar draws at most once per interval and ends with a newline;
- produce then consume round-trips keys and values through a fake broker (the one of
  test_client_fake_broker.py), in process.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_client_fake_broker import FakeBroker, serving

from dmq import cli
from dmq.cli import consume, produce
from dmq.client import ConsumerRecord
from dmq.config import load_config
from dmq.errors import InvalidRequest


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def test_url_goes_before_or_after_the_command_and_defaults_to_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DMQ_URL", raising=False)
    assert parse("topic", "list").url == "http://127.0.0.1:8080"
    monkeypatch.setenv("DMQ_URL", "http://broker:9000")
    assert parse("topic", "list").url == "http://broker:9000"
    assert parse("--url", "http://a:1", "topic", "list").url == "http://a:1"
    assert parse("topic", "list", "--url", "http://b:2").url == "http://b:2"
    assert parse("consume", "t", "--url", "http://c:3").url == "http://c:3"


def test_config_items_send_integers_as_numbers() -> None:
    args = parse(
        "topic",
        "create",
        "t",
        "--partitions",
        "3",
        "--config",
        "retention_ms=-1",
        "--config",
        "cleanup_policy=compact,delete",
        "--config",
        "x=a=b",
    )
    assert args.partitions == 3 and args.replication_factor is None
    assert dict(args.config) == {"retention_ms": -1, "cleanup_policy": "compact,delete", "x": "a=b"}


@pytest.mark.parametrize(
    "argv",
    [
        ["topic", "create", "t", "--config", "novalue"],
        ["topic", "create", "t", "--partitions", "0"],
        ["topic"],
        ["consume", "t", "--from", "yesterday"],
        ["consume", "t", "--from", "-3"],
        ["consume", "t", "--from", "1", "--from-time", "5"],
        ["consume", "t", "--output", "xml"],
        ["produce", "t", "--acks", "2"],
        ["produce", "t", "--key-separator", ""],
        ["bench"],
        ["nonsense"],
        [],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "produce" in capsys.readouterr().out


def test_alter_needs_something_to_change(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["topic", "alter", "t"]) == 2
    assert "--config" in capsys.readouterr().err


def test_from_and_from_time() -> None:
    assert parse("consume", "t").start is None  # not given: earliest (--group: told apart)
    assert parse("consume", "t", "--from", "latest").start == "latest"
    assert parse("consume", "t", "--from", "42").start == 42
    assert parse("consume", "t", "--from-time", "1700000000000").start_time_ms == 1700000000000
    utc = parse("consume", "t", "--from-time", "2023-11-14T22:13:20Z").start_time_ms
    naive = parse("consume", "t", "--from-time", "2023-11-14T22:13:20").start_time_ms
    shifted = parse("consume", "t", "--from-time", "2023-11-14T23:13:20+01:00").start_time_ms
    assert utc == naive == shifted == 1700000000000
    before = int(time.time() * 1000)
    hour_ago = parse("consume", "t", "--from-time", "1h").start_time_ms
    assert before - 3_600_000 <= hour_ago <= int(time.time() * 1000) - 3_600_000


def test_broker_errors_exit_1_with_code_and_message(capsys: pytest.CaptureFixture[str]) -> None:
    # A dead broker is retried for --api-timeout-ms (60 s by default), then reported.
    argv = ["--url", "http://127.0.0.1:9", "topic", "describe", "t", "--api-timeout-ms", "800"]
    code = cli.main(argv)
    assert code == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: broker_unavailable: "), err
    assert "default_api_timeout_ms 800 ms" in err, err


def test_a_dead_broker_is_said_at_once_not_only_at_the_deadline() -> None:
    # The real command, as a user runs it: no logging set up, so the client's warning
    # goes to stderr by Python's last-resort handler, once, at the first failed attempt.
    argv = ["--url", "http://127.0.0.1:9", "topic", "describe", "t", "--api-timeout-ms", "1500"]
    run = subprocess.run(
        [sys.executable, "-m", "dmq", *argv], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1, run
    lines = run.stderr.splitlines()
    warnings = [line for line in lines if "retrying until" in line]
    assert len(warnings) == 1, run.stderr
    assert "cannot reach the broker at http://127.0.0.1:9" in warnings[0], run.stderr
    assert "default_api_timeout_ms (1500 ms)" in warnings[0], run.stderr
    assert lines[-1].startswith("error: broker_unavailable: "), run.stderr


def test_timeout_options_before_or_after_the_command_with_kafkas_defaults() -> None:
    assert parse("topic", "list").api_timeout_ms == 60_000
    assert parse("--api-timeout-ms", "5000", "topic", "list").api_timeout_ms == 5000
    assert (
        parse("--api-timeout-ms", "5000", "group", "list", "--api-timeout-ms", "7").api_timeout_ms
        == 7
    )
    produce_args = parse("produce", "t")
    assert (produce_args.delivery_timeout_ms, produce_args.retries) == (120_000, None)
    produce_args = parse("produce", "t", "--delivery-timeout-ms", "40000", "--retries", "3")
    assert (produce_args.delivery_timeout_ms, produce_args.retries) == (40_000, 3)


def test_a_delivery_timeout_below_linger_plus_request_timeout_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(["produce", "t", "--delivery-timeout-ms", "1000", "--file", "/dev/null"])
    assert code == 2
    err = capsys.readouterr().err
    assert "delivery_timeout_ms (1000) must be >= linger_ms (5) + request_timeout_ms" in err, err


def test_serve_flags_reach_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(
        "serve",
        "--data-dir",
        "/tmp/d",
        "--http-addr",
        "127.0.0.1:9999",
        "--default-partitions",
        "4",
    )
    config = load_config(vars(args), environ={}, config_file=args.config)
    assert (config.data_dir, config.http_port, config.default_partitions) == ("/tmp/d", 9999, 4)
    assert cli.main(["serve", "--http-addr", "nonsense"]) == 1
    assert capsys.readouterr().err.startswith("error: invalid_config: ")


def test_bench_log_has_the_options_of_the_benchmark() -> None:
    from bench import log_bench

    theirs = argparse.ArgumentParser()
    log_bench.add_arguments(theirs)
    ours = parse("bench", "log")
    expected = vars(theirs.parse_args([]))
    assert {k: getattr(ours, k) for k in expected} == expected
    quick = parse("bench", "log", "--quick", "--total-mb", "2", "--runs", "1", "--dir", "/tmp")
    assert (quick.quick, quick.total_mb, quick.runs, str(quick.dir)) == (True, 2.0, 1, "/tmp")


def test_split_key_at_the_first_separator() -> None:
    assert produce.split_key(b"k:v:w", b":", 1) == (b"k", b"v:w")
    assert produce.split_key(b"plain", None, 1) == (None, b"plain")
    assert produce.split_key(b":v", b":", 1) == (b"", b"v")
    with pytest.raises(InvalidRequest, match="line 7"):
        produce.split_key(b"nokey", b":", 7)
    assert parse("produce", "t", "--key-separator", "\\t").key_separator == b"\t"


def test_read_lines_handles_endings_and_lines_across_chunks() -> None:
    long = b"x" * (produce._READ_CHUNK_BYTES + 10)  # crosses a chunk boundary
    data = b"a\r\nb\n\n" + long + b"\nlast"

    async def collect() -> tuple[list[bytes], int]:
        lines: list[bytes] = []
        consumed = 0
        async for chunk, so_far in produce.read_lines(io.BytesIO(data)):
            lines += chunk
            consumed = so_far
        return lines, consumed

    assert asyncio.run(collect()) == ([b"a", b"b", b"", long, b"last"], len(data))


def test_format_record_as_lines_and_json() -> None:
    record = ConsumerRecord("t", 1, 5, 1700000000000, b"k", b"v", (("h", b"x"),))
    assert consume.format_record(record, "lines") == b"v\n"
    assert consume.format_record(record, "lines", b"\t") == b"k\tv\n"
    assert json.loads(consume.format_record(record, "json")) == {
        "topic": "t",
        "partition": 1,
        "offset": 5,
        "timestamp": 1700000000000,
        "key": "k",
        "value": "v",
        "headers": [{"key": "h", "value": "x"}],
    }
    binary = ConsumerRecord("t", 0, 0, 0, None, b"\xff", ())
    assert json.loads(consume.format_record(binary, "json"))["value"] == "/w=="
    assert json.loads(consume.format_record(binary, "json"))["value_encoding"] == "base64"
    tombstone = ConsumerRecord("t", 0, 0, 0, b"k", None, ())
    assert json.loads(consume.format_record(tombstone, "json"))["value"] is None


def test_progress_bar_draws_at_most_once_per_interval() -> None:
    now = [0.0]
    out = io.StringIO()
    bar = produce.ProgressBar(2 * 1024 * 1024, out, width=10, interval_s=1.0, clock=lambda: now[0])
    bar.update(1024 * 1024, 10)
    bar.update(1024 * 1024 + 1, 11)  # same instant: not drawn
    now[0] = 1.0
    bar.update(2 * 1024 * 1024, 20)
    bar.finish(2 * 1024 * 1024, 20)
    draws = out.getvalue().split("\r")[1:]
    assert draws[0] == "[#####.....]  50.0% 1.0/2.0 MiB 10 records"
    assert len(draws) == 3 and draws[-1].endswith("100.0% 2.0/2.0 MiB 20 records\n")


def test_produce_then_consume_round_trip_through_a_fake_broker(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    fake = FakeBroker()
    fake.create("t", 2)
    source = tmp_path / "in.txt"
    lines = [f"key-{i}:value {i}" for i in range(200)]
    source.write_text("\n".join(lines) + "\n")
    with serving(fake) as url:
        assert (
            cli.main(
                [
                    "--url",
                    url,
                    "produce",
                    "t",
                    "--file",
                    str(source),
                    "--key-separator",
                    ":",
                    "--compression",
                    "zstd",
                ]
            )
            == 0
        )
        assert b"produced 200 records" in capsysbinary.readouterr().err
        assert cli.main(["--url", url, "consume", "t", "--key-separator", ":"]) == 0
        out = capsysbinary.readouterr().out.decode().splitlines()
        assert sorted(out) == sorted(lines)
        assert (
            cli.main(
                [
                    "--url",
                    url,
                    "consume",
                    "t",
                    "--partition",
                    "0",
                    "--max-records",
                    "3",
                    "--output",
                    "json",
                ]
            )
            == 0
        )
        objects = [json.loads(x) for x in capsysbinary.readouterr().out.splitlines()]
        assert [o["offset"] for o in objects] == [0, 1, 2]
        assert all(o["partition"] == 0 and o["key"].startswith("key-") for o in objects)
