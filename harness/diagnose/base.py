"""What every diagnosis rule shares: the Finding it returns and the RunView it reads.

A rule is a small function over one run folder's per-request records (`requests.jsonl`) and
telemetry (`timeseries.jsonl`); it returns a Finding (what, likely cause, evidence with
numbers and time ranges, the fix in each engine's own flags) or None when the run does not
show its symptom. Rules never guess: a signal the run did not record (no server metrics, no
GPU) makes the rule stay silent rather than fire on a default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import Run

ENGINES = ("vllm", "sglang", "tgi", "triton", "cbbench")
STREAM_SAMPLE = 2000


@dataclass
class Finding:
    rule: str  # rule id, e.g. "kv-pressure"
    title: str  # the symptom, one line
    cause: str  # the likely cause
    evidence: list[str]  # numbers, time ranges
    fixes: dict[str, str]  # engine -> the fix in that engine's own flags
    severity: str = "warning"  # "warning" | "info"
    time_ranges: list[tuple[float, float]] = field(default_factory=list)  # seconds from t0
    values: dict = field(default_factory=dict)  # the numbers behind the evidence

    def to_dict(self) -> dict:
        return {
            "rule": self.rule,
            "title": self.title,
            "severity": self.severity,
            "cause": self.cause,
            "evidence": list(self.evidence),
            "time_ranges_s": [[round(a, 3), round(b, 3)] for a, b in self.time_ranges],
            "fixes": dict(self.fixes),
            "values": dict(self.values),
        }


@dataclass(frozen=True)
class Rule:
    id: str
    symptom: str  # what it looks for, for `cbbench diagnose --list-rules` and the docs
    check: Callable[[RunView], Finding | None]


def ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.0f} ms" if x >= 0.0995 else f"{x * 1e3:.1f} ms"


def pct(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 100:.1f}%" if 0 < x < 0.01 else f"{x * 100:.0f}%"


def fmt_ranges(ranges: list[tuple[float, float]], limit: int = 3) -> str:
    parts = [f"{a:.1f}–{b:.1f} s" for a, b in ranges[:limit]]
    more = len(ranges) - limit
    return ", ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def true_ranges(
    t: np.ndarray, mask: np.ndarray, min_len_s: float = 0.0
) -> list[tuple[float, float]]:
    """Merged [start, end] intervals of consecutive samples where `mask` holds."""
    out: list[tuple[float, float]] = []
    start = None
    for i, m in enumerate(mask):
        if m and start is None:
            start = t[i]
        if not m and start is not None:
            out.append((float(start), float(t[i - 1])))
            start = None
    if start is not None:
        out.append((float(start), float(t[-1])))
    return [(a, b) for a, b in out if b - a >= min_len_s]


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else np.nan


class RunView:
    """Read-only accessors over one run, computed once and shared by every rule."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.meta = run.meta
        self.measured = [r for r in run.records if not r.warmup]
        self.ok: list[RequestRecord] = [r for r in self.measured if r.ok]

    # -- what the target was --------------------------------------------------------------
    @cached_property
    def engine(self) -> str | None:
        """vllm | sglang | tgi | cbbench | ... as detected from /metrics or /v1/models."""
        tele = ((self.meta.get("summary") or {}).get("telemetry") or {}).get("server") or {}
        if tele.get("engine"):
            return str(tele["engine"])
        eng = (self.meta.get("target") or {}).get("engine") or {}
        if isinstance(eng, dict) and (eng.get("cbbench") or eng.get("owned_by") == "cbbench"):
            return "cbbench"
        if isinstance(eng, dict) and eng.get("owned_by") in ENGINES:
            return str(eng["owned_by"])
        return None

    @cached_property
    def engine_info(self) -> dict:
        eng = (self.meta.get("target") or {}).get("engine") or {}
        info = eng.get("cbbench") if isinstance(eng, dict) else None
        return info if isinstance(info, dict) else {}

    @cached_property
    def scheduler(self) -> str | None:
        """The reference engine's batching policy, when the server said."""
        target = self.meta.get("target") or {}
        if target.get("scheduler"):
            return str(target["scheduler"])
        for r in self.ok:
            if r.extra.get("scheduler"):
                return str(r.extra["scheduler"])
        return self.engine_info.get("scheduler")

    # -- telemetry ----------------------------------------------------------------------------
    def samples(self, source: str) -> list[dict]:
        return [s for s in self.run.timeseries if s.get("source") == source]

    def series(self, name: str, source: str = "server") -> tuple[np.ndarray, np.ndarray]:
        """(t_s, value) of a telemetry field, time-ordered; empty arrays when never recorded."""
        pts = [
            (_num(s.get("t_s")), _num(s.get(name)))
            for s in self.run.timeseries
            if s.get("source") == source and name in s
        ]
        pts = [(t, v) for t, v in pts if not (np.isnan(t) or np.isnan(v))]
        pts.sort()
        if not pts:
            return np.empty(0), np.empty(0)
        a = np.asarray(pts, dtype=np.float64)
        return a[:, 0], a[:, 1]

    @cached_property
    def kv_usage_mean(self) -> float | None:
        """KV usage averaged over every sample of the run: the figure of the report's table
        ("KV usage mean"), so a finding quoting the run's mean says the same number."""
        _, v = self.series("kv_usage")
        return float(v.mean()) if v.size else None

    @cached_property
    def busy_window(self) -> tuple[float, float]:
        """From the first send to the last response: the part of the run with load on."""
        starts = [r.sent_s for r in self.measured if r.sent_s is not None]
        ends = [r.end_s for r in self.measured if r.end_s is not None]
        if not starts or not ends:
            return (0.0, 0.0)
        return (min(starts), max(ends))

    def busy_series(self, name: str, source: str = "server") -> tuple[np.ndarray, np.ndarray]:
        t, v = self.series(name, source)
        a, b = self.busy_window
        keep = (t >= a) & (t <= b)
        return t[keep], v[keep]

    @cached_property
    def preemptions(self) -> tuple[int | None, str]:
        """Preemptions in the run and where the number came from (None: not recorded)."""
        per_req = [r.extra.get("num_preemptions") for r in self.ok]
        per_req = [int(p) for p in per_req if isinstance(p, (int, float))]
        _, total = self.series("preemptions_total")
        from_server = int(total.max() - total.min()) if total.size >= 2 else None
        if from_server is not None and (not per_req or from_server >= sum(per_req)):
            return from_server, "server counter"
        if per_req:
            return sum(per_req), "per-request reports"
        return from_server, "server counter"

    # -- per-request columns ------------------------------------------------------------
    def col(self, name: str, records: Iterable[RequestRecord] | None = None) -> np.ndarray:
        recs = self.ok if records is None else list(records)
        return np.asarray([_num(getattr(r, name)) for r in recs], dtype=np.float64)

    def out_tokens(self, r: RequestRecord) -> int:
        for v in (r.output_tokens_server, r.output_tokens_client, len(r.token_times_s)):
            if v:
                return int(v)
        return 0

    def prompt_tokens(self, r: RequestRecord) -> int:
        return int(r.prompt_tokens_server or r.prompt_tokens_client or r.prompt_len or 0)

    @cached_property
    def streams(self) -> list[RequestRecord]:
        """At most STREAM_SAMPLE successful records, evenly spread over the run: the rules that
        walk every token gap stay fast on runs of a million requests."""
        n = len(self.ok)
        if n <= STREAM_SAMPLE:
            return self.ok
        step = n / STREAM_SAMPLE
        return [self.ok[int(i * step)] for i in range(STREAM_SAMPLE)]

    @cached_property
    def itl_p50(self) -> float | None:
        gaps = [g for r in self.streams for g in r.itl_s]
        return float(np.median(gaps)) if gaps else None
