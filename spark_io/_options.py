"""The source's and sink's options (named as Spark's Kafka source names them), checked
once on the driver, and the offsets they resolve to.

Offsets JSON (startingOffsets, endingOffsets, and the streaming offsets Spark checkpoints)
is Kafka's: `{"orders": {"0": 23, "1": -2}}`, partition numbers as strings, -2 the
earliest offset and -1 the latest (the high watermark). A partition left out of a
startingOffsets/endingOffsets JSON takes the default (earliest / latest).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from dmq.client import Admin
from spark_io._brokers import Credentials, parse_urls, use_credentials

EARLIEST = -2
LATEST = -1
FETCH_BYTES_DEFAULT = 8 * 1024 * 1024  # the broker's fetch_bytes_max default; Arrow batch size
FETCH_BYTES_MIN = 1024

# {"topic": {"partition": offset}}: what startingOffsets JSON and Spark's checkpoints hold.
OffsetMap = dict[str, dict[str, int]]


class OptionError(ValueError):
    """An option that cannot be used; the message names the option."""


@dataclass(frozen=True, slots=True)
class Boundary:
    """Where a range starts or ends: per-partition offsets (with -2/-1), a timestamp in
    ms, or one of "earliest"/"latest" for every partition."""

    default: int  # EARLIEST or LATEST, for partitions not named in `offsets`
    offsets: Mapping[str, Mapping[str, int]] | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    urls: tuple[str, ...]
    topics: tuple[str, ...]  # empty when topic_pattern is used
    topic_pattern: str | None
    starting: Boundary
    ending: Boundary
    min_partitions: int | None
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    include_headers: bool
    fetch_bytes: int
    # Pushed down to the broker (dmq/selector.py): the `tags` and `filter` options, as
    # the fetch's query parameters; the broker drops what does not match before sending.
    record_filter: tuple[tuple[str, str], ...] = ()
    # read_committed (the default, unlike Kafka's source): only committed transactions'
    # records, up to each partition's last stable offset; read_uncommitted: everything.
    isolation: str = "read_committed"
    # token, ca, cert, key (spark_io/_brokers.py, use_credentials).
    credentials: Credentials = field(default_factory=Credentials)


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def urls_option(options: Mapping[str, str]) -> tuple[str, ...]:
    opts = _lower(options)
    value = opts.get("urls") or opts.get("url")
    if value is None:
        raise OptionError("option url (or urls) is required: the broker URLs, comma-separated")
    try:
        return parse_urls(value)
    except ValueError as exc:
        raise OptionError(str(exc)) from exc


def _int(opts: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name} must be at least {minimum}, got {value}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, got {raw!r}")
    return raw.lower() == "true"


def _boundary(opts: Mapping[str, str], which: str, default: int) -> Boundary:
    offsets_name, ts_name = f"{which}Offsets", f"{which}Timestamp"
    raw, ts = opts.get(offsets_name.lower()), _int(opts, ts_name, 0)
    if raw is not None and ts is not None:
        raise OptionError(f"give {offsets_name} or {ts_name}, not both")
    if ts is not None:
        return Boundary(default, timestamp_ms=ts)
    if raw is None or raw.strip() == "":
        return Boundary(default)
    text = raw.strip()
    if text in ("earliest", "latest"):
        if which == "ending" and text == "earliest":
            raise OptionError("option endingOffsets cannot be earliest")
        return Boundary(EARLIEST if text == "earliest" else LATEST)
    return Boundary(default, offsets=parse_offset_json(text, offsets_name, which == "ending"))


def parse_offset_json(text: str, name: str, ending: bool = False) -> OffsetMap:
    """Kafka's per-partition offsets JSON, checked; -2 (earliest) is refused at the end."""
    try:
        parsed = json.loads(text)
    except ValueError:
        raise OptionError(f"option {name}: not earliest, latest or JSON: {text!r}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f'option {name}: JSON must be {{"topic": {{"partition": offset}}}}')
    result: OffsetMap = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option {name}: topic {topic!r} needs an object of partitions")
        result[topic] = {}
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or type(offset) is not int or offset < EARLIEST:
                raise OptionError(
                    f"option {name}: {topic}/{partition}: need a partition number and an "
                    f"offset >= -2, got {offset!r}"
                )
            if ending and offset == EARLIEST:
                raise OptionError(f"option {name}: {topic}/{partition}: -2 (earliest) as an end")
            result[topic][str(int(partition))] = offset
    return result


def read_options(options: Mapping[str, str], streaming: bool) -> ReadOptions:
    """Every read option checked; streaming starts at latest by default, batch at earliest
    (as Spark's Kafka source)."""
    opts = _lower(options)
    topics = tuple(t.strip() for t in opts.get("topic", "").split(",") if t.strip())
    pattern = opts.get("topicpattern")
    if bool(topics) == bool(pattern):
        raise OptionError("give exactly one of the options topic and topicPattern")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option topicPattern: {exc}") from None
    if streaming and ("endingoffsets" in opts or "endingtimestamp" in opts):
        raise OptionError("endingOffsets/endingTimestamp are for batch queries only")
    return ReadOptions(
        urls=urls_option(opts),
        topics=topics,
        topic_pattern=pattern,
        starting=_boundary(opts, "starting", LATEST if streaming else EARLIEST),
        ending=_boundary(opts, "ending", LATEST),
        min_partitions=_int(opts, "minPartitions", 1),
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", 1),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        fetch_bytes=_int(opts, "fetchMaxBytes", FETCH_BYTES_MIN) or FETCH_BYTES_DEFAULT,
        record_filter=tuple((k, opts[k]) for k in ("tags", "filter") if opts.get(k)),
        isolation=_isolation(opts),
        credentials=_credentials(opts),
    )


def _credentials(opts: Mapping[str, str]) -> Credentials:
    try:
        credentials = Credentials.from_options(opts)
    except ValueError as exc:
        raise OptionError(str(exc)) from exc
    use_credentials(credentials)  # the driver's clients: planning, offsets
    return credentials


def _isolation(opts: Mapping[str, str]) -> str:
    value = opts.get("isolation", "read_committed")
    if value not in ("read_committed", "read_uncommitted"):
        raise OptionError(
            f"option isolation must be read_committed or read_uncommitted, got {value!r}"
        )
    return value


def matching_topics(admin: Admin, options: ReadOptions) -> list[str]:
    if options.topic_pattern is None:
        return list(options.topics)
    pattern = re.compile(options.topic_pattern)
    return sorted(t.name for t in admin.list_topics() if pattern.fullmatch(t.name))
