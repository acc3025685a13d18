"""Approvals on the local runtime: a decision is recorded by the engine, and the next free
worker picks the run up, as `ratchet approve` does. A request nobody answers in time expires
as on AWS: the worker records what `RecordDecision` records after the state machine's
`ApprovalExpired` branch. A decision whose decider died between settling the request and
recording it on the run is recorded by a worker (`deliver_undelivered`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from ratchet.engine import Engine
from ratchet.errors import ApprovalClosed, NotWaiting, StaleVersion
from ratchet.ports import ApprovalBook
from ratchet.state import RunState
from ratchet.waits import Approval, ApprovalStatus, Verdict, expired_verdict

RESUME_TRIES = 3
"""Writes of the decision before the resume gives up on a head that keeps moving: the first
on the head the desk read, each later one on the head read again (each move is a commit)."""
DELIVERY_MARGIN_SECONDS = 5.0


class ListedApprovals(ApprovalBook, Protocol):
    """A book a worker reads whole for what it owes: the local stores' (SQLite, Postgres)."""

    def pending(self) -> list[Approval]: ...

    def undelivered(self, *, decided_before: datetime) -> list[Approval]: ...


def delivery_time(busy_timeout: float) -> timedelta:
    """The longest a live decider takes from settling a request to recording it on the run:
    each of its writes waits at most the store's busy timeout for the lock. A decision older
    than this that the run does not have was left by a decider that died (or froze: if it
    comes back, it finds the decision recorded, `Decider.decide`, and says it was)."""
    return timedelta(seconds=RESUME_TRIES * busy_timeout + DELIVERY_MARGIN_SECONDS)


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


def expire_overdue(book: ListedApprovals, engine: Engine, now: datetime) -> list[str]:
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


def deliver_undelivered(
    book: ListedApprovals, engine: Engine, now: datetime, *, after: timedelta
) -> list[str]:
    """Record every decision a person took longer than `after` ago (`delivery_time`) that
    its run, still waiting at the request's step, never got: its decider settled the request,
    then died before recording it. The record is the engine's one conditional write, as the
    decider's would have been. Returns the runs that go on."""
    resumed: list[str] = []
    for approval in book.undelivered(decided_before=now - after):
        verdict = approval.verdict()
        if verdict is None:
            continue
        try:
            engine.decide_waiting(approval.run_id, verdict, step=approval.step)
        except (NotWaiting, StaleVersion):
            continue  # recorded meanwhile (the decider came back), or the run moved on
        resumed.append(approval.run_id)
    return resumed
