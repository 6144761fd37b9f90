"""The steady-state window of a run: where arrivals are steady and the number of requests in
flight sits at its plateau, ramp-up and drain excluded.

The rule (docs/rigor.md), over the measured requests (warmup excluded, failed ones included:
they held the server too):
1. in-flight(t) = requests sent by t and not yet ended, sampled on a grid of `step` seconds
   (span / 400, between 10 ms and 250 ms) and smoothed by a centred moving average over
   `smooth` = max(median E2E, 4 steps): one request's lifetime, so Poisson noise averages out
   but a ramp of a few latencies does not;
2. the plateau level = the median in-flight over the second half of the sending span (from
   the middle send to the last send): the part least touched by a ramp-up;
3. the band = level +- max(PLATEAU_TOLERANCE x level, 1 request);
4. the window is the stretch where the smoothed in-flight stays inside the band (brief exits,
   up to two smoothing lengths, are noise and joined over), the stretch that covers most of
   the second half; it starts one median E2E after the first send at the earliest (in flight
   is still filling before then) and ends at the last send at the latest (after it the run
   only drains).
vLLM's bench client uses a threshold of 0.95 x its `--max-concurrency` (steady_state.rs); this
band generalises it to open loops, where the plateau is rate x latency, and it excludes a
ramp that starts *above* the plateau (a server slow at first: warm-up, compilation).

Figures in the window follow vLLM's attribution: latencies of requests *sent* in it,
throughput from requests *completed* (and tokens *received*) in it over its length.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.integrity import RECORDS_KEY, record_counts
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import Run
from cbbench.harness.results.summary import output_tokens, summarize

PLATEAU_TOLERANCE = 0.25  # the band around the plateau level, relative
MIN_WINDOW_SHARE = 0.2  # a window shorter than this share of the run carries a warning
MIN_REQUESTS = 20  # a steady window with fewer requests sent in it does not lead the summary
WINDOW_KINDS = ("steady", "all")


@dataclass
class Window:
    start_s: float
    end_s: float
    kind: str  # "steady" (detected) | "range" (given START:END) | "all"
    level: float | None = None  # the plateau's requests in flight
    band: tuple[float, float] | None = None
    warning: str | None = None

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["duration_s"] = self.duration_s
        return d

    def label(self) -> str:
        what = {"steady": "steady window", "range": "window"}.get(self.kind, "whole run")
        return f"{what} {self.start_s:.1f}-{self.end_s:.1f} s"


def parse_window(text: str | None) -> str | tuple[float, float]:
    """`steady`, `all` or `START:END` (seconds from t0, units allowed: `10s:70s`)."""
    if text is None or text in WINDOW_KINDS:
        return text or "steady"
    m = re.fullmatch(r"\s*([0-9.]+)\s*s?\s*:\s*([0-9.]+)\s*s?\s*", text)
    if not m:
        raise CbbenchError(f"--window {text!r}: give steady, all, or START:END in seconds (5:65)")
    start, end = float(m.group(1)), float(m.group(2))
    if not end > start:
        raise CbbenchError(f"--window {text!r}: END must be after START")
    return start, end


def _measured(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if not r.warmup and r.sent_s is not None and r.end_s is not None]


def in_flight(records: list[RequestRecord], grid: np.ndarray) -> np.ndarray:
    """Requests in flight at each grid time (sent at or before it, not yet ended)."""
    sent = np.sort([r.sent_s for r in records])
    ended = np.sort([r.end_s for r in records])
    return (np.searchsorted(sent, grid, "right") - np.searchsorted(ended, grid, "right")).astype(
        float
    )


def steady_window(records: list[RequestRecord]) -> Window | None:
    """The steady-state window by the module's rule; None when the run is too short to have
    one (fewer than 8 measured requests, or no plateau)."""
    rs = _measured(records)
    if len(rs) < 8:
        return None
    sends = np.sort([r.sent_s for r in rs])
    first, last_send = float(sends[0]), float(sends[-1])
    end_all = max(r.end_s for r in rs)
    span = end_all - first
    if span <= 0 or last_send <= first:
        return None
    step = min(0.25, max(0.01, span / 400))
    grid = np.arange(first, end_all + step, step)
    raw = in_flight(rs, grid)
    e2e = float(np.median([r.end_s - r.sent_s for r in rs]))
    # no longer than the grid: np.convolve(mode="same") returns the longer operand's length
    k = min(len(grid), max(1, int(round(max(e2e, 4 * step) / step))))
    kernel = np.ones(k) / k
    smooth = np.convolve(raw, kernel, mode="same")
    # edges: average only over the grid points that exist
    norm = np.convolve(np.ones_like(raw), kernel, mode="same")
    smooth = smooth / np.where(norm > 0, norm, 1)
    mid_send = float(sends[len(sends) // 2])
    second_half = (grid >= mid_send) & (grid <= last_send)
    if not second_half.any():
        return None
    level = float(np.median(raw[second_half]))
    if level <= 0:
        return None
    half = max(PLATEAU_TOLERANCE * level, 1.0)
    lo, hi = level - half, level + half
    inside = (smooth >= lo) & (smooth <= hi) & (grid <= last_send)
    if not inside.any():
        return None
    start, end = _plateau_segment(inside, grid, 2 * k, second_half)
    # in flight fills for one request lifetime (Little's law): no plateau before then. A 2 s
    # flood whose requests lived 10 s was smoothed into a "steady window" over its ramp.
    start = max(start, first + e2e)
    end = min(end, last_send)
    if end <= start:
        return None
    w = Window(start, end, "steady", level, (lo, hi))
    if w.duration_s < MIN_WINDOW_SHARE * span:
        w.warning = (
            f"the steady window is {w.duration_s:.1f} s, {w.duration_s / span:.0%} of the run: "
            "the summary leads with a short plateau, so its figures are few; run longer "
            "(--num-requests, --duration)"
        )
    return w


def _plateau_segment(
    inside: np.ndarray, grid: np.ndarray, max_gap: int, second_half: np.ndarray
) -> tuple[float, float]:
    """The in-band stretch of the plateau: in-band runs joined across gaps of at most
    `max_gap` grid steps (noise), the one that covers most of the second half."""
    idx = np.flatnonzero(inside)
    segments: list[list[int]] = [[int(idx[0]), int(idx[0])]]
    for i in idx[1:]:
        if i - segments[-1][1] <= max_gap:
            segments[-1][1] = int(i)
        else:
            segments.append([int(i), int(i)])
    best = max(segments, key=lambda s: (int(second_half[s[0] : s[1] + 1].sum()), s[1] - s[0]))
    return float(grid[best[0]]), float(grid[best[1]])


def choose_window(records: list[RequestRecord], spec: str | tuple[float, float]) -> Window | None:
    """The window `spec` names (`parse_window`'s result); None for `all` or when a steady
    window cannot be found."""
    if spec == "all":
        return None
    if spec == "steady":
        return steady_window(records)
    start, end = spec  # type: ignore[misc]
    return Window(float(start), float(end), "range")


def started_in(records: list[RequestRecord], w: Window) -> list[RequestRecord]:
    """The measured requests sent inside the window (whose latencies it reports)."""
    return [r for r in _measured(records) if w.start_s <= r.sent_s < w.end_s]


def window_figures(records: list[RequestRecord], w: Window, slo: dict | None = None) -> dict:
    """A summary (`summarize`'s shape) of the window: latencies of the requests sent in it,
    request and token throughput of what completed (tokens received) in it per second."""
    inside = started_in(records, w)
    summary: dict = dict(summarize(inside, w.duration_s or None, slo))
    ok = [r for r in _measured(records) if r.ok]
    done = sum(1 for r in ok if w.start_s <= r.end_s < w.end_s)
    tokens = 0
    for r in ok:
        if r.token_times_s:  # arrival order: two bisections count the tokens inside
            t = r.token_times_s
            tokens += bisect.bisect_left(t, w.end_s) - bisect.bisect_left(t, w.start_s)
        elif w.start_s <= r.end_s < w.end_s:
            tokens += output_tokens(r)
    dur = w.duration_s
    summary["request_throughput"] = done / dur if dur > 0 else None
    summary["output_throughput"] = tokens / dur if dur > 0 else None
    summary["total_token_throughput"] = None  # prompts are not attributed to a window
    summary["window"] = w.to_dict()
    summary["counts"]["completed_in_window"] = done
    return summary


def add_window_summary(
    summary: dict, records: list[RequestRecord], spec, slo=None, steady: bool = True
) -> None:
    """run.json: the steady window (always looked for; `steady=False`: the run was
    over-saturated, so it has none) and, when one is chosen, its figures beside the whole
    run's; `summary["lead"]` says which the summary leads with."""
    steady_w = steady_window(records) if steady else None
    _add(summary, records, spec, slo, steady_w)
    if not steady and spec == "steady":
        summary["lead_note"] = "no steady window: the run was over-saturated (whole run)"


def _add(summary: dict, records, spec, slo, steady: Window | None) -> None:
    summary["steady_window"] = None if steady is None else steady.to_dict()
    chosen = steady if spec == "steady" else choose_window(records, spec)
    figures = None if chosen is None else window_figures(records, chosen, slo)
    if spec == "steady" and steady is None:
        summary["lead_note"] = "no steady window found (run too short or never level): whole run"
    elif spec == "steady" and figures is not None and figures["counts"]["total"] < MIN_REQUESTS:
        summary["lead_note"] = (
            f"the steady window {steady.start_s:.1f}-{steady.end_s:.1f} s holds "  # type: ignore[union-attr]
            f"{figures['counts']['total']} requests (< {MIN_REQUESTS}): the summary leads with "
            "the whole run"
        )
        chosen = figures = None
    summary["lead"] = "all" if chosen is None else chosen.kind
    summary["window_figures"] = figures


def window_line(summary: dict) -> str | None:
    """One line for the console: the window's figures beside the whole run's."""
    wf = summary.get("window_figures")
    if not wf:
        return summary.get("lead_note")
    w = wf["window"]

    def ms(block: dict, key: str) -> str:
        v = (block.get(key) or {}).get("p50")
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:.0f} ms"

    thr = wf.get("request_throughput")
    whole_thr = summary.get("request_throughput")
    kind = "steady window" if w["kind"] == "steady" else "window"
    line = (
        f"{kind} {w['start_s']:.1f}-{w['end_s']:.1f} s ({wf['counts']['total']} requests sent "
        f"in it): TTFT p50 {ms(wf, 'ttft_s')} (whole run {ms(summary, 'ttft_s')}), TPOT p50 "
        f"{ms(wf, 'tpot_s')} (whole run {ms(summary, 'tpot_s')}), "
        f"{thr or 0:.2f} req/s (whole run {whole_thr or 0:.2f})"
    )
    if w.get("warning"):
        line += f"; {w['warning']}"
    return line


def run_lead(meta: dict) -> str | tuple[float, float]:
    """What a run's summary led with (`--window` as given when it was run): steady, all or
    (start, end); runs from before windows: all."""
    summary = meta.get("summary") if isinstance(meta.get("summary"), dict) else {}
    lead = summary.get("lead")
    if lead == "range":
        w = (summary.get("window_figures") or {}).get("window") or {}
        return (float(w["start_s"]), float(w["end_s"]))
    return "steady" if lead == "steady" or summary.get("lead_note") else "all"  # asked for


def windowed_run(run: Run, spec: str | tuple[float, float]) -> tuple[Run, Window | None]:
    """The run restricted to the window `spec` names (requests sent in it; its length as the
    measured duration), and the window; `all` (or no steady window): the run as it is."""
    w = choose_window(run.records, spec)
    if w is None:
        return run, None
    summary = dict(run.meta.get("summary") or {})
    summary["duration_s"] = w.duration_s
    keep = [
        r
        for r in run.records
        if r.warmup or (r.sent_s is not None and w.start_s <= r.sent_s < w.end_s)
    ]
    meta = {**run.meta, "summary": summary, RECORDS_KEY: record_counts(keep)}  # the part kept
    return dataclasses.replace(run, meta=meta, records=keep), w


def same_kind(base_meta: dict, cand_meta: dict, given: str | None) -> tuple[object, str | None]:
    """The window kind a comparison uses, and a note when it had to choose: `given`
    (--window), else what both runs led with; runs that led with different kinds (one from
    before windows, say) are compared over their whole runs, and the note says so."""
    if given is not None:
        return parse_window(given), None
    b, c = run_lead(base_meta), run_lead(cand_meta)
    if b != c:
        return "all", (
            f"the baseline led with {_kind(b)}, the candidate with {_kind(c)}: compared the "
            "whole runs (--window steady, all or START:END chooses)"
        )
    return b, None


def _kind(spec) -> str:
    return {"steady": "its steady window", "all": "the whole run"}.get(spec, f"window {spec}")
