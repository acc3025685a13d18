"""The event desk: takes each event sent to a run once, keeps it in the run's mailbox, and
settles the run's wait with it, once; settles the waits that come due (timers, timeouts), and
wakes a sleeping run early.

Every sender goes through here: `ratchet send`, `Client.send_event`, the runs API, a signed
webhook delivery. An event is posted to the mailbox first (once per event id: a sender's
retry finds it there and gets the same answer), then delivered: if the run waits for an event
of its name, the engine records it as the waiting step's result in one commit that also takes
it from the mailbox, conditional on the head's version. So an event is delivered at most once
whoever races (a second sender, the timeout, a worker sweeping), and one that arrives before
the run waits, or whose sender died before delivering it, stays in the mailbox until a wait
for its name takes it (the next step that waits for it, or a worker's sweep).

Locally the run is then runnable and the next free worker picks it up; on AWS the parked
execution is woken (`Nudge`: its task token answered), or its wait task, opening after the
event, finds the run settled and goes straight on. The settling and the waking are two
writes to two systems: the desk marks the wake as owed before it settles (`Nudge.owe`), so
that one who dies in between leaves the mark for the sweep (`ratchet.waiting.wakes`), and a
sender's retry of a delivered event answers the execution again if it is still parked.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from ratchet.errors import (
    EventNotAwaited,
    InvalidInput,
    NotSleeping,
    NotWaiting,
    PayloadTooLarge,
    RatchetError,
    RunEnded,
    RunNotFound,
    StaleVersion,
)
from ratchet.faults import NO_FAULTS, FaultPlan, FaultPoint
from ratchet.ports import BlobStore, CheckpointStore, Consumption, Mailbox, WaitBook, WakeHow
from ratchet.state import (
    EVENT_NAME_PATTERN,
    INLINE_BYTES,
    MAX_EVENT_BYTES,
    EventWait,
    PersonDecided,
    RunState,
    RunStatus,
    TimerWait,
    WaitSettled,
    utcnow,
)
from ratchet.untrusted import check_depth
from ratchet.waits import (
    EVENT_ID_PATTERN,
    SentEvent,
    event_arrived,
    event_timed_out,
    timer_due,
    timer_woken,
)


class EventInvalid(InvalidInput):
    """A payload the wait's schema refuses; the message names the field, and `field` is it
    (`data.conclusion`; `data` for the payload as a whole), for an API to name apart from
    words that quote what was sent."""

    http_status = 422

    def __init__(self, message: str, *, field: str = "data") -> None:
        super().__init__(message)
        self.field = field


class Settles(Protocol):
    """What settles a waiting run's wait in one conditional commit: the engine."""

    def decide_waiting(
        self,
        run: str | RunState,
        decision: PersonDecided | WaitSettled,
        *,
        step: int | None = None,
        consumes: Consumption | None = None,
    ) -> RunState: ...


class Nudge(Protocol):
    """What wakes the execution parked on a run's wait once a desk settled it: on AWS its
    task token answered, or a sleeper restarted (`StepFunctionsNudge`). Locally nothing is
    parked (the run is runnable, a worker picks it up) and the desks have none."""

    def owe(self, run_id: str, step: int, how: WakeHow) -> None:
        """Just before the wait at `step` is settled: mark the wake as owed, so that if the
        waker dies before `__call__` answers, the sweep finds the execution still to wake."""
        ...

    def __call__(self, head: RunState, settled: WaitSettled) -> None:
        """The wait is settled (`head` is the run's new head): wake its execution, and pay
        the wake owed."""
        ...

    def resume(self, run_id: str, step: int) -> bool:
        """Answer an execution still parked on the run's wait at `step`, which a waker
        settled (a later actor finding it settled, or the sweep): True if one was parked."""
        ...


SentStatus = Literal["delivered", "queued", "refused"]


@dataclass(frozen=True)
class Sent:
    """What a sender is told: the same for a retry of the same event id."""

    event: SentEvent
    duplicate: bool

    @property
    def status(self) -> SentStatus:
        if self.event.consumed_step is not None:
            return "delivered"
        return "refused" if self.event.refused is not None else "queued"

    def answer(self) -> dict[str, Any]:
        """The JSON every channel answers with."""
        event = self.event
        return {
            "run_id": event.run_id,
            "name": event.name,
            "event_id": event.event_id,
            "status": self.status,
            "step": event.consumed_step,
            "duplicate": self.duplicate,
            "refused": event.refused,
        }


@dataclass
class EventDesk:
    store: CheckpointStore
    mailbox: Mailbox
    blobs: BlobStore
    engine: Settles
    events_of: Callable[[str], Sequence[str] | None] = lambda _agent: None
    """The event names an agent declares (`Agent.events`), or None: any name is kept."""
    nudge: Nudge | None = None
    clock: Callable[[], datetime] = utcnow
    faults: FaultPlan = NO_FAULTS

    # --- sending ---------------------------------------------------------------------------

    def send(
        self,
        run_id: str,
        name: str,
        data: Any = None,
        *,
        event_id: str | None = None,
        source: str = "api",
    ) -> Sent:
        """Take one event for the run: kept once per `event_id` (a new id when None), then
        delivered if the run waits for it. Raises `InvalidInput` (a bad name or id, a payload
        that is not JSON), `PayloadTooLarge`, `RunNotFound`, `RunEnded`, `EventNotAwaited`,
        `EventInvalid` (the waiting step's schema refuses it) or `MailboxFull`; each with
        nothing written."""
        check_event_name(name)
        event_id = check_event_id(event_id) if event_id is not None else new_event_id()
        text = payload_json(data)
        run = self._head(run_id)
        known = self.mailbox.get(run_id, event_id)
        if known is not None:
            # A sender's retry: the same answer, and a second chance to deliver it if the
            # first sender stopped short of that, or to wake the run if it stopped short of
            # waking it (it settled the wait, then died).
            self.deliver(run_id)
            event = self.mailbox.get(run_id, event_id) or known
            if event.consumed_step is not None:
                self._rewake(run_id, event.consumed_step)
            return Sent(event, duplicate=True)
        if run.is_finished:
            raise RunEnded(
                f"run {run_id!r} is {run.status.value}: it takes no more events "
                f"({name!r} was not kept)"
            )
        declared = self.events_of(run.agent)
        if declared is not None and name not in declared:
            listed = ", ".join(repr(n) for n in declared) or "none"
            raise EventNotAwaited(
                f"agent {run.agent!r} waits for no event named {name!r} (it waits for: {listed})"
            )
        wait = _event_wait(run)
        if wait is not None and wait.name == name and wait.answer_schema is not None:
            check_payload(wait.answer_schema, data, name=name)
        size = len(text.encode("utf-8"))
        blob = self.blobs.put(text.encode("utf-8")) if size > INLINE_BYTES else None
        event = SentEvent(
            run_id=run_id,
            event_id=event_id,
            name=name,
            received_at=self.clock(),
            payload=data if blob is None else None,
            blob=blob,
            size=size,
            source=source,
        )
        # The names this run needs keep a room of their own in its mailbox, so that a flood
        # of other names (any name is kept for an agent that declares none) cannot fill it
        # and turn away the event the run waits for.
        reserved = {*(declared or ()), *([wait.name] if wait is not None else [])}
        stored, created = self.mailbox.post(event, reserved=reserved)
        self.faults.hit(FaultPoint.AFTER_EVENT_ACCEPTED, run.step)
        self.deliver(run_id)
        return Sent(self.mailbox.get(run_id, event_id) or stored, duplicate=not created)

    def deliver(self, run_id: str) -> RunState | None:
        """Settle the run's event wait with the first pending event of its name, if there is
        one: the new head, or None when nothing was settled here (no such wait or event, or
        another writer settled it first)."""
        for _ in range(3):
            run = self.store.load_head(run_id)
            wait = _event_wait(run) if run is not None else None
            if run is None or wait is None:
                return None
            event = self.mailbox.next_for(run_id, wait.name)
            if event is None:
                return None
            if event.source == "webhook" and not wait.webhook:
                # A delivery to the run's hook, kept before this wait opened: this wait takes
                # its event from signed senders of the runs API only, so not this one.
                self.mailbox.refuse(
                    run_id, event.event_id, "the wait takes no webhook deliveries (webhook=False)"
                )
                continue
            if wait.answer_schema is not None:
                try:
                    check_payload(wait.answer_schema, self._payload(event), name=wait.name)
                except EventInvalid as refused:
                    # Sent before the run waited, it never met the schema: it stays in the
                    # mailbox, marked with why, and the wait goes on.
                    self.mailbox.refuse(run_id, event.event_id, str(refused))
                    continue
            settled = event_arrived(wait, run.step, event)
            self._owe(run_id, run.step, "event")
            try:
                head = self.engine.decide_waiting(
                    run,
                    settled,
                    step=run.step,
                    consumes=Consumption(event_id=event.event_id, step=run.step),
                )
            except (NotWaiting, StaleVersion):
                # Another writer moved the run first (a timeout, another sender, a cancel):
                # read it again; what it waits for now decides.
                continue
            self.faults.hit(FaultPoint.AFTER_WAIT_SETTLED, run.step)
            self._nudge(head, settled)
            return head
        return None

    # --- waits that settle by themselves, and waking ---------------------------------------

    def settle_due(self, book: WaitBook, now: datetime) -> list[str]:
        """Locally, for a worker: settle every wait due by `now` (a timer's time, an event
        wait's timeout) and every event wait whose event is in its mailbox. Returns the runs
        that go on."""
        resumed: list[str] = []
        for open_wait in book.answered():
            if self.deliver(open_wait.run_id) is not None:
                resumed.append(open_wait.run_id)
        for open_wait in book.due(now):
            run = self.store.load_head(open_wait.run_id)
            if run is None or run.status is not RunStatus.WAITING or run.waiting is None:
                continue
            request = run.waiting.request
            if isinstance(request, TimerWait):
                settled = timer_due(request, run.step, now)
            elif isinstance(request, EventWait):
                settled = event_timed_out(request, run.step)
            else:
                continue
            try:
                head = self.engine.decide_waiting(run, settled, step=open_wait.step)
            except (NotWaiting, StaleVersion):
                continue  # settled another way meanwhile: that one counts
            self._nudge(head, settled)
            resumed.append(open_wait.run_id)
        return resumed

    def wake(self, run_id: str, *, by: str) -> RunState:
        """Wake a sleeping run now: its step's result says who woke it. `NotSleeping` if it
        does not sleep (it waits for a person or an event, or not at all)."""
        run = self._head(run_id)
        waiting = run.waiting
        if run.status is not RunStatus.WAITING or waiting is None:
            raise NotSleeping(f"run {run_id!r} is {run.status.value}, not sleeping")
        if not isinstance(waiting.request, TimerWait):
            what = "an event" if isinstance(waiting.request, EventWait) else "a person"
            raise NotSleeping(f"run {run_id!r} waits for {what}, not a time: it cannot be woken")
        settled = timer_woken(waiting.request, run.step, self.clock(), by=by)
        self._owe(run_id, run.step, "woken")
        try:
            head = self.engine.decide_waiting(run, settled, step=run.step)
        except (NotWaiting, StaleVersion):
            raise NotSleeping(f"run {run_id!r} stopped sleeping meanwhile") from None
        self.faults.hit(FaultPoint.AFTER_WAIT_SETTLED, run.step)
        self._nudge(head, settled)
        return head

    def _owe(self, run_id: str, step: int, how: WakeHow) -> None:
        # Before the settling write: a waker that dies after it leaves the mark behind. A
        # mark whose settling then fails (another writer moved the run first) is the sweep's
        # to clear; it finds nothing to wake.
        if self.nudge is not None:
            self.nudge.owe(run_id, step, how)

    def _nudge(self, head: RunState, settled: WaitSettled) -> None:
        if self.nudge is None:
            return
        # Settled and durable whatever happens here: the wake stays owed (marked), and a
        # sender's retry or the sweep answers the parked execution.
        with suppress(RatchetError):
            self.nudge(head, settled)

    def _rewake(self, run_id: str, step: int) -> None:
        if self.nudge is None:
            return
        with suppress(RatchetError):  # the sweep tries again
            self.nudge.resume(run_id, step)

    def _head(self, run_id: str) -> RunState:
        run = self.store.load_head(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

    def _payload(self, event: SentEvent) -> Any:
        if event.blob is None:
            return event.payload
        return json.loads(self.blobs.get(event.blob))


def _event_wait(run: RunState) -> EventWait | None:
    if run.status is not RunStatus.WAITING or run.waiting is None:
        return None
    request = run.waiting.request
    return request if isinstance(request, EventWait) else None


def check_event_name(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(EVENT_NAME_PATTERN, name):
        raise InvalidInput(
            f"name: an event name is 1-64 letters, digits and . _ : - (starting with a letter "
            f"or digit), not {name!r}"
        )
    return name


def check_event_id(event_id: str) -> str:
    if not isinstance(event_id, str) or not re.fullmatch(EVENT_ID_PATTERN, event_id):
        raise InvalidInput(
            "event_id: an event id is 1-128 letters, digits and . _ : @ / + = - (starting "
            f"with a letter or digit), not {event_id!r}"
        )
    return event_id


def new_event_id() -> str:
    return "ev-" + secrets.token_hex(12)


def payload_json(data: Any) -> str:
    """The payload as its UTF-8 JSON, checked: JSON, nested at most 64 deep, at most
    `MAX_EVENT_BYTES`."""
    check_depth(data, field="data")
    try:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidInput(f"data: the payload is not JSON ({error})") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("data: the payload is not valid Unicode text") from None
    if size > MAX_EVENT_BYTES:
        raise PayloadTooLarge(
            f"data: the payload is {size:,} bytes, over the {MAX_EVENT_BYTES:,}-byte limit"
        )
    return text


def check_payload(schema: dict[str, Any], data: Any, *, name: str) -> None:
    """`EventInvalid`, naming the field, if `schema` refuses `data`."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is None:
        return
    field = ".".join(["data", *(str(p) for p in error.absolute_path)])
    raise EventInvalid(f"{field}: {error.message} (the {name!r} wait's schema)"[:500], field=field)
