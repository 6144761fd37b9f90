"""Scrape a Prometheus `/metrics` endpoint and index its samples by name.

Parsing is `prometheus_client`'s own text parser; this module only indexes the result so
that adapters can ask for one value (summed over label sets) or one histogram.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Label sets that repeat one engine's state per tensor/pipeline rank: only rank 0 counts.
_RANK_LABELS = ("tp_rank", "pp_rank")


@dataclass
class Histogram:
    """A cumulative histogram: `buckets` are (upper bound, cumulative count), ending at +Inf."""

    buckets: list[tuple[float, float]]
    sum: float
    count: float

    def __post_init__(self) -> None:
        assert all(a[0] < b[0] for a, b in pairwise(self.buckets)), "unsorted"


@dataclass
class Scrape:
    """One parsed exposition: sample name -> [(labels, value)], family name -> type."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    @property
    def names(self) -> set[str]:
        return set(self.samples)

    def has(self, name: str) -> bool:
        return name in self.samples

    def series(self, name: str) -> list[tuple[dict[str, str], float]]:
        rows = self.samples.get(name, [])
        return [(lb, v) for lb, v in rows if all(lb.get(k, "0") == "0" for k in _RANK_LABELS)]

    def value(self, name: str, how: str = "sum") -> float | None:
        """One number for `name` over its label sets ("sum" or "mean"); None when absent."""
        vals = [v for _, v in self.series(name) if not math.isnan(v)]
        if not vals:
            return None
        return sum(vals) if how == "sum" else sum(vals) / len(vals)

    def histogram(self, name: str) -> Histogram | None:
        """The histogram family `name`, bucket counts summed over label sets; None if absent."""
        rows = [(lb, v) for lb, v in self.series(name + "_bucket") if "le" in lb]
        if not rows:
            return None
        by_le: dict[float, float] = {}
        for labels, v in rows:
            le = float(labels["le"])
            by_le[le] = by_le.get(le, 0.0) + v
        buckets = sorted(by_le.items())
        if buckets[-1][0] != math.inf:  # malformed exposition: the +Inf bucket is the count
            buckets.append((math.inf, self.value(name + "_count") or buckets[-1][1]))
        total = self.value(name + "_count")
        return Histogram(
            buckets=buckets,
            sum=self.value(name + "_sum") or 0.0,
            count=buckets[-1][1] if total is None else total,
        )

    def raw(self) -> dict[str, float]:
        """Every sample as `name{a="x",b="y"}` -> value (for engines no adapter knows)."""
        out: dict[str, float] = {}
        for name, rows in self.samples.items():
            for labels, v in rows:
                if math.isnan(v) or math.isinf(v):
                    continue
                lab = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
                out[f"{name}{{{lab}}}" if lab else name] = v
        return out


def parse_metrics(text: str) -> Scrape:
    """Parse Prometheus text format; raises ValueError on text that is not that format."""
    scrape = Scrape()
    for family in text_string_to_metric_families(text):
        scrape.types[family.name] = family.type
        for s in family.samples:
            scrape.samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return scrape


def only_samples(text: str, names: frozenset[str]) -> str:
    """The sample lines of `text` whose metric name is in `names` (comments dropped).

    Parsing is the expensive part of a scrape (pure Python, every histogram bucket a line);
    the per-sample fields need a handful of gauges and counters, whose values read the same
    untyped. Full parses are kept for detection and the window's first and last scrape.
    """
    keep = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = len(line)
        for sep in ("{", " "):
            i = line.find(sep)
            if 0 <= i < end:
                end = i
        if line[:end] in names:
            keep.append(line)
    return "\n".join(keep) + "\n"


def get_text(client: httpx.Client, url: str) -> str:
    """GET `url`; httpx errors (and HTTP error statuses) propagate."""
    resp = client.get(url)
    resp.raise_for_status()
    return resp.text


def fetch_metrics(client: httpx.Client, url: str) -> Scrape:
    """GET `url` and parse it; httpx errors and ValueError (not Prometheus text) propagate."""
    return parse_metrics(get_text(client, url))
