"""Expert-load sampler: per layer, the tokens routed to each expert of an MoE server, over the
run.

Reads `cbbench:expert_tokens_total{layer,expert}` (cbbench's reference engine; as far as we
found, vLLM and SGLang export no per-expert load on `/metrics`: SGLang's expert-distribution
recorder dumps to files, vLLM's EPLB keeps it internal). A target that neither has the series
nor declares the family: the sampler says so after its first scrape and stops. cbbench's
engine declares the family from the start and adds the series at its first MoE step (from
0): until they appear it is read every second at most; a dense model never adds them. Each tick is one `timeseries.jsonl` sample
(`source: "experts"`, `experts: {layer: [tokens per expert, cumulative]}`); the summary has
each layer's tokens per expert over the run (last scrape - first) and their imbalance,
max / mean (1 = even) and the coefficient of variation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
from cbbench.harness.telemetry.prom import Scrape, get_text, only_samples, parse_metrics

EXPERT_TOKENS = "cbbench:expert_tokens_total"
FAMILY = "cbbench:expert_tokens"
WAIT_S = 1.0  # the interval while the family is declared but has no series yet


def layer_counts(text: str, scrape: Scrape | None = None) -> dict[str, list[float]]:
    """layer -> tokens per expert (index = expert id), from Prometheus text (or its parse)."""
    scrape = scrape or parse_metrics(only_samples(text, frozenset({EXPERT_TOKENS})))
    grid: dict[str, dict[int, float]] = {}
    for labels, v in scrape.series(EXPERT_TOKENS):
        if "layer" in labels and str(labels.get("expert", "")).isdigit():
            grid.setdefault(labels["layer"], {})[int(labels["expert"])] = v
    return {
        layer: [row.get(e, 0.0) for e in range(max(row) + 1)]
        for layer, row in sorted(grid.items(), key=lambda kv: _layer_key(kv[0]))
    }


def _layer_key(layer: str) -> tuple[int, str]:
    return (int(layer), "") if layer.isdigit() else (1 << 30, layer)


def spread(counts: list[float]) -> dict | None:
    """max / mean and coefficient of variation of tokens per expert (None: nothing routed)."""
    if not counts or sum(counts) <= 0:
        return None
    mean = sum(counts) / len(counts)
    cv = (sum((c - mean) ** 2 for c in counts) / len(counts)) ** 0.5 / mean
    return {"max_over_mean": max(counts) / mean, "cv": cv, "total_tokens": sum(counts)}


class ExpertLoadSampler:
    name = "experts"

    def __init__(self, url: str, interval_s: float = 0.25, timeout_s: float | None = None):
        assert interval_s > 0, "interval must be positive"
        self.url, self.interval_s = url, interval_s
        self.timeout_s = timeout_s or max(1.0, min(5.0, 2 * interval_s))
        self.unavailable_reason: str | None = None
        self.samples = 0
        self.failures = 0
        self.last_error: str | None = None
        self._first: dict[str, list[float]] | None = None  # {}: declared, 0 at the start
        self._start_s = 0.0
        self._last: dict[str, list[float]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None
        self._t0_ns = 0
        self._sink: Callable[[dict], None] = lambda _s: None

    def start(self, t0_ns: int, sink: Callable[[dict], None]) -> None:
        assert self._thread is None, "a sampler starts once"
        self._t0_ns, self._sink = t0_ns, sink
        self._client = httpx.Client(timeout=self.timeout_s, trust_env=False)
        try:
            scrape = parse_metrics(get_text(self._client, self.url))
        except Exception as exc:  # noqa: BLE001 - any bad answer: no expert load
            scrape = Scrape()
            self.failures, self.last_error = 1, f"{self.url}: {type(exc).__name__}: {exc}"[:200]
        self._start_s = (time.monotonic_ns() - self._t0_ns) / 1e9
        counts = layer_counts("", scrape)
        if counts:
            self._record(self._start_s, counts)
        elif FAMILY in scrape.types:
            self._first = {}
        else:
            self.unavailable_reason = self.last_error or f"{self.url} exports no per-expert load"
            self._client.close()
            return
        self._thread = threading.Thread(target=self._loop, name="cbbench-experts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=2 * self.timeout_s + 1.0)
        if self._thread.is_alive():
            self._sink = lambda _s: None
        elif self._client is not None:
            self._client.close()

    def latest(self) -> dict:
        return {}

    def summary(self) -> dict:
        if self.unavailable_reason is not None:
            return {"available": False, "reason": self.unavailable_reason}
        if self._last is None:
            return {
                "available": False,
                "reason": f"{self.url} routed no token through experts (a dense model)",
            }
        with self._lock:
            first, last = self._first or {}, self._last or {}
            layers: dict[str, dict] = {}
            for layer, now in last.items():
                before = first.get(layer, [])
                tokens = [n - (before[e] if e < len(before) else 0.0) for e, n in enumerate(now)]
                layers[layer] = {"tokens": tokens, **(spread(tokens) or {})}
            worst = [d["max_over_mean"] for d in layers.values() if "max_over_mean" in d]
            return {
                "available": True,
                "url": self.url,
                "samples": self.samples,
                "failures": self.failures,
                "last_error": self.last_error,
                "layers": layers,
                "max_over_mean": max(worst) if worst else None,
                "mean_over_layers": sum(worst) / len(worst) if worst else None,
            }

    def _loop(self) -> None:
        next_t = time.monotonic()
        while True:
            step = self.interval_s if self._last is not None else max(WAIT_S, self.interval_s)
            next_t = max(next_t + step, time.monotonic())
            if self._stop.wait(next_t - time.monotonic()):
                break
            self._scrape_once()
        self._scrape_once()  # the closing scrape: the window ends with the run

    def _scrape_once(self) -> None:
        assert self._client is not None
        start_ns = time.monotonic_ns()
        try:
            counts = layer_counts(get_text(self._client, self.url))
        except Exception as exc:  # noqa: BLE001 - any bad answer is a counted failure
            with self._lock:
                self.failures += 1
                self.last_error = f"{self.url}: {type(exc).__name__}: {exc}"[:200]
            return
        if not counts:
            return
        t_s = ((start_ns + time.monotonic_ns()) / 2 - self._t0_ns) / 1e9
        if self._first == {}:  # the series start now, from 0 at the start of the run
            self._record(self._start_s, {k: [0.0] * len(v) for k, v in counts.items()})
        self._record(t_s, counts)

    def _record(self, t_s: float, counts: dict[str, list[float]]) -> None:
        with self._lock:
            if not self._first:
                self._first = counts
            self._last = counts
            self.samples += 1
        self._sink({"t_s": t_s, "source": "experts", "experts": counts})
