"""A circuit breaker per replica, fed by the answers the router relays (not by /health).

closed: in rotation; every answer is an outcome. It opens after `failures` failures in a
row, when the failures among the last `window` outcomes reach `error_rate` (once at least
half the window is filled), or at once on a hard failure (the connection lost mid-answer).
open: out of rotation for a cool-down, doubled on each failed probe (up to 8x).
half-open: the pool sends one probe request of its own (no client's); it closes on a good
answer and reopens on a bad one. What counts as a failure is the app's call
(router/app.py): refused, lost, timed out, a 5xx, or a 200 that is not an answer.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"
STATE_VALUE = {CLOSED: 0.0, OPEN: 1.0, HALF_OPEN: 2.0}  # the /metrics gauge
MAX_BACKOFF = 8  # the longest cool-down, in cool-downs


@dataclass(frozen=True)
class BreakerSettings:
    failures: int = 3  # consecutive failures that open it (0: never on a streak)
    error_rate: float = 0.5  # failures / window outcomes that open it (0: never on a rate)
    window: int = 20  # outcomes remembered for the rate
    cooldown_s: float = 5.0  # open -> half-open (first probe) after this long


@dataclass
class CircuitBreaker:
    settings: BreakerSettings = field(default_factory=BreakerSettings)
    clock: Callable[[], float] = time.monotonic
    state: str = CLOSED
    streak: int = 0  # consecutive failures
    opened: int = 0  # times it opened, all time
    reason: str | None = None  # the failure that opened it
    _outcomes: deque = field(default_factory=deque)  # True = failure
    _backoff: int = 1
    _until: float = 0.0  # open: when the next probe is due

    def success(self) -> bool:
        """A good answer; True when that closed it (a probe's, when half-open)."""
        if self.state == HALF_OPEN:
            return self._close()
        if self.state == OPEN:  # an answer that was in flight when it opened
            return False
        self.streak = 0
        self._remember(False)
        return False

    def failure(self, reason: str, hard: bool = False) -> bool:
        """A bad answer; True when that opened it (closed -> open or half-open -> open)."""
        if self.state == HALF_OPEN:
            self._backoff = min(self._backoff * 2, MAX_BACKOFF)
            return self._open(reason)
        if self.state == OPEN:  # an answer that was in flight when it opened
            return False
        self.streak += 1
        self._remember(True)
        s = self.settings
        bad = sum(self._outcomes)
        if hard:
            return self._open(reason)
        if s.failures and self.streak >= s.failures:
            return self._open(f"{self.streak} failures in a row (last: {reason})")
        if (
            s.error_rate
            and 2 * len(self._outcomes) >= s.window
            and bad >= s.error_rate * len(self._outcomes)
        ):
            return self._open(f"{bad} of the last {len(self._outcomes)} failed (last: {reason})")
        return False

    def probe_due(self) -> bool:
        """Open and cooled down: now half-open, and the caller sends one probe."""
        if self.state == OPEN and self.clock() >= self._until:
            self.state = HALF_OPEN
            return True
        return False

    @property
    def allows(self) -> bool:
        return self.state == CLOSED

    def _remember(self, failed: bool) -> None:
        self._outcomes.append(failed)
        while len(self._outcomes) > self.settings.window:
            self._outcomes.popleft()

    def _open(self, reason: str) -> bool:
        self.state, self.reason = OPEN, reason
        self.opened += 1
        self._until = self.clock() + self.settings.cooldown_s * self._backoff
        return True

    def _close(self) -> bool:
        self.state, self.reason, self.streak, self._backoff = CLOSED, None, 0, 1
        self._outcomes.clear()
        return True
