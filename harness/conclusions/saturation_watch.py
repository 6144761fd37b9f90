"""The over-saturation watch of `cbbench bench`: fed each finished request and telemetry
sample by the runner (`on_record` / `on_sample`), it judges the shared rule (saturation.py)
and, with `--on-saturation stop`, stops the run the way the runner's own early stop does:
no new request is sent, the ones in flight are cancelled, every finished one is kept.

Only open loops with a spread of arrival times are judged: a closed loop caps what is in
flight, and an all-at-once burst queues by design.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from cbbench.harness.conclusions import saturation
from cbbench.harness.results.records import RequestRecord

ON_SATURATION = ("stop", "continue")


class SaturationWatch:
    name = "saturation"

    def __init__(self, arrivals: Sequence[float] | None, on_saturation: str = "stop") -> None:
        assert on_saturation in ON_SATURATION, on_saturation
        self.arrivals = sorted(a for a in (arrivals or []) if a is not None)
        self.judged = (
            len(self.arrivals) >= saturation.MIN_POINTS
            and self.arrivals[-1] - self.arrivals[0] >= saturation.MIN_SECONDS
        )
        self.stop_run = on_saturation == "stop"
        self.found: dict | None = None  # the verdict, once seen
        self._stop: Callable[[], None] | None = None
        self._sent: list[float] = []
        self._ttft: list[float] = []  # in completion order
        self._times: list[float] = []
        self._in_flight: list[float] = []
        self._waiting: list[float] = []
        self._done = 0
        self._since: float | None = None  # since when every check found the rule true

    # the runner's hooks
    def bind_stop(self, stop: Callable[[], None]) -> None:
        self._stop = stop

    def on_sample(self, sample: dict) -> None:
        w = sample.get("waiting")
        if isinstance(w, (int, float)) and not isinstance(w, bool):
            self._waiting.append(float(w))

    def on_record(self, r: RequestRecord) -> None:
        if r.warmup or not self.judged or self.found is not None or r.end_s is None:
            return
        self._done += 1
        now = r.end_s
        self._times.append(now)
        self._in_flight.append(bisect.bisect_right(self.arrivals, now) - self._done)
        if r.ok and r.ttft_s is not None and r.sent_s is not None:
            self._sent.append(r.sent_s)
            self._ttft.append(r.ttft_s)
        if now <= 0:
            return
        sent = bisect.bisect_right(self.arrivals, now)  # offered: over the sending span
        offered = sent / max(1e-9, min(now, self.arrivals[-1]))
        served = self._done / now
        reason = saturation.verdict(
            self._sent, self._ttft, self._times, self._in_flight, self._waiting, now,
            offered, served,
        )  # fmt: skip
        if reason is None:
            self._since = None
            return
        if self._since is None:
            self._since = now
        if now - self._since < saturation.HOLD_S:  # a burst works off; a flood does not
            return
        line = saturation.saturation_line(now, offered, served)
        self.found = {
            "t_s": now,
            "offered_rps": offered,
            "served_rps": served,
            "reason": reason,
            "line": line,
            "stopped": self.stop_run,
        }
        if self.stop_run and self._stop is not None:
            self._stop()
