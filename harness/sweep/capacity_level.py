"""Whether one rate level of the SLO capacity search met the SLO, missed it, or cannot be
judged: a library rule over a level's records, shared by `sweep --find-max-rate` and anything
else that asks "does this rate hold the SLO?".

A level of `planned` requests at `rate` with SLO goodput g (the share that must meet every
SLO) allows floor((1 - g) x planned) misses:

- missed: more misses than that among the requests that finished (decided, however many are
  still to come: `SloWatch` stops the level there), or the level was not sustained (its
  achieved rate fell short of what was sent, harness/sweep/verdict.py: the queue grows, so a
  longer level would miss too);
- undecided: too short to judge (verdict.py: too few requests, or an arrival span shorter
  than a few unloaded latencies, so the queue never had time to build) or stopped before its
  outcome was decided (the level's time limit); it says how many requests it needs;
- met: otherwise. Goodput is always over the requests that finished (a stopped level's is
  not 0 %).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import REQUESTS_FILE
from cbbench.harness.results.summary import meets_slo
from cbbench.harness.sweep.verdict import judge_level

MET, MISSED, UNDECIDED = "met", "missed", "undecided"


@dataclass
class LevelJudgement:
    state: str  # MET | MISSED | UNDECIDED
    goodput_fraction: float | None  # of the requests that finished
    finished: int
    planned: int
    misses: int
    allowed_misses: int
    why: str  # one line: what decided it
    needed_requests: int | None = None  # UNDECIDED: a level at this rate needs this many
    timing_note: str | None = None  # the verdict lies within the client's timing bound

    def to_dict(self) -> dict:
        return asdict(self)


SHIFTED = ("ttft", "ttfo", "e2e")  # latencies a timestamp error moves by up to the bound


def timing_note(
    measured: Sequence[RequestRecord], slo: dict[str, float], j: LevelJudgement, bound: float
) -> str | None:
    """Whether the load generator's timing error bound (summary client.timing_bound_s,
    harness/results/client_timing.py) could flip a met or missed-by-misses verdict: each
    TTFT / TTFO / E2E moved by the bound toward the threshold (TPOT is a difference of two
    stamps over many tokens: left as measured). None when it could not."""
    if bound <= 0 or not (j.state == MET or j.state == MISSED and j.misses > j.allowed_misses):
        return None  # undecided, or missed for not being sustained (rates, not latencies)
    sign = 1.0 if j.state == MET else -1.0  # met: could it miss? missed: could it meet?
    moved = {k: (b - sign * bound if k in SHIFTED else b) for k, b in slo.items()}
    misses = sum(not meets_slo(r, moved) for r in measured)
    if (misses > j.allowed_misses) == (j.state == MISSED):
        return None
    return (
        f"{j.state} with {j.misses} misses ({j.allowed_misses} allowed), but {misses} with "
        f"every TTFT/E2E {'+' if sign > 0 else '-'}{bound * 1e3:.0f} ms (the load "
        "generator's timing error bound)"
    )


def offered_rps(records: Sequence[RequestRecord]) -> float | None:
    """The rate a level actually offered: (requests sent - 1) / (last send - first send),
    over every measured request that was sent (failed ones too). A Poisson draw and sends
    that lag their schedule both move it off the level's nominal rate; None: < 2 sends."""
    sent = sorted(r.sent_s for r in records if not r.warmup and r.sent_s is not None)
    if len(sent) < 2 or sent[-1] <= sent[0]:
        return None
    return (len(sent) - 1) / (sent[-1] - sent[0])


def allowed_misses(planned: int, goodput: float) -> int:
    return math.floor((1.0 - goodput) * planned + 1e-9)


def queue_bound(slo: dict[str, float]) -> float | None:
    """The SLO a growing queue breaks first: TTFT, else E2E (verdict.QUEUE_SPAN)."""
    return slo.get("ttft") or slo.get("e2e")


def judge_capacity_level(
    records: Sequence[RequestRecord],
    rate: float,
    slo: dict[str, float],
    goodput: float,
    planned: int,
    stopped: str | None = None,
    timing_bound_s: float | None = None,
) -> LevelJudgement:
    """The level's state (module docstring). `stopped`: why the level was stopped early, if
    it was (the SLO watch's reason, or a time limit). `timing_bound_s`: the run's load
    generator timing error bound; `timing_note` says when it could flip the verdict."""
    j = _judge(records, rate, slo, goodput, planned, stopped)
    if timing_bound_s:
        measured = [r for r in records if not r.warmup]
        j.timing_note = timing_note(measured, slo, j, timing_bound_s)
    return j


def _judge(
    records: Sequence[RequestRecord],
    rate: float,
    slo: dict[str, float],
    goodput: float,
    planned: int,
    stopped: str | None,
) -> LevelJudgement:
    measured = [r for r in records if not r.warmup]
    n = len(measured)
    misses = sum(not meets_slo(r, slo) for r in measured)
    allowed = allowed_misses(planned, goodput)
    frac = (n - misses) / n if n else None
    j = LevelJudgement(UNDECIDED, frac, n, planned, misses, allowed, "")
    if misses > allowed:
        j.state = MISSED
        j.why = f"{misses} of {n} finished requests missed the SLO; {planned} allow {allowed}"
        return j
    verdict = judge_level(measured, rate, queue_bound(slo))
    if stopped:
        j.why = f"stopped before its outcome was decided ({stopped})"
        j.needed_requests = verdict.needed_requests
        return j
    if verdict.too_short:
        j.why, j.needed_requests = verdict.too_short, verdict.needed_requests
        return j
    if verdict.sustained is False:
        j.state = MISSED
        j.why = (
            f"not sustained: served {verdict.achieved_rps or 0:.3g} of "
            f"{verdict.offered_window_rps or 0:.3g} req/s offered (the queue grows; a longer "
            "level would miss the SLO)"
        )
        return j
    j.state = MET
    j.why = f"{n - misses} of {n} met the SLO ({planned} allow {allowed} misses), sustained"
    return j


class SloWatch:
    """Stops a capacity level once its outcome is decided: more requests have missed the
    SLO than the whole level allows (the server is over-saturated for this SLO), or at the
    level's time limit. A sampler (`start(t0_ns, sink)`, `stop()`, `summary()`) that tails
    the level's requests.jsonl; it stops the level as Ctrl-C does (what finished is kept) and
    names why in `stop_reason`, so the run says "stopped", never "interrupted"."""

    name = "slo-watch"

    def __init__(
        self,
        run_dir: Path,
        slo: dict[str, float],
        planned: int,
        goodput: float,
        timeout_s: float,
        poll_s: float = 0.1,
    ) -> None:
        self.path = Path(run_dir) / REQUESTS_FILE
        self.slo = slo
        self.planned = planned
        self.allowed = allowed_misses(planned, goodput)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.stop_reason: str | None = None
        self.finished = self.misses = 0
        self._offset = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self, t0_ns: int, sink) -> None:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="slo-watch")
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self._halt.set()
        if self._thread is not None:
            self._thread.join(5)

    def summary(self) -> dict:
        return {"stopped_early": self.stop_reason, "misses": self.misses}

    def _read(self) -> None:
        import json

        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next read
        self._offset += end
        for line in data[:end].splitlines():
            try:
                rec = RequestRecord.from_dict(json.loads(line))
            except (ValueError, TypeError):
                continue
            if not rec.warmup:
                self.finished += 1
                self.misses += not meets_slo(rec, self.slo)

    def verdict(self) -> str | None:
        if self.misses > self.allowed:
            return (
                f"over-saturated: {self.misses} of the {self.finished} finished requests "
                f"missed the SLO, more than the {self.allowed} of {self.planned} allowed"
            )
        if time.monotonic() - self._t0 > self.timeout_s:
            return f"level time limit {self.timeout_s:g} s reached"
        return None

    def _loop(self) -> None:
        while not self._halt.wait(self.poll_s):
            self._read()
            if self.finished >= self.planned:
                return
            reason = self.verdict()
            if reason is not None:
                with self._lock:
                    if self._stopped:
                        return
                    self.stop_reason = reason
                    os.kill(os.getpid(), signal.SIGINT)  # the runner's Ctrl-C: keep what finished
                return
