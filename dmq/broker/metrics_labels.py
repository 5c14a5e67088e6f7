"""Label depth for GET /metrics: how many labels a family keeps so that its series stay
within `metrics_partitions_max` (metrics.py), and the family builder that applies it.

A family's rows are keyed by label values, most significant first ((topic, partition),
(group, topic, partition)). `series_depth` keeps as many leading labels as fit; a `Fold`
then sums (or, for a term or a lag, keeps the largest of) the values onto the remaining
labels. The keys are folded once per scrape and shared by every family over them: with
10,000 partitions a scrape folds 10,000 keys once, not once per family.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

Key = tuple[str, ...]  # label values, most significant first
Combine = Callable[[float, float], float]


def series_depth(keys: Iterable[Key], width: int, series_max: int) -> int:
    """How many leading labels to keep so that at most `series_max` series remain: `width`
    (all) if the keys fit, else fewer, down to 0 (one series)."""
    distinct = set(keys)
    for depth in range(width, 0, -1):
        if len({k[:depth] for k in distinct}) <= series_max:
            return depth
    return 0


def SUM(a: float, b: float) -> float:  # noqa: N802 - a constant-like combine, beside max
    return a + b


class Fold:
    """Distinct keys (one per row) folded onto their first `depth` values, once."""

    def __init__(self, keys: Sequence[Key], depth: int, labels: Sequence[str]) -> None:
        self.keys = keys
        self.depth = depth
        self.labels = list(labels[:depth])
        self._full = all(len(k) == depth for k in keys)  # nothing to fold
        self._folded = [k[:depth] for k in keys] if not self._full else []

    def values(self, values: Iterable[float], combine: Combine = SUM) -> Iterable[tuple[Key, float]]:  # fmt: skip
        """(label values, value) per series: the rows as they are at full depth (keys are
        distinct), else combined per folded key."""
        if self._full:
            return zip(self.keys, values, strict=True)
        out: dict[Key, float] = {}
        for k, v in zip(self._folded, values, strict=True):
            out[k] = combine(out[k], v) if k in out else v
        return out.items()

    def family(
        self,
        kind: Callable[..., GaugeMetricFamily | CounterMetricFamily],
        name: str,
        documentation: str,
        values: Iterable[float],
        combine: Combine = SUM,
    ) -> Metric:
        """A gauge or counter family (`kind`: GaugeMetricFamily, CounterMetricFamily)."""
        metric = kind(name, documentation, labels=self.labels)
        for key, value in self.values(values, combine):
            metric.add_metric(list(key), value)
        return metric


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
