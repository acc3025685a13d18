"""Waits: a person's decision on a waiting run, how it is recorded, and what is sent; and
the events sent to a run, as its mailbox keeps them.

An approval is opened when a run parks at a step; each link, Slack button or API call that
decides it goes through one conditional transition, `pending` -> `approved` | `rejected`, so
a decision happens exactly once however many channels (and mail scanners) reach it.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ratchet.errors import MailboxFull
from ratchet.state import (
    EVENT_NAME_PATTERN,
    EXPIRED_BY,
    BlobRef,
    EventWait,
    PersonDecided,
    TimerWait,
    WaitSettled,
    duration_words,
)
from ratchet.untrusted import within_depth

MAX_BY_CHARS = 320
MAX_COMMENT_CHARS = 10_000
PROMPT_KEPT_CHARS = 500
DEFAULT_APPROVAL_SECONDS = 7 * 24 * 3600
"""How long a request stays open when the deployment says nothing else."""


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    """Nobody decided in time (or the parked task timed out first)."""
    CLOSED = "closed"
    """Decided some other way (the CLI, a hand-sent task answer) or superseded."""

    @property
    def is_decided(self) -> bool:
        return self is not ApprovalStatus.PENDING


class RecentStep(BaseModel):
    """A step done before a request, as its message and its page show it (the result cut)."""

    model_config = ConfigDict(frozen=True)

    step: int
    tool: str
    result: str


class Approval(BaseModel):
    """One request for a person's decision on one waiting step of a run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    approval_id: str = Field(pattern=r"^[A-Za-z0-9_-]{16,64}$")
    run_id: str
    step: int = Field(ge=0)
    status: ApprovalStatus = ApprovalStatus.PENDING
    created_at: datetime
    expires_at: datetime
    decided_by: str | None = None
    comment: str = ""
    decided_at: datetime | None = None
    channel: str | None = None
    """How it was decided: `link`, `slack`, `api` or `cli`."""
    prompt: str = Field(default="", max_length=PROMPT_KEPT_CHARS)
    """What the agent asked (its start), so a decided request still says what it was."""
    details: dict[str, Any] = Field(default_factory=dict)
    """The request's details (`ask_person(..., details=...)`: what and why), as asked. Bounded
    by the request's own limit (`MAX_APPROVAL_REQUEST_BYTES`)."""
    tool: str | None = None
    """The tool whose call asked (the step's decision); None for a request an older Ratchet
    opened, or one with no call behind it."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """That call's arguments, as its step record keeps them (a preview of large ones)."""
    answer: dict[str, Any] | None = None
    """The answer given with the approval, for a request that asked for one."""
    recent: list[RecentStep] = Field(default_factory=list)
    """The steps before the asking one that the request's page shows, as they were when it was
    opened: what the person saw when deciding. Once decided, the run has moved on and its
    window no longer holds them all. Empty for a request an older Ratchet opened."""

    def is_expired(self, now: datetime) -> bool:
        return now >= self.expires_at

    def settled(self, verdict: Verdict, *, channel: str, at: datetime) -> Approval:
        """This request, decided by `verdict` through `channel`."""
        return self.model_copy(
            update={
                "status": ApprovalStatus.APPROVED if verdict.approved else ApprovalStatus.REJECTED,
                "decided_by": verdict.by,
                "comment": verdict.comment,
                "answer": verdict.answer,
                "decided_at": at,
                "channel": channel,
            }
        )

    def verdict(self) -> Verdict | None:
        """The decision a person took on this request, as it was delivered; None unless it
        was approved or rejected (pending, expired or closed)."""
        if self.status not in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
            return None
        return Verdict(
            approved=self.status is ApprovalStatus.APPROVED,
            by=self.decided_by or "(not named)",
            comment=self.comment,
            answer=self.answer,
        )

    def reopened(self) -> Approval:
        """This request, pending again (its decision could not be delivered)."""
        return self.model_copy(
            update={
                "status": ApprovalStatus.PENDING,
                "decided_by": None,
                "comment": "",
                "answer": None,
                "decided_at": None,
                "channel": None,
            }
        )


class Verdict(PersonDecided):
    """A person's decision as it comes in from outside (a link, Slack, the runs API, the CLI,
    the Python client, a parked task's answer): the `PersonDecided` the run records, bounded
    where it crosses the boundary. Every channel builds one; everything after it (the desk,
    the approval book, the resumer, the engine) takes it whole.

    The bounds are on this type, not on the stored event: stores written before there were
    bounds (`ratchet approve --by` took a name of any length) must still read."""

    by: str = Field(min_length=1, max_length=MAX_BY_CHARS)
    comment: str = Field(default="", max_length=MAX_COMMENT_CHARS)
    answer: Annotated[dict[str, Any] | None, BeforeValidator(within_depth)] = None
    """For a request that asks for a structured answer (`ApprovalRequest.answer_schema`),
    the answer itself."""


def expired_verdict(timeout_seconds: int) -> Verdict:
    """What a run records when its request expired unanswered: a rejection by nobody, so the
    agent goes on knowing that no one said yes."""
    return Verdict(
        approved=False, by=EXPIRED_BY, comment=f"approval expired after {timeout_seconds} s"
    )


class Invitation(BaseModel):
    """One recipient's own signed link: the link names them, so it decides in their name."""

    model_config = ConfigDict(frozen=True)

    recipient: str
    url: str


class ApprovalNotice(BaseModel):
    """Everything a message asking for a decision says, whatever carries it."""

    model_config = ConfigDict(frozen=True)

    approval_id: str
    run_id: str
    step: int
    agent: str
    goal: str
    prompt: str
    details: dict[str, Any] = Field(default_factory=dict)
    answer_schema: dict[str, Any] | None = None
    """Set when the request asks for a structured answer: it is given on the page."""
    recent: list[RecentStep] = Field(default_factory=list)
    expires_at: datetime
    emails: list[Invitation] = Field(default_factory=list)
    slack_channel: str | None = None
    slack_invitation: Invitation | None = None
    """For a Slack channel asked a structured question: a link to the page, signed for the
    channel (Slack's buttons cannot carry an answer; a modal would, and is not built)."""

    reply: bool = False
    """Set for `wait_for_reply`: the person is asked to reply, not to approve."""

    @property
    def subject(self) -> str:
        return f"{'Reply' if self.reply else 'Approval'} needed: {self.prompt}"[:200]


# --- events sent to a run -------------------------------------------------------------------

EVENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}$"
"""An event id: what a sender retries with (GitHub's delivery id, a Stripe event id, ...)."""
MAX_MAILBOX_EVENTS = 100
"""Events a run's mailbox keeps unconsumed of one name the run needs (a name its agent
declares, or the one it waits for), and of all other names together; one more is refused
(`MailboxFull`). Other names share one room, so a flood of them (any name is kept for an agent
that declares none) never takes the room of a name the run needs, and the mailbox stays
bounded however many names are made up."""


def mailbox_full(run_id: str, name: str, pending: int, *, reserved: Collection[str]) -> MailboxFull:
    """The refusal of one more event named `name`, `pending` being the unread events of its
    room (its name if `reserved` holds it, else every name `reserved` does not)."""
    if name in reserved:
        return MailboxFull(
            f"run {run_id!r} has {pending} unread {name!r} events, the most its mailbox keeps "
            "of one name; nothing was added"
        )
    return MailboxFull(
        f"run {run_id!r} has {pending} unread events of names it neither declares nor waits "
        "for, the most its mailbox keeps of them; nothing was added"
    )


class SentEvent(BaseModel):
    """One event sent to a run, as its mailbox keeps it: accepted once per `event_id`, kept in
    order of arrival, and consumed by the first wait for its `name` (at most once: the
    consuming step's commit marks it, in the same write)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    event_id: str = Field(pattern=EVENT_ID_PATTERN)
    name: str = Field(pattern=EVENT_NAME_PATTERN)
    received_at: datetime
    payload: Any = None
    """The payload (JSON) when it is at most `INLINE_BYTES`; a larger one is `blob`."""
    blob: BlobRef | None = None
    size: int = Field(default=0, ge=0)
    """The payload's size as UTF-8 JSON."""
    source: str = "api"
    """How it came: `cli`, `client`, `api`, `webhook`, `reply`."""
    consumed_step: int | None = None
    """The step whose wait it settled; None while it waits in the mailbox."""
    refused: str | None = None
    """Why the wait it reached could not take it (its payload did not match the wait's
    schema): it stays in the mailbox, never consumed, so a sender can see why."""

    @property
    def is_pending(self) -> bool:
        return self.consumed_step is None and self.refused is None


# --- what a settled wait tells the run ------------------------------------------------------
# Both runtimes settle waits through these, so a step's result reads the same locally and on
# AWS, whoever settled it.

PAYLOAD_PREVIEW_CHARS = 400


def event_arrived(wait: EventWait, step: int, event: SentEvent) -> WaitSettled:
    """The wait at `step` settled by `event`: its payload is the step's result."""
    if event.blob is not None:
        shown = f"[{event.size:,} bytes in blob {event.blob.sha256[:12]}]"
    else:
        shown = json.dumps(event.payload, ensure_ascii=False)
        if len(shown) > PAYLOAD_PREVIEW_CHARS:
            shown = shown[: PAYLOAD_PREVIEW_CHARS - 1] + "…"
    return WaitSettled(
        step=step,
        how="event",
        name=wait.name,
        event_id=event.event_id,
        text=f"Event {wait.name!r}: {shown}",
        payload=event.payload if event.blob is None else None,
        blob=event.blob,
    )


def event_timed_out(wait: EventWait, step: int) -> WaitSettled:
    within = duration_words(wait.timeout_seconds) if wait.timeout_seconds else "its timeout"
    return WaitSettled(
        step=step, how="timeout", name=wait.name, text=f"No {wait.name!r} event within {within}."
    )


def timer_due(wait: TimerWait, step: int, at: datetime) -> WaitSettled:
    planned = wait.until or at
    return WaitSettled(step=step, how="due", text=f"Slept until {planned:%Y-%m-%d %H:%M:%S} UTC.")


def timer_woken(wait: TimerWait, step: int, at: datetime, *, by: str) -> WaitSettled:
    planned = f" (it was to sleep until {wait.until:%Y-%m-%d %H:%M:%S} UTC)" if wait.until else ""
    # A wake after the time came, before any worker settled it, is no early wake.
    late = wait.until is not None and at >= wait.until
    woken = f"Woken by {by}, after its time had come," if late else f"Woken early by {by}"
    return WaitSettled(
        step=step,
        how="woken",
        by=by,
        text=f"{woken} at {at:%Y-%m-%d %H:%M:%S} UTC{planned}.",
    )
