"""The text exposition of the live-state families, written without prometheus_client's
general writer, byte for byte what `generate_latest` writes for them.

Why: `generate_latest` validates and escapes every label *name* of every sample and
formats each value through a general float routine, ~12 µs a sample here; a broker's
partition families are ~14 samples a partition, so a scrape of 600 partitions cost the
broker 90 ms of CPU (9% of produce at one scrape a second, `dmq bench metrics
--partitions 100`). The state collector's names and label names are fixed legacy-valid
identifiers, known here, so this writer escapes only label *values* and only when they
hold a character that needs it. tests/broker/test_broker_metrics_text.py holds it to
`generate_latest`'s bytes over any families of the kinds the collector yields.

Only what the state collector yields is handled: gauges, counters and histograms with no
timestamps and no `_created` samples (created series are off for the process,
metrics.py). Anything else is refused loudly rather than written differently.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

KINDS = {"gauge": "gauge", "counter": "counter", "histogram": "histogram"}
# Integers in this range print as Python's repr of their float ("12.0"), which is what
# floatToGoString gives them (it switches to exponents from 10**7 and for huge negatives).
_PLAIN_INT = 1_000_000


def _value(v: float) -> str:
    if type(v) is int and -_PLAIN_INT < v < _PLAIN_INT:
        return f"{v}.0"
    return str(floatToGoString(v))  # type: ignore[no-untyped-call]


def _label_value(v: str) -> str:
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return v


def render_text(metrics: Iterable[Metric]) -> str:
    out: list[str] = []
    append = out.append
    for metric in metrics:
        kind = KINDS.get(metric.type)
        if kind is None:
            raise ValueError(f"metrics_text writes no {metric.type!r} family ({metric.name})")
        name = metric.name + "_total" if kind == "counter" else metric.name
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        names: tuple[str, ...] = ()
        order: list[str] = []  # label names sorted, as generate_latest writes them
        for sample in metric.samples:
            if sample.timestamp is not None or sample.name.endswith("_created"):
                raise ValueError(f"metrics_text writes no timestamp or _created ({name})")
            labels = sample.labels
            if labels:
                if tuple(labels) != names:  # a family's samples share their names
                    names = tuple(labels)
                    order = sorted(names)
                pairs = ",".join([f'{k}="{_label_value(labels[k])}"' for k in order])
                append(f"{sample.name}{{{pairs}}} {_value(sample.value)}\n")
            else:
                append(f"{sample.name} {_value(sample.value)}\n")
    return "".join(out)
