"""Workloads too big to hold: a bound on what is materialized, and a streamed summary.

A `Workload` holds every `RequestSpec` (~350 bytes each: 10^6 requests take ~350 MB), so
`load_workload` refuses more than `MAX_REQUESTS` in one line. `cbbench workload show` of a
synthetic spec past `STREAM_ABOVE` requests does not build them at all: `summarize_streamed`
draws the lengths chunk by chunk from the same per-field streams `build_synthetic` uses (a
draw of a then b values equals one draw of a + b for every sequential distribution) and
keeps only a count per distinct length, so 10^8 requests take the memory of one chunk.
Percentiles from those counts are numpy's linear interpolation, exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.summary import PERCENTILES
from cbbench.workloads.synthetic import (
    CLASS_STREAM,
    DEFAULT_NUM_REQUESTS,
    OUTPUT_STREAM,
    PROMPT_STREAM,
    _pick,
    _rng,
    parse_classes,
)

MAX_REQUESTS = 5_000_000  # materialized: ~1.7 GB of RequestSpecs
STREAM_ABOVE = 1_000_000  # `workload show` streams synthetic specs past this count
CHUNK = 1 << 16
# Distributions whose chunked draws equal one draw (sequence restarts, mixture re-seeds).
SEQUENTIAL_KINDS = frozenset(
    {"constant", "uniform", "normal", "lognormal", "exponential", "zipf", "empirical"}
)
_NOT_STREAMED_KEYS = ("trace", "session", "prefix", "arrival")


def check_count(n: int, where: str) -> None:
    if n > MAX_REQUESTS:
        raise WorkloadError(
            f"{where}: {n:,} requests is more than the {MAX_REQUESTS:,} a run holds in memory "
            f"(~350 bytes each); bound a long run with --duration instead"
        )


class LengthCounts:
    """How many times each length occurred (bounded by the distinct lengths, not the count)."""

    def __init__(self) -> None:
        self.values = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)

    def add(self, chunk: np.ndarray) -> None:
        values, counts = np.unique(chunk, return_counts=True)
        merged, inverse = np.unique(np.concatenate([self.values, values]), return_inverse=True)
        self.counts = np.bincount(
            inverse, weights=np.concatenate([self.counts, counts]), minlength=len(merged)
        ).astype(np.int64)
        self.values = merged

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def _at_rank(self, rank: np.ndarray) -> np.ndarray:
        return self.values[np.searchsorted(np.cumsum(self.counts), rank, side="right")]

    def percentile(self, q: float) -> float:
        """numpy.percentile(values, q) (method 'linear') from the counts."""
        h = (self.total - 1) * q / 100.0
        lo = int(np.floor(h))
        a, b = (float(v) for v in self._at_rank(np.asarray([lo, min(lo + 1, self.total - 1)])))
        t = h - lo
        return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t  # numpy's _lerp

    def describe(self) -> dict:
        """The shape of summary.describe_lengths."""
        n = self.total
        if not n:
            return {"count": 0}
        total = int((self.values * self.counts).sum())
        out = {"count": n, "mean": total / n, "min": int(self.values[0])}
        for q in PERCENTILES:
            out[f"p{q}"] = self.percentile(q)
        out["max"] = int(self.values[-1])
        out["total"] = total
        return out


def streamable(spec: dict) -> bool:
    """A plain synthetic spec (no trace, sessions, prefixes or arrivals) whose distributions
    all draw sequentially."""
    if any(k in spec for k in _NOT_STREAMED_KEYS):
        return False
    try:
        classes = parse_classes(spec, "spec")
    except WorkloadError:
        return False
    return all(
        c.prompt.kind in SEQUENTIAL_KINDS and c.output.kind in SEQUENTIAL_KINDS for c in classes
    )


def iter_lengths(
    spec: dict, seed: int, n: int, chunk: int = CHUNK
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(prompt_len, output_len) arrays of up to `chunk` requests, in order: the first n
    requests of `build_synthetic(spec, ..., seed, n)`."""
    classes = parse_classes(spec, "spec")
    class_rng = _rng(seed, CLASS_STREAM)
    prompt_rngs = [_rng(seed, PROMPT_STREAM, i) for i in range(len(classes))]
    output_rngs = [_rng(seed, OUTPUT_STREAM, i) for i in range(len(classes))]
    weights = np.asarray([c.weight for c in classes])
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        if len(classes) > 1:
            cls = class_rng.choice(len(classes), size=k, p=weights / weights.sum())
        else:
            cls = np.zeros(k, dtype=np.int64)
        prompt = _pick(
            [c.prompt.sample(r, k) for c, r in zip(classes, prompt_rngs, strict=True)], cls
        )
        output = _pick(
            [c.output.sample(r, k) for c, r in zip(classes, output_rngs, strict=True)], cls
        )
        yield prompt, output


def summarize_streamed(
    spec: dict, name: str, seed: int, n: int | None = None, chunk: int = CHUNK
) -> tuple[dict, LengthCounts]:
    """`summarize_workload`'s dict for a streamable spec, and the output-length counts (for a
    histogram), without building the requests."""
    n = spec.get("num_requests", DEFAULT_NUM_REQUESTS) if n is None else n
    prompt, output = LengthCounts(), LengthCounts()
    for p, o in iter_lengths(spec, seed, n, chunk):
        prompt.add(p)
        output.add(o)
    summary = {
        "name": spec.get("name", name),
        "seed": seed,
        "count": n,
        "open_loop": False,
        "prompt_len": prompt.describe(),
        "output_len": output.describe(),
        "duration_s": None,
        "mean_rate": None,
        "burstiness": None,
        "rows_skipped": {},
        "streamed": True,
    }
    return summary, output
