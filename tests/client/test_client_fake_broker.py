"""The client speaks http_api/README.md: proven against a small in-process fake broker.

The fake (below) implements just what the README says for topics, produce (JSON and
`application/vnd.dmq.batch`), binary fetch with long-poll, offsets and errors, and records
every request, so each test can check both what the client sent and what it made of
the answers. It also injects failures. Proves that:
- the producer sends one binary RecordBatch per partition per linger, zstd-compressed when
  asked, with `?partition=N&acks=...`, keyed records on the murmur2 partition, and resolves
  each future with the offset the broker gave;
- a missing topic's first record goes alone as JSON (the broker auto-creates), later ones
  as batches; with auto-create off the record fails with TopicNotFound;
- retriable answers (503 with a delay) are retried and the record lands once; client
  errors (400) are never retried; connection failures become BrokerUnavailable;
- retries are bounded by time, not count: by default a record is retried past the old
  count of 5 until delivery_timeout_ms, then fails with the last retriable error naming
  it; a batch whose deadline passed while it waited behind another fails with
  RequestTimeout unsent; an admin call ends at default_api_timeout_ms; a delivery
  timeout below linger_ms + request_timeout_ms is refused naming the three;
- the consumer decodes binary fetches, drops records below its position when a batch
  starts earlier, follows X-Dmq-Next-Offset, long-polls with wait_ms (within the
  broker's bound, learnt from its 400 answer), seeks by name,
  offset and timestamp, and jumps to earliest on 416 (or raises with "none");
- the sync Producer/Consumer/Admin do the same through their background loop, and the
  sends of one thread keep their order through waits for metadata and buffer room.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from dmq import errors
from dmq.client import (
    Admin,
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    Producer,
    RecordMetadata,
)
from dmq.partitioner import partition_for_key
from log.records import (
    Codec,
    Header,
    Record,
    decode_batch,
    encode_batch,
    iter_batches,
    read_header,
    validate_batch,
    with_base_offset,
)

# --------------------------------------------------------------------------- the fake


@dataclass
class FakePartition:
    batches: list[bytes] = field(default_factory=list)  # stored, base offsets assigned
    log_start_offset: int = 0

    @property
    def log_end_offset(self) -> int:
        return read_header(self.batches[-1]).next_offset if self.batches else self.log_start_offset

    def append(self, batch: bytes) -> int:
        base = self.log_end_offset
        self.batches.append(with_base_offset(batch, base))
        return base

    def records(self) -> list[Record]:
        return [r for b in self.batches for r in decode_batch(b).records]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: bytes


class FakeBroker:
    """The README's routes the client uses, in memory. Not a broker: no limits, no raft."""

    def __init__(self, *, auto_create: bool = True) -> None:
        self.topics: dict[str, list[FakePartition]] = {}
        self.seen: list[Seen] = []
        self.failures: deque[tuple[int, str, dict[str, Any]]] = deque()
        self.auto_create = auto_create
        self.wait_ms_max = 30_000  # the broker's fetch_wait_ms_max

    def create(self, name: str, partitions: int = 1) -> None:
        self.topics[name] = [FakePartition() for _ in range(partitions)]

    def produced(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "POST" and s.path.endswith("/records")]

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/healthz", self._health)
        app.router.add_post("/v1/topics", self._create)
        app.router.add_get("/v1/topics/{topic}", self._describe)
        app.router.add_post("/v1/topics/{topic}/records", self._produce)
        app.router.add_get("/v1/topics/{topic}/partitions/{p}/records", self._fetch)
        app.router.add_get("/v1/topics/{topic}/partitions/{p}/offsets", self._offsets)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.seen.append(
            Seen(
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("Content-Type", ""),
                await request.read(),
            )
        )
        if self.failures:
            status, code, details = self.failures.popleft()
            if status == 0:  # ("stall"): answer, but only after stall_s
                await asyncio.sleep(details["stall_s"])
                return await handler(request)  # type: ignore[no-any-return]
            return error(status, code, f"injected {code}", **details)
        return await handler(request)  # type: ignore[no-any-return]

    def _partitions(self, request: web.Request) -> list[FakePartition]:
        topic = self.topics.get(request.match_info["topic"])
        if topic is None:
            raise FakeError(404, "topic_not_found", "no such topic")
        return topic

    def _partition(self, request: web.Request) -> FakePartition:
        partitions = self._partitions(request)
        p = int(request.match_info["p"])
        if not 0 <= p < len(partitions):
            raise FakeError(404, "partition_not_found", "no such partition")
        return partitions[p]

    def _description(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "replication_factor": 1,
            "config": {"retention_ms": 604800000},
            "partitions": [
                {
                    "partition": i,
                    "leader": "n1",
                    "replicas": ["n1"],
                    "log_start_offset": p.log_start_offset,
                    "high_watermark": p.log_end_offset,
                    "log_end_offset": p.log_end_offset,
                }
                for i, p in enumerate(self.topics[name])
            ],
        }

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["name"] in self.topics:
            return error(409, "topic_already_exists", "exists")
        self.create(body["name"], body.get("partitions", 1))
        return web.json_response(self._description(body["name"]), status=201)

    async def _describe(self, request: web.Request) -> web.Response:
        try:
            self._partitions(request)
        except FakeError as e:
            return e.response()
        return web.json_response(self._description(request.match_info["topic"]))

    async def _produce(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        if name not in self.topics:
            if not self.auto_create:
                return error(404, "topic_not_found", "auto_create_topics is off")
            self.create(name)
        partitions = self.topics[name]
        body = await request.read()
        if request.content_type == "application/vnd.dmq.batch":
            header = validate_batch(body)
            p = int(request.query["partition"])
            base = partitions[p].append(body)
            offsets = [{"partition": p, "offset": base + i} for i in range(header.record_count)]
        else:
            offsets = self._produce_json(partitions, await request.json())
        if request.query.get("acks") == "0":
            return web.json_response(
                {"offsets": [{"partition": o["partition"], "offset": None} for o in offsets]},
                status=202,
            )
        return web.json_response({"offsets": offsets})

    @staticmethod
    def _produce_json(partitions: list[FakePartition], body: dict[str, Any]) -> list[Any]:
        def raw(v: str | None) -> bytes | None:
            if v is None:
                return None
            return base64.b64decode(v) if body.get("value_encoding") == "base64" else v.encode()

        offsets = []
        for r in body["records"]:
            key = raw(r.get("key"))
            p = r.get("partition")
            if p is None:
                p = 0 if key is None else partition_for_key(key, len(partitions))
            headers = tuple(Header(h["key"], raw(h["value"]) or b"") for h in r.get("headers", []))
            record = Record(key, raw(r.get("value")), headers, r.get("timestamp", 0))
            offsets.append({"partition": p, "offset": partitions[p].append(encode_batch([record]))})
        return offsets

    async def _fetch(self, request: web.Request) -> web.Response:
        try:
            part = self._partition(request)
        except FakeError as e:
            return e.response()
        q = request.query
        offset = {"earliest": part.log_start_offset, "latest": part.log_end_offset}.get(
            q.get("offset", "earliest")
        )
        offset = int(q["offset"]) if offset is None else offset
        if not part.log_start_offset <= offset <= part.log_end_offset:
            return error(
                416,
                "offset_out_of_range",
                "out of range",
                offset=offset,
                log_start_offset=part.log_start_offset,
                log_end_offset=part.log_end_offset,
            )
        wait_ms = int(q.get("wait_ms", "0"))
        if wait_ms > self.wait_ms_max:
            return error(
                400, "invalid_request", "wait_ms too long", field="wait_ms", limit=self.wait_ms_max
            )
        deadline = time.monotonic() + wait_ms / 1000
        while offset == part.log_end_offset and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        chosen: list[bytes] = []
        for b in part.batches:
            if read_header(b).next_offset > offset and (
                not chosen or sum(map(len, chosen)) + len(b) <= int(q.get("max_bytes", 1 << 20))
            ):
                chosen.append(b)
        next_offset = read_header(chosen[-1]).next_offset if chosen else offset
        return web.Response(
            body=b"".join(chosen),
            content_type="application/vnd.dmq.batches",
            headers={
                "X-Dmq-Next-Offset": str(next_offset),
                "X-Dmq-High-Watermark": str(part.log_end_offset),
                "X-Dmq-Log-Start-Offset": str(part.log_start_offset),
            },
        )

    async def _offsets(self, request: web.Request) -> web.Response:
        try:
            part = self._partition(request)
        except FakeError as e:
            return e.response()
        answer: dict[str, Any] = {
            "partition": int(request.match_info["p"]),
            "log_start_offset": part.log_start_offset,
            "high_watermark": part.log_end_offset,
        }
        if "timestamp" in request.query:
            ts = int(request.query["timestamp"])
            answer["offset"] = next(
                (r.offset for r in part.records() if r.timestamp_ms >= ts), None
            )
        return web.json_response(answer)


class FakeError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        self.status, self.code, self.message = status, code, message

    def response(self) -> web.Response:
        return error(self.status, self.code, self.message)


def error(status: int, code: str, message: str, **details: Any) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message, "details": details}}, status=status
    )


@contextlib.contextmanager
def serving(fake: FakeBroker) -> Iterator[str]:
    """Run the fake on 127.0.0.1 (a free port) in a thread of its own; yield its URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[web.AppRunner, int]:
        runner = web.AppRunner(fake.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, runner.addresses[0][1]

    runner, port = asyncio.run_coroutine_threadsafe(start(), loop).result()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@pytest.fixture
def fake() -> FakeBroker:
    return FakeBroker()


@pytest.fixture
def url(fake: FakeBroker) -> Iterator[str]:
    with serving(fake) as address:
        yield address


# --------------------------------------------------------------------------- producer


def test_records_go_as_one_batch_per_partition_with_the_offsets_the_broker_gave(
    fake: FakeBroker, url: str
) -> None:
    fake.create("orders", 3)
    keys = [f"customer-{i}".encode() for i in range(30)]

    async def scenario() -> list[RecordMetadata]:
        async with AsyncProducer(url, linger_ms=50, compression="zstd") as producer:
            futures = [
                await producer.send(
                    "orders",
                    b"v%d" % i,
                    key=k,
                    headers={"h": f"{i}"},
                    timestamp_ms=1_700_000_000_000 + i,
                )
                for i, k in enumerate(keys)
            ]
            return list(await asyncio.gather(*futures))

    results = asyncio.run(scenario())
    posts = fake.produced()
    assert len(posts) == len({partition_for_key(k, 3) for k in keys})  # one per partition
    for post in posts:
        assert post.content_type == "application/vnd.dmq.batch"
        assert post.query["acks"] == "all"
        assert read_header(post.body).codec == Codec.ZSTD
    for i, (key, meta) in enumerate(zip(keys, results, strict=True)):
        assert meta.topic == "orders" and meta.partition == partition_for_key(key, 3)
        stored = fake.topics["orders"][meta.partition].records()[meta.offset or 0]
        assert (stored.key, stored.value) == (key, b"v%d" % i)
        assert stored.headers == (Header("h", str(i).encode()),)
        assert stored.timestamp_ms == 1_700_000_000_000 + i


def test_a_missing_topic_gets_its_first_record_as_json_then_batches(
    fake: FakeBroker, url: str
) -> None:
    with Producer(url, linger_ms=1) as producer:
        first = producer.send("fresh", b"one", key=b"k1").result(timeout=10)
        rest = [producer.send("fresh", b"more", key=b"k2") for _ in range(5)]
        producer.flush()
    assert first == RecordMetadata("fresh", 0, 0)
    assert [f.result().offset for f in rest] == [1, 2, 3, 4, 5]
    kinds = [p.content_type for p in fake.produced()]
    assert kinds[0] == "application/json"
    assert set(kinds[1:]) == {"application/vnd.dmq.batch"}
    assert [r.value for r in fake.topics["fresh"][0].records()] == [b"one"] + [b"more"] * 5


def test_sends_of_one_thread_keep_their_order_through_waits_for_metadata_and_room(
    fake: FakeBroker, url: str
) -> None:
    # A new topic (the first record goes as JSON while the rest wait), small batches and
    # a buffer of two batches (sends wait for room): the order must survive all of it.
    values = [b"%05d" % i for i in range(3000)]
    with Producer(url, linger_ms=1, batch_bytes=4096, buffer_bytes=8192) as producer:
        futures = [producer.send("ordered", v) for v in values]
        producer.flush()
        assert all(f.done() for f in futures)  # flush covers sends still being handed off
    assert [f.result().offset for f in futures] == list(range(len(values)))
    assert [r.value for r in fake.topics["ordered"][0].records()] == values
    assert len(fake.produced()) > 10


def test_sends_started_in_order_by_many_tasks_land_in_that_order(
    fake: FakeBroker, url: str
) -> None:
    """Sends that find nothing to wait for skip the producer's locks (#22), but never
    while an earlier send still waits in them: a second wave of tasks, started while the
    first waits for the new topic's metadata and for room in a small buffer, lands after
    all of it, in order."""

    async def waves() -> list[int]:
        async with AsyncProducer(url, linger_ms=1, batch_bytes=2048, buffer_bytes=4096) as producer:
            sends = [
                asyncio.ensure_future(producer.send("waves", b"a%04d" % i)) for i in range(300)
            ]
            for i in range(300):
                sends.append(asyncio.ensure_future(producer.send("waves", b"b%04d" % i)))
                await asyncio.sleep(0)  # let the first wave move through its waits
            futures = [await send for send in sends]
            return [(await future).offset for future in futures]

    offsets = asyncio.run(waves())
    assert offsets == list(range(600))
    values = [r.value for r in fake.topics["waves"][0].records()]
    assert values == [b"a%04d" % i for i in range(300)] + [b"b%04d" % i for i in range(300)]


def test_a_send_cancelled_while_it_waits_for_room_is_not_waited_for_by_flush(
    fake: FakeBroker, url: str
) -> None:
    """A send whose task is cancelled while it waits for buffer room is not sent, and a
    flush (or close) does not wait for it: before, its record stayed undelivered for
    ever and flush hung."""
    fake.create("t")

    async def scenario() -> int:
        async with AsyncProducer(
            url, linger_ms=0, batch_bytes=1024, buffer_bytes=1024, retry_backoff_ms=1
        ) as producer:
            await producer.send_and_wait("t", b"warm-up")  # the topic's metadata is known
            fake.failures.extend([(503, "not_leader", {"retry_after_ms": 50})] * 6)
            first = await producer.send("t", b"x" * 600)  # holds the room while retried
            waiting = asyncio.ensure_future(producer.send("t", b"y" * 600))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # waiting for room
            waiting.cancel()
            await asyncio.wait_for(producer.flush(), 10)
            return (await first).offset

    assert asyncio.run(asyncio.wait_for(scenario(), 20)) == 1
    assert [r.value for r in fake.topics["t"][0].records()] == [b"warm-up", b"x" * 600]


def test_without_auto_create_a_missing_topic_fails_the_record() -> None:
    fake = FakeBroker(auto_create=False)
    with serving(fake) as url, Producer(url) as producer:
        future = producer.send("nope", b"x")
        with pytest.raises(errors.TopicNotFound):
            future.result(timeout=10)


def test_retriable_answers_are_retried_and_the_record_lands_once(
    fake: FakeBroker, url: str
) -> None:
    fake.create("t")
    with Producer(url, retry_backoff_ms=1) as producer:
        producer.send("t", b"warm-up").result(timeout=10)  # metadata is cached now
        fake.failures.extend([(503, "not_leader", {"retry_after_ms": 5})] * 2)
        meta = producer.send("t", b"x").result(timeout=10)
    assert meta.offset == 1
    assert [r.value for r in fake.topics["t"][0].records()] == [b"warm-up", b"x"]
    assert len(fake.produced()) == 2 + 2  # two refused attempts, then the one that worked


def test_client_errors_are_not_retried(fake: FakeBroker, url: str) -> None:
    fake.create("t")
    with Producer(url, retry_backoff_ms=1) as producer:
        producer.send("t", b"warm-up").result(timeout=10)
        fake.failures.append((400, "invalid_request", {"field": "batch"}))
        future = producer.send("t", b"x")
        with pytest.raises(errors.InvalidRequest) as caught:
            future.result(timeout=10)
    assert caught.value.field == "batch"
    assert len(fake.produced()) == 2


def test_retries_run_out_with_the_last_retriable_error(fake: FakeBroker, url: str) -> None:
    fake.create("t")
    fake.failures.extend([(429, "backpressure", {"retry_after_ms": 1})] * 10)
    with Admin(url, retries=2) as admin, pytest.raises(errors.Backpressure):
        admin.describe_topic("t")
    assert len(fake.seen) == 3


def test_retries_go_on_past_the_old_count_of_five_by_default(fake: FakeBroker, url: str) -> None:
    fake.create("t")
    with Producer(url, retry_backoff_ms=1) as producer:
        producer.send("t", b"warm-up").result(timeout=10)
        fake.failures.extend([(503, "not_leader", {"retry_after_ms": 5})] * 20)
        assert producer.send("t", b"x").result(timeout=10).offset == 1
    assert len(fake.produced()) == 2 + 20


def test_a_record_fails_at_its_delivery_timeout_with_the_last_error_naming_it(
    fake: FakeBroker, url: str
) -> None:
    fake.create("t")
    with Producer(url, linger_ms=0, request_timeout_ms=500, delivery_timeout_ms=800) as producer:
        producer.send("t", b"warm-up").result(timeout=10)
        fake.failures.extend([(503, "not_leader", {"retry_after_ms": 50})] * 1000)
        started = time.monotonic()
        future = producer.send("t", b"x")
        # The last answer's error, or, when the deadline cut an attempt short (a loaded
        # machine), that attempt's RequestTimeout: either names the deadline.
        with pytest.raises(
            (errors.NotLeader, errors.RequestTimeout), match="delivery_timeout_ms 800 ms"
        ) as caught:
            future.result(timeout=10)
        took_s = time.monotonic() - started
    # Retried about 800 ms (one 50 ms wait short of it); the bound leaves room for a loaded
    # full run, and is far below what no deadline would give (1,000 refusals).
    assert 0.6 <= took_s < 5.0, took_s
    assert caught.value.details["delivery_timeout_ms"] == 800
    assert len(fake.produced()) > 1 + 5  # more than the old count of retries


def test_a_batch_whose_deadline_passed_behind_another_fails_unsent(
    fake: FakeBroker, url: str
) -> None:
    fake.create("t")

    async def scenario() -> list[BaseException | None]:
        async with AsyncProducer(
            url, linger_ms=0, batch_bytes=200, request_timeout_ms=600, delivery_timeout_ms=600
        ) as producer:
            await (await producer.send("t", b"warm-up"))
            fake.failures.append((0, "stall", {"stall_s": 1.5}))
            # Two batches of one record each, in one tick: the same deadline (within
            # microseconds). The first one's attempt is cut at that deadline.
            first = await producer.send("t", b"x" * 120)
            second = await producer.send("t", b"y" * 120)
            await asyncio.wait([first, second])
            return [first.exception(), second.exception()]

    first, second = asyncio.run(scenario())
    assert isinstance(first, errors.RequestTimeout), first
    assert "gave up after 1 attempt: delivery_timeout_ms 600 ms" in str(first), first
    assert isinstance(second, errors.RequestTimeout), second
    assert "1 record(s) for t-0: delivery_timeout_ms (600 ms) passed before it could be sent" in (
        str(second)
    )
    assert len(fake.produced()) == 2  # the warm-up and the stalled one: never the second


def test_an_admin_call_retries_until_default_api_timeout_ms(fake: FakeBroker, url: str) -> None:
    fake.create("t")
    fake.failures.extend([(429, "backpressure", {"retry_after_ms": 20})] * 1000)
    started = time.monotonic()
    with (
        Admin(url, default_api_timeout_ms=500) as admin,
        pytest.raises(
            (errors.Backpressure, errors.RequestTimeout), match="default_api_timeout_ms 500 ms"
        ),
    ):
        admin.describe_topic("t")
    assert 0.3 <= time.monotonic() - started < 5.0  # as above: room for a loaded run
    assert len(fake.seen) > 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delivery_timeout_ms": 1000},
         r"delivery_timeout_ms \(1000\) must be >= linger_ms \(5\) \+ request_timeout_ms \(30000\)"),
        ({"delivery_timeout_ms": 1000, "request_timeout_ms": 996}, r"linger_ms \(5\)"),
        ({"delivery_timeout_ms": 0}, "delivery_timeout_ms must be an int >= 1"),
        ({"retries": -1}, "retries must be an int >= 0"),
        ({"default_api_timeout_ms": 0}, "default_api_timeout_ms must be an int >= 1"),
    ],
)  # fmt: skip
def test_timeouts_are_checked_as_kafka_does(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AsyncProducer("http://127.0.0.1:9", **kwargs)


def test_acks_zero_resolves_without_an_offset(fake: FakeBroker, url: str) -> None:
    fake.create("t")
    with Producer(url, acks="0") as producer:
        assert producer.send("t", b"x").result(timeout=10) == RecordMetadata("t", 0, None)
    assert fake.produced()[-1].query["acks"] == "0"


def test_an_unreachable_broker_is_broker_unavailable() -> None:
    admin = Admin("http://127.0.0.1:9", retries=1, retry_backoff_ms=1)
    with admin, pytest.raises(errors.BrokerUnavailable):
        admin.list_topics()


def test_explicit_partition_out_of_range_fails_the_record(fake: FakeBroker, url: str) -> None:
    fake.create("t", 2)
    with Producer(url) as producer:
        with pytest.raises(errors.PartitionNotFound):
            producer.send("t", b"x", partition=2).result(timeout=10)
        with pytest.raises(ValueError):
            producer.send("t", b"x", partition=-1)


# --------------------------------------------------------------------------- consumer


def fill(fake: FakeBroker, topic: str, batches: list[list[bytes]], partition: int = 0) -> None:
    if topic not in fake.topics:
        fake.create(topic)
    ts = 1_000
    for values in batches:
        records = []
        for v in values:
            records.append(Record(b"k-" + v, v, (Header("n", v),), ts))
            ts += 10
        fake.topics[topic][partition].append(encode_batch(records, codec=Codec.ZSTD))


def test_consumer_reads_back_in_order_skipping_records_below_its_position(
    fake: FakeBroker, url: str
) -> None:
    fill(fake, "t", [[b"a", b"b", b"c"], [b"d", b"e"]])

    async def scenario() -> list[tuple[int, bytes | None]]:
        async with AsyncConsumer(url) as consumer:
            consumer.assign([("t", 0)])
            consumer.seek("t", 0, 1)  # inside the first batch
            records = await consumer.poll(timeout_ms=1000)
            assert await consumer.position(("t", 0)) == 5
            assert records[0].headers == (("n", b"b"),) and records[0].key == b"k-b"
            assert records[0].timestamp_ms == 1_010
            return [(r.offset, r.value) for r in records]

    assert asyncio.run(scenario()) == [(1, b"b"), (2, b"c"), (3, b"d"), (4, b"e")]
    fetch = next(s for s in fake.seen if s.path.endswith("/records") and s.method == "GET")
    assert fetch.query["format"] == "binary" and fetch.query["offset"] == "1"


def test_poll_long_polls_and_wakes_when_a_record_arrives(fake: FakeBroker, url: str) -> None:
    fill(fake, "t", [[b"a"]])
    with Consumer(url, topic="t", auto_offset_reset="latest") as consumer:
        assert consumer.position(("t", 0)) == 1
        threading.Timer(0.2, lambda: fill(fake, "t", [[b"late"]])).start()
        started = time.monotonic()
        records = consumer.poll(timeout_ms=5000)
        waited = time.monotonic() - started
    assert [r.value for r in records] == [b"late"]
    assert 0.15 < waited < 4
    assert any(int(s.query.get("wait_ms", "0")) > 1000 for s in fake.seen)


def test_poll_returns_empty_when_nothing_arrives_in_time(fake: FakeBroker, url: str) -> None:
    fake.create("t")
    with Consumer(url, topic="t") as consumer:
        started = time.monotonic()
        assert consumer.poll(timeout_ms=200) == []
        assert 0.15 < time.monotonic() - started < 3


def test_a_broker_with_a_shorter_long_poll_bound_is_obeyed(fake: FakeBroker, url: str) -> None:
    fake.create("t")
    fake.wait_ms_max = 100
    with Consumer(url, topic="t") as consumer:
        assert consumer.poll(timeout_ms=500) == []
    waits = [int(s.query["wait_ms"]) for s in fake.seen if "wait_ms" in s.query]
    assert waits[0] > 100 and max(waits[1:]) <= 100


def test_seek_by_name_and_by_timestamp(fake: FakeBroker, url: str) -> None:
    fill(fake, "t", [[b"a", b"b"], [b"c", b"d"]])  # timestamps 1000, 1010, 1020, 1030
    with Consumer(url) as consumer:
        consumer.assign([("t", 0)])
        consumer.seek_to_timestamp("t", 0, 1_015)
        assert [r.value for r in consumer.poll(1000)] == [b"c", b"d"]
        consumer.seek("t", 0, "earliest")
        assert consumer.position(("t", 0)) == 0
        consumer.seek("t", 0, "latest")
        assert consumer.position(("t", 0)) == 4
        consumer.seek_to_timestamp("t", 0, 9_999)  # later than every record: the end
        assert consumer.position(("t", 0)) == 4


def test_out_of_range_jumps_to_earliest_or_raises_with_none(fake: FakeBroker, url: str) -> None:
    fill(fake, "t", [[b"a", b"b"], [b"c"]])
    part = fake.topics["t"][0]
    part.batches.pop(0)  # retention deleted the first batch
    part.log_start_offset = 2
    with Consumer(url) as consumer:
        consumer.assign([("t", 0)])
        consumer.seek("t", 0, 0)
        assert [(r.offset, r.value) for r in consumer.poll(1000)] == [(2, b"c")]
    with Consumer(url, auto_offset_reset="none") as strict:
        strict.assign([("t", 0)])
        strict.seek("t", 0, 0)
        with pytest.raises(errors.OffsetOutOfRange) as caught:
            strict.poll(1000)
        assert caught.value.log_start_offset == 2
        strict.assign([("t", 0)])  # no position now, and "none" will not make one up
        strict.seek("t", 0, 0)
        strict.assign([])
        strict.assign([("t", 0)])
        with pytest.raises(errors.InvalidRequest):
            strict.poll(100)


def test_topic_argument_reads_every_partition(fake: FakeBroker, url: str) -> None:
    fake.create("t", 3)
    for p in range(3):
        fill(fake, "t", [[b"p%d" % p]], partition=p)
    with Consumer(url, topic="t") as consumer:
        got: list[Any] = []
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            got += consumer.poll(500)
        assert sorted((r.partition, r.value) for r in got) == [(0, b"p0"), (1, b"p1"), (2, b"p2")]
        assert sorted(consumer.assignment()) == [("t", 0), ("t", 1), ("t", 2)]


def test_a_corrupt_batch_is_never_handed_to_the_user(fake: FakeBroker, url: str) -> None:
    fill(fake, "t", [[b"a"]])
    stored = bytearray(fake.topics["t"][0].batches[0])
    stored[-1] ^= 0xFF  # flip bits in the records section: the CRC no longer matches
    fake.topics["t"][0].batches[0] = bytes(stored)
    with Consumer(url, topic="t") as consumer, pytest.raises(errors.StorageError):
        consumer.poll(1000)


def test_admin_round_trip(fake: FakeBroker, url: str) -> None:
    async def scenario() -> None:
        async with AsyncAdmin(url) as admin:
            created = await admin.create_topic("t", partitions=2)
            assert created.partition_count == 2 and created.partitions[1].leader == "n1"
            with pytest.raises(errors.TopicAlreadyExists):
                await admin.create_topic("t")
            offsets = await admin.offsets("t", 1)
            assert (offsets.log_start_offset, offsets.high_watermark, offsets.offset) == (
                0,
                0,
                None,
            )
            with pytest.raises(errors.TopicNotFound):
                await admin.describe_topic("nope")

    asyncio.run(scenario())
    assert fake.seen[0].body == b'{"name": "t", "partitions": 2}'


def test_decoded_batches_cover_what_the_producer_encoded(fake: FakeBroker, url: str) -> None:
    # End to end through the fake: what the producer encodes, the consumer decodes.
    fake.create("t", 2)
    with Producer(url, compression="zstd", batch_bytes=2048) as producer:
        futures = [producer.send("t", b"x" * 100, key=b"%d" % i) for i in range(100)]
        producer.flush()
    metas = [f.result() for f in futures]
    with Consumer(url, topic="t") as consumer:
        got: list[Any] = []
        while len(got) < 100:
            batch = consumer.poll(1000)
            assert batch
            got += batch
    assert sorted((r.partition, r.offset, r.key) for r in got) == sorted(
        (m.partition, m.offset, b"%d" % i) for i, m in enumerate(metas)
    )
    sizes = [len(s.body) for s in fake.produced()]
    assert len(sizes) > 2  # batch_bytes split the records into several batches
    for part in fake.topics["t"]:
        for _, header in iter_batches(b"".join(part.batches)):
            assert header.codec == Codec.ZSTD
