"""A producer rides out a broker that is down for seconds; a deadline ends what it cannot.

Real `dmq serve` processes on loopback (tests_support.BrokerProcess), real HTTP. Proves:
- an idempotent producer with the default delivery_timeout_ms (120 s) that keeps sending
  while its broker is killed with SIGKILL, stays down 4 s and restarts delivers every
  record exactly once, in send order per partition, while a producer limited to the old
  default of 5 retries fails the record it sent during the outage with BrokerUnavailable;
- with the broker gone for good, a record fails by its delivery_timeout_ms (at most one
  backoff before it: a retry that would end past it is not made), with the last retriable
  error naming delivery_timeout_ms, and an admin call likewise by its
  default_api_timeout_ms.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from dmq import errors
from dmq.client import Admin, Consumer, Producer
from tests_support import BrokerProcess

OUTAGE_S = 4.0  # longer than the ~2.5-3 s that 5 retries with backoff last


def _send_steadily(producer: Producer, stop: threading.Event, sent: list[tuple[str, Any]]) -> None:
    """One record every 5 ms until `stop`: some are in flight when the broker dies."""
    i = 0
    while not stop.is_set():
        value = f"r{i:05d}"
        sent.append((value, producer.send("orders", value, key=f"k{i % 7}")))
        i += 1
        time.sleep(0.005)


def _read_all(url: str, partitions: int) -> list[tuple[int, int, str]]:
    with Admin(url) as admin:
        ends = {p: admin.offsets("orders", p).high_watermark for p in range(partitions)}
    out: list[tuple[int, int, str]] = []
    with Consumer(url) as consumer:
        consumer.assign([("orders", p) for p in range(partitions)])
        deadline = time.monotonic() + 20
        while len(out) < sum(ends.values()) and time.monotonic() < deadline:
            for r in consumer.poll(timeout_ms=500):
                out.append((r.partition, r.offset, (r.value or b"").decode()))
    return out


def test_an_idempotent_producer_rides_out_a_4_s_broker_outage_writing_each_record_once(
    broker_factory: Any,
) -> None:
    broker: BrokerProcess = broker_factory().start()
    with Admin(broker.url) as admin:
        admin.create_topic("orders", partitions=2)
    sent: list[tuple[str, Any]] = []
    stop = threading.Event()
    with (
        Producer(broker.url, idempotent=True, linger_ms=5, request_timeout_ms=2_000) as producer,
        Producer(broker.url, retries=5, linger_ms=0, request_timeout_ms=2_000) as old_default,
    ):
        old_default.send("orders", "warm-up").result(timeout=30)  # learns the topic
        sender = threading.Thread(target=_send_steadily, args=(producer, stop, sent))
        sender.start()
        try:
            time.sleep(0.5)
            broker.kill9()
            down_at = time.monotonic()
            during = old_default.send("orders", "old-default-during-the-outage")
            time.sleep(OUTAGE_S)
            broker.start()
            outage_s = time.monotonic() - down_at
            time.sleep(0.5)
        finally:
            stop.set()
            sender.join()
        results = [(value, future.result(timeout=60)) for value, future in sent]
        with pytest.raises(errors.BrokerUnavailable):
            during.result(timeout=30)
    assert outage_s >= OUTAGE_S
    # Every record acknowledged, once, at the offset the broker gave it.
    stored = _read_all(broker.url, 2)
    values = Counter(value for _, _, value in stored if value.startswith("r"))
    assert values == Counter(value for value, _ in sent), "lost or duplicated records"
    at = {(p, o): value for p, o, value in stored}
    assert all(at[(m.partition, m.offset)] == value for value, m in results)
    # Per partition, in send order.
    for p in (0, 1):
        offsets = [m.offset for _, m in results if m.partition == p]
        assert offsets == sorted(offsets) and len(offsets) == len(set(offsets))
    assert len(sent) > 200, len(sent)  # it kept sending all through the outage


def test_records_and_admin_calls_fail_at_their_deadline_once_the_broker_is_gone(
    broker_factory: Any,
) -> None:
    broker: BrokerProcess = broker_factory().start()
    with Producer(
        broker.url, linger_ms=0, request_timeout_ms=1_000, delivery_timeout_ms=2_500
    ) as producer:
        producer.send("gone", "warm-up").result(timeout=30)  # creates the topic, learns it
        broker.kill9()
        started = time.monotonic()
        future = producer.send("gone", "late")
        with pytest.raises(errors.BrokerUnavailable, match="delivery_timeout_ms 2500 ms"):
            future.result(timeout=30)
        took_s = time.monotonic() - started
    # By its deadline: no sooner than one backoff (at most 1.2 s, jitter included) before
    # it, when the next retry would end past it, and soon after it at the latest.
    assert 2.5 - 1.2 <= took_s < 4.0, took_s
    started = time.monotonic()
    with (
        Admin(broker.url, default_api_timeout_ms=1_500) as admin,
        pytest.raises(errors.BrokerUnavailable, match="default_api_timeout_ms 1500 ms"),
    ):
        admin.list_topics()
    assert 1.5 - 1.2 <= time.monotonic() - started < 3.0
