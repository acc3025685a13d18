"""A fake clock for checking an agent: the runtime's time, moved on at will, so that a sleep
of a week, an event's timeout or an at-most-once call's deadline passes at once."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from ratchet.state import utcnow


class FakeClock:
    """The real time, plus whatever the test moved it on by (`advance`, `advance_to`): it
    never goes back. Hand it to `LocalRuntime.open(..., clock=...)`; safe across threads."""

    def __init__(self, start: datetime | None = None) -> None:
        self._started = time.monotonic()
        self._start = start or utcnow()
        self._ahead = timedelta(0)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            elapsed = timedelta(seconds=time.monotonic() - self._started)
            return self._start + elapsed + self._ahead

    def advance(self, seconds: float) -> None:
        """Move the time on by `seconds`."""
        with self._lock:
            self._ahead += timedelta(seconds=max(seconds, 0.0))

    def advance_to(self, when: datetime) -> None:
        """Move the time on to `when`, if it is ahead."""
        gap = (when - self()).total_seconds()
        if gap > 0:
            self.advance(gap)

    @property
    def ahead(self) -> float:
        """Seconds this clock is ahead of the real time."""
        with self._lock:
            return self._ahead.total_seconds()
