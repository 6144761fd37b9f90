"""What the user sees: a rich live view while a run goes (plain progress lines when the output
is not a terminal: CI logs), a summary table at the end with its notes as whole lines below
it (left-aligned, never wrapped mid-phrase)."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
from cbbench.harness.results.efficiency import efficiency_line
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.replica_figures import imbalance_line
from cbbench.harness.results.time_split import time_split_line
from rich.console import Console
from rich.live import Live
from rich.table import Table

WINDOW = 256  # rolling percentiles over the last WINDOW finished requests
RATE_WINDOW_S = 5.0
# The live view's names for the samplers' fields, and how each is shown: what a user reads,
# not a metric name (the run folder keeps the raw ones).
FRIENDLY = {
    "running": ("running", "{:.0f}"),
    "waiting": ("waiting", "{:.0f}"),
    "kv_usage": ("KV cache used", "{:.0%}"),
    "batch_occupancy": ("batch slots used", "{:.0%}"),
    "kv_reserved_unused_tokens": ("KV reserved, unused", "{:.0f} tokens"),
    "prefix_cache_hit_rate": ("prefix-cache hits", "{:.0%}"),
    "preemptions_total": ("preemptions", "{:.0f}"),
    "util_gpu": ("GPU busy", "{:.0f}%"),
    "util_mem": ("GPU memory busy", "{:.0f}%"),
    "mem_used_bytes": ("GPU memory", "{:.1f} GiB", 2.0**-30),
    "power_w": ("power", "{:.0f} W"),
    "devices": ("GPUs", "{:.0f}"),
}


class LiveStats:
    """Counters fed from records and client samples; read by the live view's thread."""

    def __init__(self, total: int | None, samplers: list | None = None) -> None:
        self.total = total
        self.samplers = samplers or []
        self.done = 0
        self.failed = 0
        self.sent: dict[int, int] = {}  # worker -> requests sent so far
        # worker -> [t_s, in flight] of its last sample, less the requests in flight then
        # that have finished since (`in_flight`)
        self.flight: dict[int, list] = {}
        self.ttft: deque[float] = deque(maxlen=WINDOW)
        self.ttfo: deque[float] = deque(maxlen=WINDOW)
        self.reasoned = False  # a record had reasoning tokens: the view shows TTFO
        self.tpot: deque[float] = deque(maxlen=WINDOW)
        self.lag: deque[float] = deque(maxlen=WINDOW)
        self.tokens: deque[tuple[float, int]] = deque()
        self.tokens_total = 0
        self.started = time.monotonic()  # reset at t0 (`on_t0`)
        self._lock = threading.Lock()

    def on_t0(self) -> None:
        self.started = time.monotonic()

    def on_record(self, rec: RequestRecord) -> None:
        if rec.warmup:
            return
        with self._lock:
            self.done += 1
            f = self.flight.get(rec.worker)
            if f is not None and rec.sent_s is not None and rec.sent_s <= f[0]:
                f[1] -= 1  # in flight at that sample, finished since
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
            self.tokens_total += n

    def on_sample(self, sample: dict) -> None:
        if sample.get("source") == "client":
            with self._lock:
                w = sample.get("worker", 0)
                self.sent[w] = sample.get("sent", 0)
                if isinstance(sample.get("in_flight"), int) and "t_s" in sample:
                    self.flight[w] = [sample["t_s"], sample["in_flight"]]

    @property
    def in_flight(self) -> int:
        """Each worker's own count at its last sample (once a second), less those requests
        that finished since; requests sent since that sample and still in flight are not
        seen until the next. (Sent as of the sample minus finished *now* read 0 in open-loop
        runs: the requests sent and finished since the sample were taken off too.) Callers
        hold the lock."""
        if self.flight and len(self.flight) == len(self.sent):
            return sum(max(0, f[1]) for f in self.flight.values())
        return max(0, sum(self.sent.values()) - self.done)

    def tokens_per_s(self) -> float:
        """Over the last RATE_WINDOW_S (or since t0, if sooner)."""
        now = time.monotonic()
        with self._lock:
            while self.tokens and self.tokens[0][0] < now - RATE_WINDOW_S:
                self.tokens.popleft()
            window = min(RATE_WINDOW_S, max(now - self.started, 1e-9))
            return sum(n for _, n in self.tokens) / window

    def tokens_per_s_so_far(self) -> float:
        """Output tokens of the finished requests over the time since t0: the summary's
        definition (its duration then runs to the last response)."""
        with self._lock:
            return self.tokens_total / max(time.monotonic() - self.started, 1e-9)

    def plain_line(self, elapsed_s: float) -> str:
        """One progress line for a log (the live view's figures, no redraw)."""
        with self._lock:
            ttft, done, failed = list(self.ttft), self.done, self.failed
            in_flight = self.in_flight
        total = f"/{self.total}" if self.total else ""
        ttft_p50 = f"{np.percentile(ttft, 50) * 1e3:.1f} ms" if ttft else "-"
        return (
            f"progress {elapsed_s:.0f} s: done {done}{total}, failed {failed}, in flight "
            f"{in_flight}; TTFT p50 {ttft_p50}; output {self.tokens_per_s():,.1f} tok/s"
        )

    def render(self) -> Table:
        t = Table(title="cbbench bench (live)", show_header=False, box=None)
        with self._lock:
            ttft, tpot, lag = list(self.ttft), list(self.tpot), list(self.lag)
            ttfo = list(self.ttfo) if self.reasoned else None
            done, failed, in_flight = self.done, self.failed, self.in_flight
        total = f"/{self.total}" if self.total else ""
        t.add_row("done", f"{done}{total}  failed {failed}  in flight {in_flight}")
        # the summary's percentile method (workloads/stats.py) over the last WINDOW requests
        last = f" (last {WINDOW})" if done > WINDOW else ""
        t.add_row(f"TTFT p50/p99{last}", _ms_pair(ttft))
        if ttfo is not None:
            t.add_row(f"TTFO p50/p99{last}", _ms_pair(ttfo))
        t.add_row(f"TPOT p50/p99{last}", _ms_pair(tpot))
        t.add_row(f"send lag p50/p99{last}", _ms_pair(lag))
        t.add_row(
            "output tokens/s",
            f"{self.tokens_per_s_so_far():,.1f} so far  "
            f"({self.tokens_per_s():,.1f} over the last {RATE_WINDOW_S:g} s)",
        )
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
    """A sampler's latest values by their friendly names (FRIENDLY); others are left out."""
    parts = []
    for k, v in d.items():
        if k in FRIENDLY and isinstance(v, int | float) and not isinstance(v, bool):
            name, fmt, *scale = FRIENDLY[k]
            parts.append(f"{name} {fmt.format(v * (scale[0] if scale else 1))}")
    return "  ".join(parts[:6])


PLAIN_EVERY_S = 5.0  # a plain progress line this often when the output is not a terminal


class LiveView:
    """Context manager: refreshes twice a second on a terminal; elsewhere (piped, CI) prints a
    plain progress line every `plain_every_s` seconds, so a long run is never silent."""

    def __init__(
        self,
        stats: LiveStats,
        console: Console | None = None,
        enabled: bool = True,
        plain_every_s: float | None = None,
    ):
        self.console = console or Console(stderr=True)
        self.stats = stats
        self.enabled = enabled and self.console.is_terminal
        self.plain = enabled and not self.console.is_terminal
        self.plain_every_s = PLAIN_EVERY_S if plain_every_s is None else plain_every_s
        self._live: Live | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LiveView:
        if self.enabled:
            self._live = Live(
                get_renderable=self.stats.render, console=self.console, refresh_per_second=2
            )
            self._live.__enter__()
        elif self.plain:
            self._thread = threading.Thread(target=self._lines, daemon=True, name="progress")
            self._thread.start()
        return self

    def _lines(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.plain_every_s):
            line = self.stats.plain_line(time.monotonic() - t0)
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)


def _ms(d: dict, key: str) -> str:
    v = d.get(key)
    return "-" if v is None else f"{v * 1e3:.2f}"


_TIMED = (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"))


def summary_table(summary: dict, title: str = "cbbench bench", caption: bool = True) -> Table:
    """The latency table; with `caption`, its notes as the table's caption (centred, wrapped
    at the table's width). Commands pass caption=False and print `summary_lines` below it."""
    c = summary["counts"]
    # the client's timing error bound (p99), beside the figures it affects
    bound = (summary.get("client") or {}).get("timing_bound_s")
    # naming only the times this run has (an embeddings run has no TTFT or ITL)
    timed = [n for n, k in _TIMED if (summary.get(k) or {}).get("count")]
    if bound is not None and timed:
        title = f"{title}\n({', '.join(timed)} ± {bound * 1e3:.2f} ms: client timing error, p99)"
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
    if caption:
        t.caption = _caption(summary, c)
    return t


def print_summary(out: Console, summary: dict, title: str) -> None:
    """The summary table, then its notes as whole left-aligned lines (a caption is centred
    and wrapped at the table's width, mid-phrase)."""
    out.print(summary_table(summary, title, caption=False))
    for line in summary_lines(summary):
        out.print(line, highlight=False, markup=False, soft_wrap=True)


def summary_lines(summary: dict) -> list[str]:
    """The notes under the summary table, one whole line each (print them with soft_wrap)."""
    return _caption(summary, summary["counts"]).split("\n")


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
    if summary.get("phases"):  # a disaggregated server's split of each request
        ph = summary["phases"]

        def p50(key: str) -> str:
            d = ph.get(key) or {}
            return "-" if d.get("p50") is None else f"{d['p50'] * 1e3:.1f}"

        lines.append(
            f"P/D phases p50 (ms, {ph['requests']} requests): prefill queue "
            f"{p50('prefill_queue_s')}, prefill {p50('prefill_s')}, KV transfer "
            f"{p50('kv_transfer_s')} ({num(ph['kv_transfer_bytes']['mean'], ',.0f')} B/request), "
            f"decode queue {p50('decode_queue_s')}, decode {p50('decode_s')}"
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
    # the histogram's estimate only where the server gave no per-request queue time: the
    # table's exact figures and a bucket estimate of the same thing would disagree
    exact_queue = bool((summary.get("server_queue_s") or {}).get("count"))
    for name, tel in (summary.get("telemetry") or {}).items():
        q = tel.get("queue_time") if isinstance(tel, dict) else None
        if isinstance(q, dict) and q.get("p99") is not None and not exact_queue:
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
    for line in (efficiency_line(summary), imbalance_line(summary),
                 time_split_line(summary.get("server_timing"))):  # fmt: skip
        if line:
            lines.append(line)
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
