"""Approvals on the local runtime: a decision is recorded by the engine, and the next free
worker picks the run up, as `ratchet approve` does. A request nobody answers in time expires
as on AWS: the worker records what `RecordDecision` records after the state machine's
`ApprovalExpired` branch."""

from __future__ import annotations

from datetime import datetime

from ratchet.adapters.sqlite.approvals import SqliteApprovalBook
from ratchet.engine import Engine
from ratchet.errors import ApprovalClosed, NotWaiting, StaleVersion
from ratchet.state import RunState
from ratchet.waits import Approval, ApprovalStatus, Verdict, expired_verdict

RESUME_TRIES = 3
"""Writes of the decision before the resume gives up on a head that keeps moving: the first
on the head the desk read, each later one on the head read again (each move is a commit)."""


class LocalResumer:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def resume(self, approval: Approval, verdict: Verdict, run: RunState) -> RunState:
        head: RunState | str = run
        tries = 1
        while True:
            try:
                return self._engine.decide_waiting(head, verdict, step=approval.step)
            except NotWaiting as stopped:
                raise ApprovalClosed(str(stopped)) from None
            except StaleVersion:
                # The head moved between the desk's read and this write: a cancel, or a
                # decision recorded directly (`Decider.decide_or_record` on a step that had no
                # request when it looked). Read it again: a run that still waits at the step
                # takes this answer; one that stopped waiting refuses it above, never twice. A
                # head that keeps moving is left to the desk, which reopens the request.
                if tries == RESUME_TRIES:
                    raise
                tries += 1
                head = approval.run_id


def expire_overdue(book: SqliteApprovalBook, engine: Engine, now: datetime) -> list[str]:
    """Record the expiry of every pending request past its deadline, as `RecordDecision` does
    on AWS: the waiting run gets a rejection by nobody (`expired_verdict`) as its step's
    result and is runnable again, and the step's requests are marked expired. A run no longer
    waiting at that step is left as it is; its requests are marked expired all the same.
    Returns the runs that go on."""
    resumed: list[str] = []
    for approval in book.pending():
        if not approval.is_expired(now):
            continue
        timeout = round((approval.expires_at - approval.created_at).total_seconds())
        try:
            # Conditional on the step: a person who decided first (the request is then no
            # longer pending) or a run that went on makes this a no-op.
            engine.decide_waiting(approval.run_id, expired_verdict(timeout), step=approval.step)
            resumed.append(approval.run_id)
        except NotWaiting:
            pass
        book.close(approval.run_id, approval.step, ApprovalStatus.EXPIRED, at=now)
    return resumed
