"""Label depth for GET /metrics: how many labels a family keeps so that its series stay
within `metrics_partitions_max` (metrics.py), and the family builders that apply it.

A family's rows are keyed by label values, most significant first ((topic, partition),
(group, topic, partition)). `series_depth` keeps as many leading labels as fit; the rows
are then summed (or, for a term or a lag, the largest kept) onto the remaining labels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

Row = tuple[tuple[str, ...], float]  # (label values, most significant first; value)


def series_depth(keys: Iterable[tuple[str, ...]], width: int, series_max: int) -> int:
    """How many leading labels to keep so that at most `series_max` series remain: `width`
    (all) if the keys fit, else fewer, down to 0 (one series)."""
    distinct = set(keys)
    for depth in range(width, 0, -1):
        if len({k[:depth] for k in distinct}) <= series_max:
            return depth
    return 0


def aggregate(rows: Iterable[Row], depth: int, combine: Callable[[float, float], float] = max) -> dict[tuple[str, ...], float]:  # fmt: skip
    """Rows folded onto their first `depth` label values with `combine` (sum or max)."""
    out: dict[tuple[str, ...], float] = {}
    for key, value in rows:
        k = key[:depth]
        out[k] = combine(out[k], value) if k in out else value
    return out


def _sum(a: float, b: float) -> float:
    return a + b


SUM = _sum


def family(
    kind: Callable[..., GaugeMetricFamily | CounterMetricFamily],
    name: str,
    documentation: str,
    labels: tuple[str, ...],
    rows: Iterable[Row],
    depth: int,
    combine: Callable[[float, float], float] = SUM,
) -> Metric:
    """A gauge or counter family (`kind`: GaugeMetricFamily, CounterMetricFamily) of the
    rows at `depth` labels."""
    metric = kind(name, documentation, labels=list(labels[:depth]))
    for key, value in sorted(aggregate(rows, depth, combine).items()):
        metric.add_metric(list(key), value)
    return metric


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
