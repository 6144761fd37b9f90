"""Per-request arrays of one run, the common input of reports and gates.

Only measured requests count: warmup records are dropped. Latency arrays hold one value per
successful request (NaN where the metric is undefined, e.g. TPOT of a 1-token output); ITL
gaps are flattened with `itl_owner` naming the request each gap belongs to, so that a
bootstrap can resample whole requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from cbbench.harness.results.agent_summary import session_makespans
from cbbench.harness.results.graph_summary import graph_makespans, graph_session_success
from cbbench.harness.results.run_folder import Run
from cbbench.harness.results.summary import measured_window_s, output_tokens

LATENCY_METRICS = ("ttft", "ttfo", "tpot", "itl", "e2e", "queue")


def _arr(values: list[float | None]) -> np.ndarray:
    return np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)


@dataclass
class RunSamples:
    ttft: np.ndarray  # seconds, one per ok request
    tpot: np.ndarray
    e2e: np.ndarray
    queue: np.ndarray  # server-reported queue time
    itl: np.ndarray  # all gaps of all ok requests, flattened
    itl_owner: np.ndarray  # index into the ok requests for each gap
    prompt_len: np.ndarray  # one per ok request
    output_tokens: np.ndarray  # one per ok request
    finish_s: np.ndarray  # last token time of each ok request (seconds from t0)
    n_total: int  # measured requests, ok or not
    n_errors: int
    window_s: float  # the run's measured duration (see run_duration)
    cost_per_hour: float | None = None  # the run's --cost-per-hour (summed over replicas)
    # agent sessions: one per finished session (results/agent_summary.py); empty otherwise
    makespan: np.ndarray = field(default_factory=lambda: np.empty(0))
    # agent graphs: 1 per session that answered every call, 0 per one that did not
    session_ok: np.ndarray = field(default_factory=lambda: np.empty(0))
    # first answer token (reasoning excluded); a record from before TTFO was recorded: its TTFT
    ttfo: np.ndarray = field(default_factory=lambda: np.empty(0))
    reasoning_tokens: int = 0  # of all ok requests: 0 = the run did not reason (TTFO = TTFT)

    @property
    def n_ok(self) -> int:
        return int(self.ttft.size)

    @property
    def error_rate(self) -> float:
        return self.n_errors / self.n_total if self.n_total else 0.0

    @property
    def request_throughput(self) -> float | None:
        return self.n_ok / self.window_s if self.window_s > 0 else None

    @property
    def output_throughput(self) -> float | None:
        return float(self.output_tokens.sum()) / self.window_s if self.window_s > 0 else None

    def latency(self, metric: str) -> np.ndarray:
        assert metric in LATENCY_METRICS, metric
        return getattr(self, metric)


def run_duration(run: Run, measured: list) -> float:
    """The measured window, as `cbbench bench`/`sim` summarised it in run.json when they did,
    else as `summary.summarize` defines it (t0, or an earlier send, to the last response)."""
    summary = run.meta.get("summary")
    d = summary.get("duration_s") if isinstance(summary, dict) else None
    if isinstance(d, (int, float)) and not isinstance(d, bool) and d > 0:
        return float(d)
    return measured_window_s(measured)


def extract(run: Run) -> RunSamples:
    measured = [r for r in run.records if not r.warmup]
    ok = [r for r in measured if r.ok]
    itl: list[float] = []
    owner: list[int] = []
    for i, r in enumerate(ok):
        itl.extend(float(x) for x in r.itl_s)
        owner.extend([i] * len(r.itl_s))
    window = run_duration(run, measured)
    return RunSamples(
        ttft=_arr([r.ttft_s for r in ok]),
        tpot=_arr([r.tpot_s for r in ok]),
        e2e=_arr([r.e2e_s for r in ok]),
        queue=_arr([r.server_queue_s for r in ok]),
        itl=np.asarray(itl, dtype=np.float64),
        itl_owner=np.asarray(owner, dtype=np.int64),
        prompt_len=np.asarray([r.prompt_len for r in ok], dtype=np.float64),
        output_tokens=np.asarray([output_tokens(r) for r in ok], dtype=np.float64),
        finish_s=_arr([r.last_token_s for r in ok]),
        n_total=len(measured),
        n_errors=len(measured) - len(ok),
        window_s=window,
        cost_per_hour=_price(run.meta),
        makespan=np.asarray(
            session_makespans(measured) + graph_makespans(measured), dtype=np.float64
        ),
        session_ok=np.asarray(graph_session_success(measured), dtype=np.float64),
        ttfo=_arr([_ttfo(r) for r in ok]),
        reasoning_tokens=sum(r.reasoning_tokens or 0 for r in ok),
    )


def _price(meta: dict) -> float | None:
    tel = (meta.get("summary") or {}).get("telemetry") or {}
    price = (tel.get("price") or {}).get("cost_per_hour") if isinstance(tel, dict) else None
    return float(price) if isinstance(price, (int, float)) else None


def _ttfo(r) -> float | None:
    """A record's TTFO; one written before TTFO was (no reasoning count either): its TTFT."""
    return r.ttfo_s if r.ttfo_s is not None or r.reasoning_tokens is not None else r.ttft_s
