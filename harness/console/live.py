"""What the user sees: a rich live view while a run goes, a summary table at the end."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
from cbbench.harness.results.records import RequestRecord
from rich.console import Console
from rich.live import Live
from rich.table import Table

WINDOW = 256  # rolling percentiles over the last WINDOW finished requests
RATE_WINDOW_S = 5.0


class LiveStats:
    """Counters fed from records and client samples; read by the live view's thread."""

    def __init__(self, total: int | None, samplers: list | None = None) -> None:
        self.total = total
        self.samplers = samplers or []
        self.done = 0
        self.failed = 0
        self.sent: dict[int, int] = {}  # worker -> requests sent so far
        self.ttft: deque[float] = deque(maxlen=WINDOW)
        self.ttfo: deque[float] = deque(maxlen=WINDOW)
        self.reasoned = False  # a record had reasoning tokens: the view shows TTFO
        self.tpot: deque[float] = deque(maxlen=WINDOW)
        self.lag: deque[float] = deque(maxlen=WINDOW)
        self.tokens: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def on_record(self, rec: RequestRecord) -> None:
        if rec.warmup:
            return
        with self._lock:
            self.done += 1
            if not rec.ok:
                self.failed += 1
                return
            if rec.ttft_s is not None:
                self.ttft.append(rec.ttft_s)
            if rec.ttfo_s is not None:
                self.ttfo.append(rec.ttfo_s)
            self.reasoned = self.reasoned or bool(rec.reasoning_tokens)
            if rec.tpot_s is not None:
                self.tpot.append(rec.tpot_s)
            if rec.send_lag_s is not None:
                self.lag.append(rec.send_lag_s)
            n = rec.output_tokens_server or rec.output_tokens_client or 0
            self.tokens.append((time.monotonic(), n))

    def on_sample(self, sample: dict) -> None:
        if sample.get("source") == "client":
            with self._lock:
                self.sent[sample.get("worker", 0)] = sample.get("sent", 0)

    @property
    def in_flight(self) -> int:
        """Sent (as of each worker's last sample, once a second) minus finished (now).
        Callers hold the lock."""
        return max(0, sum(self.sent.values()) - self.done)

    def tokens_per_s(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self.tokens and self.tokens[0][0] < now - RATE_WINDOW_S:
                self.tokens.popleft()
            return sum(n for _, n in self.tokens) / RATE_WINDOW_S

    def render(self) -> Table:
        t = Table(title="cbbench bench (live)", show_header=False, box=None)
        with self._lock:
            ttft, tpot, lag = list(self.ttft), list(self.tpot), list(self.lag)
            ttfo = list(self.ttfo) if self.reasoned else None
            done, failed, in_flight = self.done, self.failed, self.in_flight
        total = f"/{self.total}" if self.total else ""
        t.add_row("done", f"{done}{total}  failed {failed}  in flight {in_flight}")
        t.add_row("TTFT p50/p99", _ms_pair(ttft))
        if ttfo is not None:
            t.add_row("TTFO p50/p99", _ms_pair(ttfo))
        t.add_row("TPOT p50/p99", _ms_pair(tpot))
        t.add_row("send lag p50/p99", _ms_pair(lag))
        t.add_row("output tokens/s", f"{self.tokens_per_s():.1f}")
        for s in self.samplers:
            latest = s.latest() if hasattr(s, "latest") else {}
            if latest:
                t.add_row(getattr(s, "name", "telemetry"), _fmt_latest(latest))
        return t


def _ms_pair(values: list[float]) -> str:
    if not values:
        return "-"
    p50, p99 = np.percentile(values, [50, 99])
    return f"{p50 * 1e3:.1f} / {p99 * 1e3:.1f} ms"


def _fmt_latest(d: dict) -> str:
    parts = []
    for k, v in d.items():
        if isinstance(v, float):
            parts.append(f"{k} {v:.3g}")
        elif isinstance(v, int | str):
            parts.append(f"{k} {v}")
    return "  ".join(parts[:6])


class LiveView:
    """Context manager: refreshes twice a second on a terminal, stays silent otherwise."""

    def __init__(self, stats: LiveStats, console: Console | None = None, enabled: bool = True):
        self.console = console or Console(stderr=True)
        self.stats = stats
        self.enabled = enabled and self.console.is_terminal
        self._live: Live | None = None

    def __enter__(self) -> LiveView:
        if self.enabled:
            self._live = Live(
                get_renderable=self.stats.render, console=self.console, refresh_per_second=2
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)


def _ms(d: dict, key: str) -> str:
    v = d.get(key)
    return "-" if v is None else f"{v * 1e3:.2f}"


def summary_table(summary: dict, title: str = "cbbench bench") -> Table:
    c = summary["counts"]
    t = Table(title=title)
    t.add_column("metric")
    for col in ("mean", "p50", "p90", "p99", "max", "count"):
        t.add_column(col, justify="right")
    reasoned = bool(summary.get("total_reasoning_tokens"))  # rows a reasoning model adds
    for label, key in (
        ("TTFT (ms)", "ttft_s"),
        *((("TTFO (ms)", "ttfo_s"), ("reasoning (ms)", "reasoning_s")) if reasoned else ()),
        ("TPOT (ms)", "tpot_s"),
        *((("answer TPOT (ms)", "answer_tpot_s"),) if reasoned else ()),
        ("ITL (ms)", "itl_s"),
        ("E2E (ms)", "e2e_s"),
        ("client queue (ms)", "client_queue_s"),
        ("server queue (ms)", "server_queue_s"),
        ("send lag (ms)", "send_lag_s"),
        ("connect (ms)", "connect_s"),
    ):
        d = summary[key] if key != "connect_s" else summary.get("connections", {}).get(key)
        if d is None:
            continue
        if d["count"]:
            cells = [_ms(d, k) for k in ("mean", "p50", "p90", "p99", "max")]
            t.add_row(label, *cells, str(d["count"]))
    t.caption = _caption(summary, c)
    return t


def _caption(summary: dict, c: dict) -> str:
    def num(x, fmt=".2f"):
        return "-" if x is None else format(x, fmt)

    lines = [
        f"completed {c['completed']}  failed {c['failed']} (error rate "
        f"{summary['error_rate'] * 100:.1f}%)  short outputs {c['short_outputs']}"
        f"  warmup excluded {c['warmup_excluded']}",
        f"duration {summary['duration_s']:.2f} s  requests/s {num(summary['request_throughput'])}"
        f"  output tok/s {num(summary['output_throughput'], '.1f')}"
        f"  total tok/s {num(summary['total_token_throughput'], '.1f')}",
    ]
    if summary.get("sessions"):
        s = summary["sessions"]

        def ms(d: dict) -> str:
            return "-" if d["p50"] is None else f"{d['p50'] * 1e3:.1f} ms"

        hit = s.get("prefix_cache_hit_rate_server", s["prefix_cache_hit_rate"])
        lines.append(
            f"sessions {s['sessions']} (up to {s['turns_max']} turns): TTFT p50 turn 1 "
            f"{ms(s['ttft_turn1_s'])}, later turns {ms(s['ttft_later_turns_s'])}; history p50 "
            f"{num(s['history_len']['p50'], '.0f')} tokens; prefix-cache hits {num(hit, '.1%')}"
        )
    if summary.get("total_reasoning_tokens"):
        lines.append(
            f"reasoning: {summary['total_reasoning_tokens']} tokens, "
            f"{num(summary.get('reasoning_share'), '.1%')} of output (TTFO: first answer token)"
        )
    if summary.get("stream_flags"):
        flags = ", ".join(f"{k} {v}" for k, v in summary["stream_flags"].items())
        lines.append(f"warning: streams flagged by the reasoning classifier: {flags}")
    if summary.get("goodput"):
        g = summary["goodput"]
        lines.append(
            f"goodput {num(g['requests_per_s'])} req/s ({num(g['fraction'], '.1%')} within SLO)"
        )
    if summary["errors_by_kind"]:
        lines.append(
            "errors: " + ", ".join(f"{k} {v}" for k, v in summary["errors_by_kind"].items())
        )
    if summary.get("embedding_inputs"):
        lines.append(
            f"embeddings: {summary['embedding_inputs']} inputs, "
            f"{num(summary.get('embedding_input_throughput'), '.1f')} inputs/s"
        )
    if c["prompt_token_mismatch"]:
        lines.append(
            f"warning: {c['prompt_token_mismatch']} prompts differ in length from the server's count "
            f"(mean server - client {summary['prompt_token_mismatch_mean']:+.1f} tokens)"
        )
    exact = c.get("token_count_mismatch") or 0
    if exact:
        lines.append(
            f"warning: in {exact} responses usage.completion_tokens disagrees with the streamed "
            "token_ids: timing uses the streamed count (records: token_mismatch)"
        )
    if (c.get("output_token_mismatch") or 0) > exact:
        lines.append(
            f"note: in {c['output_token_mismatch'] - exact} responses the streamed chunks do not "
            "match usage.completion_tokens (no token_ids): ITL is per chunk there, TPOT uses usage"
        )
    for name, tel in (summary.get("telemetry") or {}).items():
        q = tel.get("queue_time") if isinstance(tel, dict) else None
        if isinstance(q, dict) and q.get("p99") is not None:
            lo, hi = (q.get("bucket_s") or {}).get("p99", (None, None))
            width = "" if lo is None else f", in its bucket [{lo * 1e3:.1f}, {hi * 1e3:.1f}] ms"
            capped = (
                " (capped by the run's TTFT p99)"
                if "p99" in ((q.get("capped_by") or {}).get("lowered") or ())
                else ""
            )
            lines.append(
                f"{name}: server queue p50 {q['p50'] * 1e3:.1f} ms, p99 {q['p99'] * 1e3:.1f} ms"
                f"{width}{capped}, estimated from the server's histogram"
            )
    conn = summary.get("connections") or {}
    if conn.get("opened") is not None:
        lines.append(
            f"connections: opened {conn['opened']} ({conn['prewarmed']} before t0), requests on "
            f"a reused one {conn['reused']}, closed by the server {conn['closed_by_server']}; "
            f"arrival times: {summary.get('timestamp_source', 'user')} stamps"
        )
    if summary["client_bound"]:
        lines.append(f"CLIENT-BOUND: {summary['client_bound_reason']} (the client set the pace)")
    return "\n".join(lines)
