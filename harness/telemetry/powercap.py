"""CPU package energy from Linux powercap (Intel/AMD RAPL): the energy figure where NVML is
absent.

Reads each top-level zone's `energy_uj` (`/sys/class/powercap/intel-rapl:N`, name
`package-N`; sub-zones such as `core` are inside their package and not added again) every
tick, adds the increments (a counter that wraps at `max_energy_range_uj` is unwrapped) and
writes one `timeseries.jsonl` sample per tick (`source: "powercap"`, `power_w` over the
zones). Without a readable zone (no powercap, or `energy_uj` readable by root only, as on
most kernels since 2020) it says why once and records nothing: absent, never zero. The root
is a parameter so tests read a fake tree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

POWERCAP_ROOT = Path("/sys/class/powercap")


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


class PowercapSampler:
    name = "powercap"

    def __init__(self, interval_s: float = 0.25, root: Path | str = POWERCAP_ROOT) -> None:
        assert interval_s > 0, "interval must be positive"
        self.interval_s, self.root = interval_s, Path(root)
        self.zones: dict[str, Path] = {}  # name -> zone folder
        self.unavailable_reason: str | None = None
        self._last: dict[str, int] = {}
        self._range: dict[str, int] = {}
        self._energy_j: dict[str, float] = {}
        self._t0_ns = 0
        self._first_s: float | None = None
        self._last_s: float | None = None
        self._latest: dict = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sink: Callable[[dict], None] = lambda _s: None

    def _open(self) -> bool:
        found = sorted(p for p in self.root.glob("*") if (p / "energy_uj").exists())
        top = [p for p in found if p.name.count(":") == 1]  # intel-rapl:0, not intel-rapl:0:0
        if not top:
            self.unavailable_reason = f"no RAPL zone under {self.root}"
            return False
        for p in top:
            try:
                label = (p / "name").read_text().strip() if (p / "name").exists() else p.name
                self._last[label] = _read_int(p / "energy_uj")
                rng = p / "max_energy_range_uj"
                self._range[label] = _read_int(rng) if rng.exists() else 0
            except (OSError, ValueError) as exc:
                why = getattr(exc, "strerror", None) or str(exc)
                self.unavailable_reason = f"{p / 'energy_uj'} is not readable ({why})"
                return False
            self.zones[label] = p
            self._energy_j[label] = 0.0
        return True

    def start(self, t0_ns: int, sink: Callable[[dict], None]) -> None:
        assert self._thread is None, "a sampler starts once"
        self._t0_ns, self._sink = t0_ns, sink
        if not self._open():
            log.info("powercap: %s; CPU energy is not recorded", self.unavailable_reason)
            return
        self._first_s = self._now_s()
        self._thread = threading.Thread(target=self._loop, name="cbbench-powercap", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._tick()  # the energy up to the end of the run

    def latest(self) -> dict:
        with self._lock:
            return dict(self._latest)

    def summary(self) -> dict:
        if self.unavailable_reason is not None:
            return {"available": False, "reason": self.unavailable_reason}
        with self._lock:
            span = (self._last_s or 0.0) - (self._first_s or 0.0)
            total = sum(self._energy_j.values())
            return {
                "available": True,
                "energy_j": total,
                "power_w": total / span if span > 0 else None,
                "window_s": span,
                "zones": dict(self._energy_j),
            }

    def _now_s(self) -> float:
        return (time.monotonic_ns() - self._t0_ns) / 1e9

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick()

    def _tick(self) -> None:
        t = self._now_s()
        added = 0.0
        with self._lock:
            for label, p in self.zones.items():
                try:
                    now = _read_int(p / "energy_uj")
                except (OSError, ValueError):
                    continue
                delta = now - self._last[label]
                if delta < 0:  # the counter wrapped
                    delta += self._range[label] if self._range[label] else 0
                self._last[label] = now
                if delta >= 0:
                    self._energy_j[label] += delta / 1e6
                    added += delta / 1e6
            dt = t - (self._last_s if self._last_s is not None else self._first_s or t)
            self._last_s = t
            sample = {"t_s": t, "source": "powercap"}
            if dt > 0:
                sample["power_w"] = added / dt
            self._latest = sample
        self._sink(sample)
