"""The wake sweep: answers the parked executions that no waker came back to.

A wait is settled in one write (the run's commit, an approval's decision) and its parked
execution answered in another call, to another system (Step Functions). Every waker marks the
wake as owed before, or in, its settling write, and the answer drops the mark
(`ratchet.adapters.dynamodb.wakes`). Later actors that find the wait settled answer again (a
sender's retry of a delivered event, a child's retried step, `ratchet.waiting.desk` and
`ratchet.children`), but nothing guarantees one comes. This sweep is what always comes: every
minute (`SWEEP_EVERY_SECONDS`, the stack's schedule) it reads the marks older than
`WAKE_GRACE_SECONDS`, which no live waker can still be working on, and for each:

- a wait item (`WAIT#<step>`): if the run no longer waits there, the wait was settled and the
  execution parked on it is answered (its token, if one is kept; a sleeper woken early is
  restarted); if the run still waits there, its waker died before its settling write, and the
  sweep does what it would have done (delivers the event in the mailbox, settles the children
  that ended), marking its own wake, so nothing is lost whichever write the waker reached;
- an approval item (`APPROVAL#<id>`): the decision it records is sent to the parked execution
  with the token it keeps, as the decider would have (`Resumer.resume`).

A mark with nothing left to answer is dropped, conditional on the mark read, so a waker that
marked the item again meanwhile keeps its own. Answering twice is harmless: Step Functions
takes one answer per token and refuses the next (the task is over), and the execution's next
step reads the run and writes conditionally on its version.

So a settled wait's execution goes on within `WAKE_GRACE_SECONDS + SWEEP_EVERY_SECONDS` (two
minutes) of its waker's death, where it waited for its own timeout (up to a week) before.
Locally nothing is parked on a token: a settled run is runnable, and a worker sweeps what the
local wakers can leave (an event accepted and not delivered, children that ended untold, a
decision settled and not recorded: `ratchet.runtime.local_approvals.deliver_undelivered`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar

from ratchet.errors import ApprovalClosed, ApprovalExpired, RatchetError
from ratchet.ports import ApprovalBook, CheckpointStore, Resumer
from ratchet.state import RunState, RunStatus, utcnow

WAKE_GRACE_SECONDS = 60
"""How old a mark must be before the sweep takes it: longer than a live waker takes from its
mark to its answer (a Lambda waker's calls are bounded by its client's timeouts and its own,
the API's 29 s at most), so the sweep does not race the waker it stands in for."""
SWEEP_EVERY_SECONDS = 60
"""How often the stack runs the sweep (an EventBridge rule, `ratchet/cdk/stack.py`)."""
MAX_WAKES_PER_SWEEP = 500
"""Marks taken per sweep, oldest first; more wait for the next minute."""

SweepOutcome = Literal["answered", "settled", "nothing owed", "failed"]


class Mark(Protocol):
    """One wake owed, as the marks are listed (`ratchet.adapters.dynamodb.wakes.OwedWake`)."""

    @property
    def run_id(self) -> str: ...

    @property
    def sk(self) -> str:
        """The marked item's sort key: a wait item's or an approval item's."""
        ...

    @property
    def how(self) -> str: ...

    @property
    def owed_at(self) -> str: ...


M = TypeVar("M", bound=Mark)


class OwedWakes(Protocol[M]):
    """Where the marks are kept (`ratchet.adapters.dynamodb.wakes.AwsOwedWakes`)."""

    def older_than(self, cutoff: datetime, *, limit: int) -> Sequence[M]: ...

    def clear(self, owed: M) -> bool:
        """Drop the mark if it is still the one read."""
        ...


class Rewaker(Protocol):
    """Answers the execution parked on a run's settled wait (`StepFunctionsNudge.resume`)."""

    def resume(self, run_id: str, step: int) -> bool: ...


@dataclass
class WakeSweep:
    """One pass of the sweep over the marks of one deployment."""

    owed: OwedWakes[Any]
    store: CheckpointStore
    nudge: Rewaker
    deliver: Callable[[str], RunState | None]
    """Settle the run's event wait with its next pending event (`EventDesk.deliver`)."""
    settle_children: Callable[[str], RunState | None]
    """Settle the run's children wait if its children ended (`ChildRunDesk.settle`)."""
    relaunch: Callable[[str], object]
    """Restart a sleeping run's execution (`AwsRuntime.relaunch`)."""
    approvals: ApprovalBook
    resumer: Resumer
    wait_step: Callable[[str], int | None]
    """The step of a wait item's sort key; None for an approval item's."""
    approval_id: Callable[[str], str | None]
    """The approval id of an approval item's sort key; None for a wait item's."""
    logger: Any = None
    clock: Callable[[], datetime] = utcnow

    def __call__(self) -> Counter[str]:
        """Take every mark older than `WAKE_GRACE_SECONDS`; how many ended each way."""
        cutoff = self.clock() - timedelta(seconds=WAKE_GRACE_SECONDS)
        outcomes: Counter[str] = Counter()
        for owed in self.owed.older_than(cutoff, limit=MAX_WAKES_PER_SWEEP):
            try:
                outcome = self._take(owed)
            except RatchetError:
                # Busy for now (a throttle): the mark stays, and the next sweep tries again.
                self._log("warning", "owed wake not taken", owed, exc_info=True)
                outcome = "failed"
            outcomes[outcome] += 1
            if outcome in ("answered", "settled"):
                self._log("info", f"owed wake {outcome}", owed)
        return outcomes

    def _take(self, owed: Mark) -> SweepOutcome:
        step = self.wait_step(owed.sk)
        if step is not None:
            return self._wake_wait(owed, step)
        approval_id = self.approval_id(owed.sk)
        if approval_id is not None:
            return self._deliver_decision(owed, approval_id)
        self.owed.clear(owed)
        return "nothing owed"

    def _wake_wait(self, owed: Mark, step: int) -> SweepOutcome:
        head = self.store.load_head(owed.run_id)
        if head is not None and _waits_at(head, step):
            # Its waker died before its settling write: do what it was doing. What settles
            # here marks its own wake and answers it; this mark is the dead waker's.
            settled = None
            if owed.how == "event":
                settled = self.deliver(owed.run_id)
            elif owed.how == "children":
                settled = self.settle_children(owed.run_id)
            self.owed.clear(owed)
            return "settled" if settled is not None else "nothing owed"
        if owed.how == "woken":
            # A sleeper sits in a Wait state: restart it if no step has begun since the wake
            # (a run that took a step since was restarted already).
            relaunch = head is not None and head.status is RunStatus.RUNNING and head.step == step
            if relaunch:
                self.relaunch(owed.run_id)
            self.owed.clear(owed)
            return "answered" if relaunch else "nothing owed"
        # Settled (or ended, cancelled) and the wake still owed: answer what is parked there.
        answered = self.nudge.resume(owed.run_id, step)
        return "answered" if answered else "nothing owed"

    def _deliver_decision(self, owed: Mark, approval_id: str) -> SweepOutcome:
        approval = self.approvals.get(owed.run_id, approval_id)
        verdict = approval.verdict() if approval is not None else None
        if approval is None or verdict is None:
            # Reopened, closed or gone: its decision is not to be delivered.
            self.owed.clear(owed)
            return "nothing owed"
        head = self.store.load_head(owed.run_id)
        if head is None:
            self.owed.clear(owed)
            return "nothing owed"
        try:
            self.resumer.resume(approval, verdict, head)  # answers, then drops the token
        except (ApprovalClosed, ApprovalExpired):
            # The token was dropped (answered after all, or the run closed the request), or
            # its task is over (timed out, its execution stopped): nothing to wake.
            self.owed.clear(owed)
            return "nothing owed"
        return "answered"

    def _log(self, level: str, message: str, owed: Mark, **kwargs: Any) -> None:
        if self.logger is not None:
            extra = {"run_id": owed.run_id, "how": owed.how, "owed_since": owed.owed_at}
            getattr(self.logger, level)(message, extra=extra, **kwargs)


def _waits_at(head: RunState, step: int) -> bool:
    return head.status is RunStatus.WAITING and head.step == step
