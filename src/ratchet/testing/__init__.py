"""Prove your own agent safe to run twice: the crash sweep, the direct test of a key, and an
agent run to its end in process with its waits answered on a fake clock, for pytest.

    from ratchet.testing import check

    def test_my_agent_survives_every_crash():
        report = check("my_agents:agent", effects="my_agents.testing:payments")
        assert report.ok, "\\n".join(report.differences)

`check` is what `ratchet check` runs; `run_agent` runs one schedule (no crash, or one) and
gives what the run left behind; `assert_idempotent` calls a tool twice with one key. Each
runs on a scratch store, in a scratch working directory; nothing touches your stores.
docs/testing-your-agent.md has a worked example. What this module exports (`__all__`, pinned
by tests/unit/test_public_face.py) is its public face.
"""

from __future__ import annotations

from ratchet.testing.clock import FakeClock
from ratchet.testing.kit import assert_idempotent, run_agent
from ratchet.testing.model import Recording
from ratchet.testing.outcome import Crash, CrashKind, Outcome, Verdict
from ratchet.testing.runner import KeyTest, ScheduleRun
from ratchet.testing.script import ApprovalRule, WaitScript
from ratchet.testing.sweep import CheckReport, check

__all__ = [
    "ApprovalRule",
    "CheckReport",
    "Crash",
    "CrashKind",
    "FakeClock",
    "KeyTest",
    "Outcome",
    "Recording",
    "ScheduleRun",
    "Verdict",
    "WaitScript",
    "assert_idempotent",
    "check",
    "run_agent",
]
