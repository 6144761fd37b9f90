"""The over-saturation watch of `cbbench bench`: fed each finished request and telemetry
sample by the runner (`on_record` / `on_sample`), it judges the shared rule (saturation.py)
and, with `--on-saturation stop`, stops the run the way the runner's own early stop does:
no new request is sent, the ones in flight are cancelled, every finished one is kept.

Only open loops with a spread of arrival times are judged: a closed loop caps what is in
flight, and an all-at-once burst queues by design. An open loop too short or too small for
the rule is not judged, and says so (`too_short_to_judge`, saturation.too_short).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable, Sequence

from cbbench.harness.conclusions import saturation
from cbbench.harness.results.records import RequestRecord

ON_SATURATION = ("stop", "continue")
CHECK_EVERY_S = 0.1  # run time between two checks of the rule (each is O(1) but rules 2, 3)


class SaturationWatch:
    name = "saturation"

    def __init__(self, arrivals: Sequence[float] | None, on_saturation: str = "stop") -> None:
        assert on_saturation in ON_SATURATION, on_saturation
        self.arrivals = sorted(a for a in (arrivals or []) if a is not None)
        self.judged = (
            len(self.arrivals) >= saturation.MIN_POINTS
            and self.arrivals[-1] - self.arrivals[0] >= saturation.MIN_SECONDS
        )
        # an open loop with a spread of sends, too few or too short for the rule: said so
        self.too_short_to_judge = (
            not self.judged and len(self.arrivals) > 1 and self.arrivals[-1] > self.arrivals[0]
        )
        self.stop_run = on_saturation == "stop"
        self.found: dict | None = None  # the verdict, once seen
        self._stop: Callable[[], None] | None = None
        self._fit_ttft = saturation.OnlineSlope()  # TTFT on send time
        self._fit_flight = saturation.OnlineSlope()  # requests in flight on time
        self._first_sent: list[tuple[float, float]] = []  # (sent, TTFT) of the earliest sent
        self._ttft: list[float] = []  # in completion order
        self._waiting: list[float] = []
        self._checked = -1.0  # when the rule was last asked (run time)
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
        self._fit_flight.add(now, bisect.bisect_right(self.arrivals, now) - self._done)
        if r.ok and r.ttft_s is not None and r.sent_s is not None:
            self._fit_ttft.add(r.sent_s, r.ttft_s)
            self._ttft.append(r.ttft_s)
            bisect.insort(self._first_sent, (r.sent_s, r.ttft_s))
            del self._first_sent[saturation.WINDOW :]  # only the earliest few are needed
        if now <= 0 or now - self._checked < CHECK_EVERY_S:
            return
        self._checked = now
        sent = bisect.bisect_right(self.arrivals, now)  # offered: over the sending span
        offered = sent / max(1e-9, min(now, self.arrivals[-1]))
        served = self._done / now
        early = statistics.median(t for _, t in self._first_sent) if self._first_sent else 0.0
        reason = saturation.verdict(
            self._fit_ttft, self._fit_flight, early, self._ttft, self._waiting, now,
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
