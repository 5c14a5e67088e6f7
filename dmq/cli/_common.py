"""What several `dmq` commands share: argument types, the usage error, table output.

The argument types keep the names they had in the single cli module: argparse prints a
type function's `__name__` when it raises ValueError (`invalid _separator value: ...`), so
the names are part of the command's output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from dmq.client import AsyncAdmin
from dmq.client._limits import DEFAULT_API_TIMEOUT_MS_DEFAULT

Subparsers = Any  # argparse's _SubParsersAction is private


class UsageError(Exception):
    """A command line that parses but makes no sense; exits with status 2."""


# --------------------------------------------------------------------------- parsing


def _config_item(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` for --config; an integer VALUE (e.g. -1) is sent as a JSON number.
    Kafka's spelling of a key (`retention.ms`) is taken for dmq's (`retention_ms`)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key = key.replace(".", "_")
    try:
        return key, int(value)
    except ValueError:
        return key, value


def _offset_spec(text: str) -> int | str:
    if text in ("earliest", "latest"):
        return text
    try:
        offset = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected earliest, latest or an offset, got {text!r}"
        ) from None
    if offset < 0:
        raise argparse.ArgumentTypeError("an offset is >= 0")
    return offset


# One spelling of a duration for every flag that takes one (`--delay`, `--from-time`'s
# "that long ago"): a number and its unit. A bare number is refused: `--delay 3` meant
# 3 ms to some and 3 s to others. Flags named `...-ms` take plain milliseconds.
_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
DURATION_HELP = "a number and its unit: 500ms, 30s, 2m, 1h, 7d"


def duration_ms(text: str) -> int:
    """`500ms`, `30s`, `2m`, `1h`, `7d` as milliseconds; a bare number has no unit and
    is refused, naming the spellings it could have meant."""
    text = text.strip()
    if text.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} has no unit: write {text}ms, {text}s, {text}m, {text}h or {text}d"
        )
    found = _DURATION.fullmatch(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration ({DURATION_HELP})")
    return int(found.group(1)) * _UNITS_MS[found.group(2)]


def parse_time_ms(text: str, now_ms: Callable[[], int] | None = None) -> int:
    """Milliseconds since the epoch, ISO 8601 (UTC unless it carries an offset), or a
    duration (`1h`, `30m`, ...) meaning that long before now."""
    if text.lstrip("-").isdigit():
        return int(text)
    if _DURATION.fullmatch(text.strip()):
        now = now_ms() if now_ms is not None else int(time.time() * 1000)
        return now - duration_ms(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected milliseconds since the epoch, ISO 8601 or a duration ago "
            f"({DURATION_HELP}), got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text) if text.isdigit() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def add_api_timeout(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """`--api-timeout-ms`, before the command or after it (suppress: keep the one given
    before), for every client a command builds."""
    parser.add_argument(
        "--api-timeout-ms",
        type=_positive_int,
        metavar="MS",
        default=argparse.SUPPRESS if suppress else DEFAULT_API_TIMEOUT_MS_DEFAULT,
        help="how long one admin or consumer call retries a broker that cannot answer now "
        f"(unreachable, no leader) before it fails ({DEFAULT_API_TIMEOUT_MS_DEFAULT}, "
        "Kafka's default.api.timeout.ms)",
    )


def admin_for(args: argparse.Namespace) -> AsyncAdmin:
    """The AsyncAdmin of a command: its --url, and its --api-timeout-ms for each call."""
    return AsyncAdmin(args.url, default_api_timeout_ms=args.api_timeout_ms)


def _separator(text: str) -> bytes:
    """A key separator; `\\t` and `\\n`-style escapes are understood (e.g. --key-separator '\\t')."""
    raw = text.encode("utf-8").decode("unicode_escape").encode("utf-8")
    if not raw:
        raise argparse.ArgumentTypeError("the key separator may not be empty")
    return raw


def comma_items(text: str) -> list[str]:
    """The non-empty items of a comma-separated argument, stripped."""
    return [item.strip() for item in text.split(",") if item.strip()]


# --------------------------------------------------------------------------- output


def add_output(parser: argparse.ArgumentParser) -> None:
    """`--output table|json` of a command that prints data (a table by default, as rpk);
    `--json`, the spelling before 0.2.0, is kept as a hidden alias of `--output json`."""
    parser.add_argument(
        "--output",
        choices=("table", "json"),
        default="table",
        help="table: columns for a person (default); json: the API's answer, for scripts",
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", help=argparse.SUPPRESS
    )


def print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2))


def cell(value: Any) -> str:
    """A table cell: "-" for nothing, lists and objects as compact JSON."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def print_fields(doc: dict[str, Any]) -> None:
    """One object of the API as a FIELD / VALUE table (a command that answers one thing)."""
    print_table([("FIELD", "VALUE"), *[(key, cell(value)) for key, value in doc.items()]])


def print_objects(items: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Objects of the API as a table: one row each, the given keys as columns."""
    print_table([tuple(columns), *[tuple(cell(item.get(c)) for c in columns) for item in items]])


def plural(count: int, word: str) -> str:
    """`1 record`, `2 records`, `0 records`: a count with its noun (regular plurals)."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def as_dict(value: Any) -> dict[str, Any]:
    """A value type (a dataclass) as JSON-ready data."""
    return dataclasses.asdict(value)


# Every table's header, as rpk's: upper-case words joined by hyphens (HIGH-WATERMARK,
# AGE-MS), whatever the caller spelled (high_watermark, "log start").
HEADER_STYLE = re.compile(r"[A-Z]+(-[A-Z]+)*")


def header_cell(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip()).upper()


def print_table(rows: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    """Left-aligned columns two spaces apart; the first row is the header (HEADER_STYLE)."""
    rows = [tuple(header_cell(cell) for cell in rows[0]), *rows[1:]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
        print(line.rstrip(), file=out or sys.stdout)
