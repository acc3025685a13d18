"""A run's feed: the events a product cares about, in order, each with a stable id that only
increases, read from the checkpoint records the store already keeps.

There is no second copy of the history: every checkpoint record is one event, its id the
record's version (the commit that wrote it), so an event's id orders it among the run's and a
follower resumes after the last id it read with one range read (`list_checkpoints(after=id)`).
Ids are not consecutive: a version that counted an attempt wrote the head alone, and no event.

    started          the run was created (its agent, and the run that started it, if any)
    step             a step committed: its tool and a short result (and the child runs it
                     started, if it started some and goes on)
    waiting          a step committed and the run parks: what for (`wait`), and how to answer
    decided          a person approved or rejected what the run asked
    event_received   an event settled the run's wait (its name and id)
    woke             a timer came due, someone woke the run, or an event wait timed out
    children_ended   the child runs the run waited for ended (how each ended)
    attempt_failed   an attempt at a step failed, with the cause (the step is tried again)
    retried          someone retried a failed run
    done, failed, stopped, cancelled
                     the run ended: its summary or error

`FeedCursor` reads the feed after an id, a batch at a time, and says when the run has reached
a status the reader waits for; `Client.follow`, `ratchet watch --json`, the SSE feed of
`ratchet serve` and the runs API's long poll all read through it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from ratchet.errors import RatchetError, RunNotFound, StoreBusy
from ratchet.state import (
    FINISHED,
    AnyWait,
    ApprovalRequest,
    AttemptFailed,
    BudgetAsked,
    ChildrenWait,
    Created,
    EventWait,
    Finished,
    PersonDecided,
    Reserved,
    Retried,
    RunState,
    RunStatus,
    StepCompleted,
    StoredCheckpoint,
    TimerWait,
    WaitSettled,
    wait_due,
    wait_kind,
)
from ratchet.summary import shorten

RESULT_CHARS = 200
"""A tool's result, an error or a summary is cut to this many characters in an event: the
feed says what happened; `history` and the step records hold the whole."""

FeedEventType = Literal[
    "started",
    "step",
    "waiting",
    "decided",
    "event_received",
    "woke",
    "children_ended",
    "attempt_failed",
    "retried",
    "done",
    "failed",
    "stopped",
    "cancelled",
]


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True)


class FeedWait(_Answer):
    """What a waiting run waits for, and where it is answered (paths of the runs API, which
    `ratchet serve` serves too)."""

    kind: Literal["person", "event", "timer", "children"]
    step: int
    prompt: str
    name: str | None = None
    """The event's name, for an event wait."""
    until: datetime | None = None
    """When the wait settles by itself: a timer's time, an event wait's timeout."""
    children: list[str] | None = None
    """The child runs a children wait waits for."""
    answer: dict[str, str]
    """How to answer it, by action: `approve` and `reject` (a person), `send` and, for a wait
    that takes webhooks, `hook` (an event), `wake` (a timer); none for child runs."""


class ChildEnded(_Answer):
    run_id: str
    status: RunStatus


class FeedEvent(_Answer):
    """One event of a run's feed. Fields that do not apply to its type are None (and left out
    of its JSON)."""

    id: int
    """The checkpoint's version: increasing, stable, the cursor to resume after."""
    run_id: str
    type: FeedEventType
    status: RunStatus
    """The run's status once the event happened."""
    step: int
    """The step the event concerns (for a failed attempt, the step it tried)."""
    at: datetime
    agent: str | None = None
    """The run's agent (`started`)."""
    parent: str | None = None
    """The run that started this one (`started`, for a child run)."""
    tool: str | None = None
    result: str | None = None
    """The tool's result (`step`, `waiting`), or what settled a wait, cut short."""
    wait: FeedWait | None = None
    children: list[str] | None = None
    """The child runs the step started (`step`, `waiting`)."""
    ended: list[ChildEnded] | None = None
    """How each child run stood when the wait for them settled (`children_ended`)."""
    approved: bool | None = None
    by: str | None = None
    comment: str | None = None
    name: str | None = None
    """The event's name (`event_received`, `woke` for an event wait's timeout)."""
    event_id: str | None = None
    attempt: int | None = None
    error: str | None = None
    summary: str | None = None

    def data(self) -> dict[str, Any]:
        """The event as JSON: what an SSE `data:` line and a `--json` line carry."""
        return self.model_dump(mode="json", exclude_none=True)


_WOKE = frozenset({"due", "woken", "timeout"})


def feed_event(checkpoint: StoredCheckpoint) -> FeedEvent:
    """The feed's event for one checkpoint record."""
    event = checkpoint.event
    common: dict[str, Any] = {
        "id": checkpoint.version,
        "run_id": checkpoint.run_id,
        "status": checkpoint.status,
        "step": checkpoint.step,
        "at": checkpoint.created_at,
    }
    if isinstance(event, Created):
        return FeedEvent(
            type="started", agent=event.state.agent, parent=event.state.parent, **common
        )
    if isinstance(event, StepCompleted):
        wait = event.wait if checkpoint.status is RunStatus.WAITING else None
        return FeedEvent(
            type="waiting" if wait is not None else "step",
            tool=event.call.name,
            result=shorten(event.output.text, RESULT_CHARS),
            wait=feed_wait(checkpoint.run_id, event.step, wait) if wait is not None else None,
            children=list(event.started) if event.started else None,
            **common,
        )
    if isinstance(event, PersonDecided):
        return FeedEvent(
            type="decided", approved=event.approved, by=event.by, comment=event.comment, **common
        )
    if isinstance(event, WaitSettled):
        kind: FeedEventType = (
            "event_received"
            if event.how == "event"
            else "children_ended"
            if event.how == "children"
            else "woke"
        )
        ended = [ChildEnded(run_id=c.run_id, status=c.status) for c in event.children or []]
        return FeedEvent(
            type=kind,
            result=shorten(event.text, RESULT_CHARS),
            name=event.name,
            event_id=event.event_id,
            by=event.by,
            ended=ended if event.how == "children" else None,
            **common,
        )
    if isinstance(event, AttemptFailed):
        return FeedEvent(
            type="attempt_failed",
            attempt=event.attempt,
            error=shorten(event.error, RESULT_CHARS),
            **{**common, "step": event.step},
        )
    if isinstance(event, Finished):
        return FeedEvent(
            type=event.status.value,
            summary=shorten(event.summary, RESULT_CHARS) if event.summary else None,
            error=shorten(event.error, RESULT_CHARS) if event.error else None,
            **common,
        )
    if isinstance(event, Retried):
        return FeedEvent(type="retried", by=event.by, **common)
    if isinstance(event, BudgetAsked):
        # The run parks for a person, as a step that asks one does: at its last step.
        request = event.request
        return FeedEvent(
            type="waiting", wait=feed_wait(checkpoint.run_id, checkpoint.step, request), **common
        )
    raise AssertionError(f"no feed event for a {type(event).__name__} record")  # pragma: no cover


def feed_wait(run_id: str, step: int, request: AnyWait) -> FeedWait:
    """What a wait is, for the feed and the pushes (`ratchet.pushes`)."""
    kind = wait_kind(request)
    base = f"/runs/{run_id}"
    if isinstance(request, ApprovalRequest):
        answer = {"approve": f"{base}/approve", "reject": f"{base}/reject"}
    elif isinstance(request, EventWait):
        answer = {"send": f"{base}/events/{request.name}"}
        if request.webhook:
            answer["hook"] = f"{base}/hooks/{request.name}"
    elif isinstance(request, TimerWait):
        answer = {"wake": f"{base}/wake"}
    else:
        answer = {}
    return FeedWait(
        kind=kind,
        step=step,
        prompt=shorten(request.prompt, RESULT_CHARS * 5),
        name=request.name if isinstance(request, EventWait) else None,
        until=wait_due(request),
        children=list(request.children) if isinstance(request, ChildrenWait) else None,
        answer=answer,
    )


ENDED = FINISHED
"""Where a feed ends unless the reader says otherwise: the run is done, failed, stopped or
cancelled."""
PARKED_OR_ENDED = frozenset({*FINISHED, RunStatus.WAITING})
"""Where `ratchet watch` ends: the run ended or waits."""


class FeedStore(Protocol):
    """What a feed reads: a run's head and its records after a version (a `CheckpointStore`)."""

    def load_head(self, run_id: str) -> RunState | None: ...

    def list_checkpoints(self, run_id: str, *, after: int = 0) -> list[StoredCheckpoint]: ...


@dataclass(frozen=True)
class FeedBatch:
    events: list[FeedEvent]
    """The events written since the last read, in order."""
    ended: bool
    """The run stands in a status the reader waits for, and every event up to it has been
    read: nothing more is read."""


class FeedCursor:
    """A run's feed from after `after` (an event's id; 0: from the start), read a batch at a
    time, until the run reaches one of `until`.

    Each read is one range read of the records after the cursor, and, when there is none or
    the last is in a status of `until`, one read of the head. The feed ends only when the
    head is in a status of `until` and a second range read, after the head's, finds nothing
    new: a record written between the first range read and the head read is read too, so the
    feed never ends before the event that ended it, nor at a wait the run has left since.
    Each event is returned once, in order: the cursor moves past every event it returns, and
    only then."""

    def __init__(
        self,
        store: FeedStore,
        run_id: str,
        *,
        after: int = 0,
        until: Collection[RunStatus] = ENDED,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.after = after
        self.until = frozenset(until)
        self.done = False

    def head(self) -> RunState:
        """The run's head; `RunNotFound` if there is no such run."""
        state = self.store.load_head(self.run_id)
        if state is None:
            raise RunNotFound(self.run_id)
        return state

    def read(self) -> FeedBatch:
        if self.done:
            return FeedBatch([], True)
        records = self.store.list_checkpoints(self.run_id, after=self.after)
        # A reservation of a run's budget (`ratchet.engine.spending`) changes nothing a
        # reader follows: no event, as the count of an attempt has none (one read again after
        # the last event is left out again).
        records = [record for record in records if not isinstance(record.event, Reserved)]
        events = [feed_event(record) for record in records]
        if events:
            self.after = events[-1].id
        # A status of `until` in the middle of a batch is one the run has left since (it
        # parked, then was answered): the feed ends only where the run stands now.
        if (not events or events[-1].status in self.until) and self.has_ended():
            self.done = True
        return FeedBatch(events, self.done)

    def has_ended(self) -> bool:
        """Whether the run is in a status of `until` with nothing after the cursor: a reader
        that reconnects after the last event finds nothing more to wait for."""
        if self.head().status not in self.until:
            return False
        return not self.store.list_checkpoints(self.run_id, after=self.after)


def hold_until_written(
    store: FeedStore,
    run_id: str,
    *,
    after: int,
    seconds: float,
    poll: float,
    stopping: threading.Event | None = None,
) -> None:
    """Wait until the run has a record after `after` or `seconds` have passed (or `stopping`
    is set), one range read a poll: the runs API's long poll. It returns at once for a run that
    has ended (nothing more will come), or that is not there or cannot be read (the caller's
    own read then says so)."""
    try:
        head = store.load_head(run_id)
    except RatchetError:
        return
    if head is None or head.is_finished:
        return
    stop = stopping or threading.Event()
    deadline = time.monotonic() + seconds
    # The caller has just read after `after` and found nothing: the first read is a poll on.
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or stop.wait(min(poll, left)):
            return
        try:
            if store.list_checkpoints(run_id, after=after):
                return
        except StoreBusy:
            pass  # read again at the next poll
        except RatchetError:
            return
