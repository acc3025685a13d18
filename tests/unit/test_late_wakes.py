"""A wake that comes after the run's time had come is not called early (issue 36)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ratchet.state import TimerWait
from ratchet.summary import described
from ratchet.waits import timer_woken

DUE = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)


def test_a_wake_before_the_time_is_early_and_one_after_it_is_not():
    early = timer_woken(TimerWait(until=DUE), 3, DUE - timedelta(minutes=5), by="dana")
    late = timer_woken(TimerWait(until=DUE), 3, DUE + timedelta(minutes=5), by="dana")

    assert early.text.startswith("Woken early by dana at 2026-12-06 08:55:00 UTC")
    assert late.text.startswith("Woken by dana, after its time had come, at 2026-12-06 09:05")
    assert described(early.model_dump(mode="json"))["explanation"] == "woken early by dana"
    assert (
        described(late.model_dump(mode="json"))["explanation"]
        == "woken by dana after its time had come"
    )
