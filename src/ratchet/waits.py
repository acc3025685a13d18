"""Approvals: a person's decision on a waiting run, how it is recorded, and what is sent.

An approval is opened when a run parks at a step; each link, Slack button or API call that
decides it goes through one conditional transition, `pending` -> `approved` | `rejected`, so
a decision happens exactly once however many channels (and mail scanners) reach it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ratchet.state import PersonDecided
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
    answer: dict[str, Any] | None = None
    """The answer given with the approval, for a request that asked for one."""

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


EXPIRED_BY = "nobody"
"""Who decided a request nobody answered in time, on either runtime."""


def expired_verdict(timeout_seconds: int) -> Verdict:
    """What a run records when its request expired unanswered: a rejection by nobody, so the
    agent goes on knowing that no one said yes."""
    return Verdict(
        approved=False, by=EXPIRED_BY, comment=f"approval expired after {timeout_seconds} s"
    )


class RecentStep(BaseModel):
    model_config = ConfigDict(frozen=True)

    step: int
    tool: str
    result: str


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

    @property
    def subject(self) -> str:
        return f"Approval needed: {self.prompt}"[:200]
