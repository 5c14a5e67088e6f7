"""`GET /metrics`: one broker's Prometheus registry (dmq/README.md, "Metrics").

The registry is this broker's own `CollectorRegistry`, never prometheus_client's global
one: a test may run several brokers in one process, and each must show only its own
figures. It holds three collectors:

- `ProcessCollector`: CPU seconds, resident memory, open descriptors, start time
  (`process_*`, from /proc);
- the request latency histogram `dmq_http_request_duration_seconds{method, route,
  status_class}`, observed by http_api/metrics.py's middleware (route: the route template,
  never the raw path, so its values are bounded by the routes);
- `StateCollector` (metrics_state.py): everything else, read from live state at scrape
  time (offsets, Raft, groups, storage, ...), plus traffic.py's produce and fetch counters,
  the only bookkeeping on the request path. Its families are written by metrics_text.py
  (the same bytes as prometheus_client's writer, several times cheaper a sample), after
  the registry's own, so it is not in the registry.

Label cardinality is bounded by `metrics_partitions_max` (`series_depth`): partition
metrics carry {topic, partition} while the partitions this broker hosts number at most
that, {topic} (summed, or the largest) above it, and no label with more topics than that.
The same names are kept at every depth, so `sum by (topic) (...)` queries work at any.
"""

from __future__ import annotations

import asyncio
import contextlib

import prometheus_client
from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest

from dmq.broker.context import BrokerContext
from dmq.broker.fetch import FetchService
from dmq.broker.metrics_state import StateCollector
from dmq.broker.metrics_text import render_text
from dmq.broker.storage import StorageService

# `*_created` series double every counter and histogram for a timestamp that Prometheus
# itself does not use; off for the whole process (the flag is prometheus_client's, global).
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

# The classic text format, which every Prometheus reads. Written literally: newer clients'
# CONTENT_TYPE_LATEST says version=1.0.0 (UTF-8 names), which older servers do not know;
# dmq's names are all legacy-valid, so the body is the same either way.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Request latency: ~1 ms for an offsets lookup, ~2-20 ms for an acks=all produce on a
# local disk, up to fetch_wait_ms_max (30 s by default) for a long-poll that waits.
REQUEST_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
RAFT_READ_TIMEOUT_S = 2.0  # the scrape's one wait for the Raft tick thread
UNMATCHED_ROUTE = "unmatched"  # a path no route matched (404/405): one series, not one a path


class MetricsService:
    """This broker's registry and its scrape (module docstring)."""

    def __init__(self, ctx: BrokerContext, fetch: FetchService, storage: StorageService) -> None:
        self._ctx = ctx
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self._request_seconds = Histogram(
            "dmq_http_request_duration_seconds",
            "HTTP requests answered by this broker, by route template and status class",
            ["method", "route", "status_class"],
            buckets=REQUEST_BUCKETS_S,
            registry=self.registry,
        )
        self.state = StateCollector(ctx, fetch, storage)  # written by render_text
        self._one_scrape = asyncio.Lock()

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        status_class = f"{status // 100}xx" if 100 <= status < 600 else "other"
        self._request_seconds.labels(method, route, status_class).observe(seconds)

    async def render(self) -> bytes:
        """The text exposition, one scrape at a time. The one part that needs the Raft
        tick thread (followers out of sync, for under-replicated partitions) is fetched
        first, in one hop; the rest is written on a worker thread, so that the event loop
        goes on serving during a large scrape (~60-90 ms at 1,000 partitions: dmq/README.md,
        "Metrics"). What the collector reads from there is safe to read from another
        thread: copies taken in one C call, ints, and the catalogue's immutable state."""
        async with self._one_scrape:
            # On the loop: log/space.py's guard is the loop's (its admission estimate).
            self.state.storage_report = self.state.storage_service.report()
            node = self._ctx.raft_node
            self.state.out_of_sync = {}
            if node is not None:
                # Bounded: a tick thread busy for longer (a large snapshot) must not hold
                # the scrape; under-replication then reads 0 for this one scrape.
                with contextlib.suppress(TimeoutError):
                    self.state.out_of_sync = await asyncio.wait_for(
                        node.followers_out_of_sync(self.state.lag_s), RAFT_READ_TIMEOUT_S
                    )
            return await asyncio.to_thread(self._text)

    def _text(self) -> bytes:
        return generate_latest(self.registry) + render_text(self.state.collect()).encode()
