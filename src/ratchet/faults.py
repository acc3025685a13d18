"""Fault injection: crash the engine at an exact point to prove it survives there.

`RATCHET_FAULT=<action>:<point>@<step>`, e.g. `kill:after_tool@23`. `raise` raises
`InjectedFault`; `kill` sends SIGKILL to this very process, so nothing (no finally, no atexit)
runs, as when a machine disappears; `stop` sends it SIGSTOP, so it stands still there (as a
process the scheduler, a debugger or a frozen VM holds) until a SIGCONT, then goes on as if
nothing happened: a test does what it likes meanwhile. Several faults may be joined with
commas. A fault fires every time its point is reached at its step in this process: a new
process without the variable is what recovers.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from enum import StrEnum

from ratchet.errors import InjectedFault, InvalidInput


class FaultPoint(StrEnum):
    BEFORE_MODEL = "before_model"
    AFTER_MODEL = "after_model"
    AFTER_DECISION = "after_decision"
    AFTER_CALL_STARTED = "after_call_started"
    """An at-most-once tool's call is marked started in the ledger; the tool is not called yet."""
    AFTER_TOOL = "after_tool"
    AFTER_CHILDREN_STARTED = "after_children_started"
    """The step's child runs (`start_runs`) are created, the step not committed."""
    BEFORE_COMMIT = "before_commit"
    AFTER_COMMIT = "after_commit"
    AFTER_EVENT_ACCEPTED = "after_event_accepted"
    """In the event desk: the event is in the run's mailbox, not yet delivered (the step is
    the one the run is at)."""
    AFTER_WAIT_SETTLED = "after_wait_settled"
    """A waker (the event desk, the children desk, the approval desk) has settled a wait: the
    event or the children's ends are recorded, the person's decision taken; the execution
    parked on it is not answered yet (the step is the one the wait is at)."""


STEP_POINTS = (
    FaultPoint.BEFORE_MODEL,
    FaultPoint.AFTER_MODEL,
    FaultPoint.AFTER_DECISION,
    FaultPoint.AFTER_TOOL,
    FaultPoint.BEFORE_COMMIT,
    FaultPoint.AFTER_COMMIT,
)
"""The points inside every engine step (`AFTER_CALL_STARTED` is inside a step calling an
at-most-once tool only, `AFTER_CHILDREN_STARTED` inside a step that starts child runs; the
others are in the desks that settle waits)."""


class FaultAction(StrEnum):
    RAISE = "raise"
    KILL = "kill"
    STOP = "stop"


@dataclass(frozen=True)
class Fault:
    action: FaultAction
    point: FaultPoint
    step: int

    def __str__(self) -> str:
        return f"{self.action}:{self.point}@{self.step}"


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple[Fault, ...] = ()

    @classmethod
    def parse(cls, spec: str | None) -> FaultPlan:
        if not spec or not spec.strip():
            return cls()
        return cls(tuple(_parse_one(part.strip()) for part in spec.split(",") if part.strip()))

    def hit(self, point: FaultPoint, step: int) -> None:
        for fault in self.faults:
            if fault.point is point and fault.step == step:
                if fault.action is FaultAction.STOP:
                    os.kill(os.getpid(), signal.SIGSTOP)
                    continue
                if fault.action is FaultAction.KILL:
                    os.kill(os.getpid(), signal.SIGKILL)
                raise InjectedFault(f"injected fault {fault}")


NO_FAULTS = FaultPlan()


def _parse_one(text: str) -> Fault:
    try:
        action, rest = text.split(":", 1)
        point, step = rest.split("@", 1)
        return Fault(FaultAction(action), FaultPoint(point), int(step))
    except ValueError:
        points = ", ".join(p.value for p in FaultPoint)
        raise InvalidInput(
            f"bad RATCHET_FAULT {text!r}: expected <raise|kill|stop>:<point>@<step> with point "
            f"one of {points}"
        ) from None
