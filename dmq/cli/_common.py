"""What several `dmq` commands share: argument types, the usage error, table output.

The argument types keep the names they had in the single cli module: argparse prints a
type function's `__name__` when it raises ValueError (`invalid _separator value: ...`), so
the names are part of the command's output.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from dmq.client import AsyncAdmin
from dmq.client._limits import DEFAULT_API_TIMEOUT_MS_DEFAULT

Subparsers = Any  # argparse's _SubParsersAction is private


class UsageError(Exception):
    """A command line that parses but makes no sense; exits with status 2."""


# --------------------------------------------------------------------------- parsing


def _config_item(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` for --config; an integer VALUE (e.g. -1) is sent as a JSON number."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
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


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch, or ISO 8601 (UTC unless it carries an offset)."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected milliseconds since the epoch or ISO 8601, got {text!r}"
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


def as_dict(value: Any) -> dict[str, Any]:
    """A value type (a dataclass) as JSON-ready data."""
    return dataclasses.asdict(value)


def print_table(rows: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    """Left-aligned columns two spaces apart; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
        print(line.rstrip(), file=out or sys.stdout)
