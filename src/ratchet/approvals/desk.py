"""The approval desk: opens a request when a run parks, and takes each decision exactly once.

Every channel goes through here: the page behind a signed link, Slack's buttons, the runs
API, and locally the CLI's worker. The desk checks who may decide (the link's recipient, the
verified Slack user, the API caller), settles the approval with one conditional write, and only
then delivers the answer to the run. If delivery fails for now, the approval is reopened; if
the run can no longer take it (the task timed out), it is marked expired. The same code runs
on both runtimes; the ports differ.

A decider that dies between the settling write and the delivery leaves the approval decided
and the run waiting; no one would decide it again (the request says who decided). The sweep
delivers it: on AWS the settled item is marked as owing its execution a wake
(`ratchet.adapters.dynamodb.wakes`), locally a worker records what a request decided longer
ago than a delivery can take on a run that still waits at its step
(`ratchet.runtime.local_approvals.deliver_undelivered`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from ratchet.approvals.answers import checked_for_run, checked_verdict
from ratchet.approvals.links import LinkClaims, LinkSigner
from ratchet.errors import (
    ApprovalClosed,
    ApprovalDecided,
    ApprovalExpired,
    ApprovalNotFound,
    InvalidInput,
    LinkInvalid,
    NotWaiting,
    RatchetError,
    RunNotFound,
    StaleVersion,
)
from ratchet.faults import NO_FAULTS, FaultPlan, FaultPoint
from ratchet.ports import ApprovalBook, CheckpointStore, Notifier, Resumer
from ratchet.state import (
    ApprovalRequest,
    NotifyTargets,
    PersonDecided,
    RunState,
    RunStatus,
    utcnow,
)
from ratchet.waits import (
    PROMPT_KEPT_CHARS,
    Approval,
    ApprovalNotice,
    ApprovalStatus,
    Invitation,
    RecentStep,
    Verdict,
)

RECENT_STEPS_SHOWN = 3
RESULT_PREVIEW_CHARS = 300


@dataclass(frozen=True)
class Opened:
    approval: Approval
    notice: ApprovalNotice
    created: bool
    """False when a pending approval for the step existed: nobody was notified again."""
    failures: tuple[str, ...] = ()
    """Notifiers that could not send (`SlackNotifier: SlackError: channel_not_found`). The
    request is open all the same: other channels, the API and the CLI can still decide it."""


@dataclass(frozen=True)
class ApprovalView:
    """What a page shows, and what a decision is taken on: the approval, the run as it
    stands, and who the link speaks for."""

    approval: Approval
    run: RunState | None
    recipient: str | None = None

    @property
    def run_waits_for_it(self) -> bool:
        run = self.run
        return (
            run is not None
            and run.status is RunStatus.WAITING
            and run.waiting is not None
            and run.step == self.approval.step
        )


@dataclass
class ApprovalDesk:
    book: ApprovalBook
    resumer: Resumer
    store: CheckpointStore
    signer: LinkSigner
    public_url: str
    notifiers: Sequence[Notifier] = ()
    default_targets: NotifyTargets = field(default_factory=NotifyTargets)
    clock: Callable[[], datetime] = utcnow
    faults: FaultPlan = NO_FAULTS

    # --- opening ---------------------------------------------------------------------------

    def open(
        self,
        run_id: str,
        *,
        timeout_seconds: int,
        task_token: str | None = None,
        operator: str | None = None,
    ) -> Opened:
        """Open an approval for the step the run waits at and notify who the run names (or
        the defaults). `operator` is asked too (locally: whoever runs the worker, who gets
        the link printed and in the outbox)."""
        if timeout_seconds < 1:
            raise InvalidInput(
                f"an approval timeout must be at least 1 second, not {timeout_seconds}"
            )
        run = self.store.load_head(run_id)
        if run is None:
            raise RunNotFound(run_id)
        if run.status is not RunStatus.WAITING or run.waiting is None:
            raise ApprovalClosed(f"run {run_id!r} is {run.status.value}, not waiting")
        if not isinstance(run.waiting.request, ApprovalRequest):
            raise ApprovalClosed(f"run {run_id!r} waits for {run.waiting.kind}, not a person")
        now = self.clock()
        # A run started with its own timeout (locally, `--approval-timeout`) keeps to it.
        timeout_seconds = run.options.approval_timeout_seconds or timeout_seconds
        # The request keeps what was asked, the call and its details, for its page once
        # decided: by then the run has moved on and its head no longer says.
        asking = next((m for m in reversed(run.messages) if m.step == run.step), None)
        candidate = Approval(
            prompt=_clip(run.waiting.request.prompt, PROMPT_KEPT_CHARS),
            details=run.waiting.request.details,
            tool=asking.tool if asking else None,
            arguments=asking.arguments if asking else {},
            recent=steps_before(run, run.step),
            approval_id=secrets.token_urlsafe(16),
            run_id=run_id,
            step=run.step,
            created_at=now,
            expires_at=now + timedelta(seconds=timeout_seconds),
        )
        approval = self.book.open(candidate, task_token=task_token)
        created = approval.approval_id == candidate.approval_id
        targets = run.options.notify if not run.options.notify.is_empty else self.default_targets
        recipients = [*targets.email, *([operator] if operator else [])]
        notice = self._notice(run, approval, list(dict.fromkeys(recipients)), targets.slack_channel)
        failures: list[str] = []
        if created:
            for notifier in self.notifiers:
                try:
                    notifier.send(notice)
                except Exception as failed:  # one channel down must not lose the request
                    failures.append(f"{type(notifier).__name__}: {type(failed).__name__}: {failed}")
        return Opened(approval, notice, created, tuple(failures))

    def link(self, approval: Approval, recipient: str) -> str:
        return self._invitation(approval, recipient).url

    def _invitation(self, approval: Approval, recipient: str) -> Invitation:
        claims = LinkClaims(approval.approval_id, approval.run_id, recipient, approval.expires_at)
        return Invitation(recipient=recipient, url=self.signer.url(self.public_url, claims))

    def _notice(
        self, run: RunState, approval: Approval, emails: list[str], slack: str | None
    ) -> ApprovalNotice:
        assert run.waiting is not None
        calls = {m.step: m for m in run.messages}
        recent = [
            RecentStep(
                step=r.step,
                tool=r.tool,
                result=_clip(r.text, RESULT_PREVIEW_CHARS),
            )
            for r in run.tool_results[-RECENT_STEPS_SHOWN:]
            if r.step in calls
        ]
        return ApprovalNotice(
            approval_id=approval.approval_id,
            run_id=run.run_id,
            step=approval.step,
            agent=run.agent,
            goal=run.goal,
            prompt=run.waiting.request.prompt,
            details=run.waiting.request.details,
            recent=recent,
            expires_at=approval.expires_at,
            emails=[self._invitation(approval, to) for to in emails],
            slack_channel=slack,
            answer_schema=run.waiting.request.answer_schema,
            reply=bool(getattr(run.waiting.request, "reply", False)),
            # Slack's buttons carry no answer: the channel gets a link to the page, signed
            # for the channel, so whoever reads it answers in the channel's name.
            slack_invitation=self._invitation(approval, slack)
            if slack and run.waiting.request.answer_schema is not None
            else None,
        )

    # --- looking (GET: never changes anything) ---------------------------------------------

    def view(self, approval_id: str, query: Mapping[str, str]) -> ApprovalView:
        """What the link shows. Raises `LinkInvalid`, `ApprovalExpired` or `ApprovalNotFound`."""
        claims = self.signer.verify(approval_id, query, now=self.clock())
        approval = self._find(claims.run_id, approval_id)
        return ApprovalView(approval, self.store.load_head(approval.run_id), claims.recipient)

    # --- deciding (POST) -------------------------------------------------------------------
    # Each entry point finds out who decides and what they decide (the request and the run,
    # read once), then takes the one path, `Decider.decide`.

    def decide_by_link(
        self,
        asked: ApprovalView,
        *,
        approved: bool,
        comment: str,
        answer: dict[str, Any] | None = None,
    ) -> ApprovalView:
        """The person the link was signed for decides `asked`, what `view` showed them (with
        `answer`, for a request that asks for one): the link was checked there, and the
        request and the run read, once for the click."""
        if asked.recipient is None:
            raise LinkInvalid("only what a link showed is decided in its recipient's name")
        verdict = Verdict(approved=approved, by=asked.recipient, comment=comment, answer=answer)
        return self._decider.decide(asked, verdict, channel="link")

    def decide_by_id(
        self, run_id: str, approval_id: str, verdict: Verdict, *, channel: str
    ) -> ApprovalView:
        """A verified caller decides a known approval (a Slack button names its id)."""
        asked = ApprovalView(self._find(run_id, approval_id), self.store.load_head(run_id))
        return self._decider.decide(asked, verdict, channel=channel)

    def decide_run(self, run_id: str, verdict: Verdict, *, channel: str) -> ApprovalView:
        """A verified caller decides whatever the run waits for (the runs API, the CLI)."""
        return self._decider.decide_run(run_id, verdict, channel=channel)

    @property
    def _decider(self) -> Decider:
        return Decider(self.book, self.resumer, self.store, self.clock, self.faults)

    def _find(self, run_id: str, approval_id: str) -> Approval:
        approval = self.book.get(run_id, approval_id)
        if approval is None:
            raise ApprovalNotFound("no such approval request (it may have been cleaned up)")
        return approval


class RecordsDecisions(Protocol):
    """What records a decision on a waiting run without an approval request: the engine."""

    def decide_waiting(
        self, run: str | RunState, decision: PersonDecided, *, step: int | None = None
    ) -> object: ...


@dataclass(frozen=True)
class Decider:
    """Takes one decision on one approval, exactly once: what the desk does once it knows who
    decides. The Python client and the CLI use it directly: they need no links."""

    book: ApprovalBook
    resumer: Resumer
    store: CheckpointStore
    clock: Callable[[], datetime] = utcnow
    faults: FaultPlan = NO_FAULTS

    def decide_run(self, run_id: str, verdict: Verdict, *, channel: str) -> ApprovalView:
        """Decide whatever the run waits for (the runs API, the CLI, the Python client):
        `ApprovalDecided` (naming who decided, and when) if the step's request was decided
        already, `ApprovalNotFound` if the run waits with no request at all (its worker died
        before opening one), `ApprovalClosed` if it does not wait."""
        return self.decide(self._asked(self._head(run_id)), verdict, channel=channel)

    def decide_or_record(
        self, run_id: str, verdict: Verdict, *, channel: str, engine: RecordsDecisions
    ) -> None:
        """Decide through the run's open request, so its links and page show the decision; a
        run that waits with no request at all (its worker died before opening one) has the
        verdict, checked the same way, recorded directly by `engine` (at the step it was
        checked against). A request decided already is never overruled: `ApprovalDecided`."""
        head = self._head(run_id)
        try:
            self.decide(self._asked(head), verdict, channel=channel)
            return
        except ApprovalNotFound:
            pass
        checked, step = checked_for_run(head, verdict)
        # The step had no request when `_asked` looked; a worker may be opening one now, and
        # someone may decide through it before this write lands. The write is conditional on
        # the version read (and on the run still waiting at `step`), so of the two only one
        # is recorded: the loser here is told who won; the loser there finds its request
        # closed below (locally its resume finds the run not waiting) and is refused.
        try:
            engine.decide_waiting(head, checked, step=step)
        except (NotWaiting, StaleVersion):
            raise self._lost_to(run_id, step, head.version) from None
        if step is not None:
            # A request opened meanwhile must not take a second answer (on AWS its parked
            # task's token goes with it).
            self.book.close(run_id, step, ApprovalStatus.CLOSED, at=self.clock())

    def _lost_to(self, run_id: str, step: int | None, since: int) -> RatchetError:
        """What a direct record that lost its race says: who decided the step first."""
        run = self.store.load_head(run_id)
        if run is None:
            return RunNotFound(run_id)
        at = run.step if step is None else step
        asked = [a for a in self.book.of_run(run_id) if a.step == at]
        decided = _decided_at_step(run, asked)
        if decided is not None:
            return ApprovalDecided(decided_text(decided))
        for checkpoint in reversed(self.store.list_checkpoints(run_id, after=since)):
            event = checkpoint.event
            if isinstance(event, PersonDecided) and checkpoint.step == at:
                verb = "approved" if event.approved else "rejected"
                when = checkpoint.created_at.strftime("%Y-%m-%d %H:%M UTC")
                return ApprovalDecided(f"{verb} by {event.by} at {when}")
        return ApprovalClosed(f"run {run_id!r} is {run.status.value}, not waiting")

    def decide(self, asked: ApprovalView, verdict: Verdict, *, channel: str) -> ApprovalView:
        """The one path of a decision on a request: `asked` is the request and the run as the
        caller read them (each once), `verdict` who decides and what. Refused unless the
        request is pending and unexpired and the run waits at its step; the answer is checked
        against the request; one conditional write settles it; then the run gets it, from the
        head read (read again only if it moved meanwhile)."""
        approval, run = asked.approval, asked.run
        now = self.clock()
        if approval.status.is_decided:
            raise ApprovalDecided(decided_text(approval))
        if approval.is_expired(now):
            raise ApprovalExpired("this request has expired; the run went on without a decision")
        if run is None or run.status is not RunStatus.WAITING or run.step != approval.step:
            status = run.status.value if run else "gone"
            raise ApprovalClosed(f"run {approval.run_id!r} is {status}, no longer waiting")
        if run.waiting is not None:
            verdict = checked_verdict(run.waiting.request, verdict)
        # One conditional write decides: a second click, a replayed POST or another channel
        # finds the approval no longer pending and changes nothing.
        try:
            settled = self.book.settle(approval, verdict, channel=channel, at=now)
        except ApprovalDecided:
            # Another channel won the write a moment ago: say who, and when.
            current = self.book.get(approval.run_id, approval.approval_id)
            if current is None or not current.status.is_decided:
                raise
            raise ApprovalDecided(decided_text(current)) from None
        self.faults.hit(FaultPoint.AFTER_WAIT_SETTLED, approval.step)
        try:
            resumed = self.resumer.resume(settled, verdict, run)
        except (ApprovalClosed, ApprovalExpired) as over:
            recorded = self._recorded(settled, since=run.version)
            if recorded is not None:
                # This decider was slow (frozen, or its writes waited for the store), and a
                # worker recorded the decision it left for dead: delivered all the same.
                return ApprovalView(settled, recorded, asked.recipient)
            # For good: the run stopped waiting, or its parked task timed out or was closed.
            # The request is over, and the page says so.
            self.book.reopen(settled)
            status = (
                ApprovalStatus.EXPIRED
                if isinstance(over, ApprovalExpired)
                else ApprovalStatus.CLOSED
            )
            self.book.close(approval.run_id, approval.step, status, at=now)
            raise
        except Exception:
            # Not delivered, and not for good (a throttle, a lost connection): undo, so the
            # person can try again.
            self.book.reopen(settled)
            raise
        return ApprovalView(settled, resumed, asked.recipient)

    def _head(self, run_id: str) -> RunState:
        run = self.store.load_head(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

    def _recorded(self, settled: Approval, *, since: int) -> RunState | None:
        """The run's head if it recorded `settled`'s decision at its step after version
        `since`, by whomever; None if it did not."""
        verdict = settled.verdict()
        for checkpoint in self.store.list_checkpoints(settled.run_id, after=since):
            event = checkpoint.event
            if (
                verdict is not None
                and checkpoint.step == settled.step
                and isinstance(event, PersonDecided)
                and (event.approved, event.by) == (verdict.approved, verdict.by)
            ):
                return self.store.load_head(settled.run_id)
        return None

    def _asked(self, run: RunState) -> ApprovalView:
        """The pending request of the step the run is at, with the run: what a caller that
        names only the run decides."""
        asked = [a for a in self.book.of_run(run.run_id) if a.step == run.step]
        pending = [a for a in asked if a.status is ApprovalStatus.PENDING]
        if pending:
            return ApprovalView(pending[-1], run)
        decided = _decided_at_step(run, asked)
        if decided is not None:
            # Decided and not yet recorded: on AWS between the click (the request settled,
            # the task answered) and `RecordDecision`; locally between the settle and the
            # engine's write. The run still waits, but its answer is given: that person's.
            raise ApprovalDecided(decided_text(decided))
        if run.status is not RunStatus.WAITING:
            raise ApprovalClosed(f"run {run.run_id!r} is {run.status.value}, not waiting")
        raise ApprovalNotFound(f"run {run.run_id!r} waits with no approval request")


def _decided_at_step(run: RunState, asked: Sequence[Approval]) -> Approval | None:
    """The decided request of the step the run is at, if it is what answered the run: any
    decided one while the run still waits (its answer is on the way), a person's decision
    while the run works on from it; nothing once the run ended (cancelled, failed, ...),
    which is what a caller is then told."""
    if run.status is RunStatus.WAITING:
        decided = [a for a in asked if a.status.is_decided]
    elif run.status is RunStatus.RUNNING:
        decided = [a for a in asked if a.status in _BY_A_PERSON]
    else:
        return None
    return max(decided, key=lambda a: a.decided_at or a.created_at, default=None)


_BY_A_PERSON = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)


def decided_text(approval: Approval) -> str:
    """`approved by dana at 2026-12-01 10:42 UTC`, `expired before anyone decided`, ..."""
    if approval.status is ApprovalStatus.EXPIRED:
        return "expired before anyone decided"
    if approval.status is ApprovalStatus.CLOSED:
        return "closed: the run was decided another way or stopped waiting"
    when = approval.decided_at.strftime(" at %Y-%m-%d %H:%M UTC") if approval.decided_at else ""
    return f"{approval.status.value} by {approval.decided_by}{when}"


def steps_before(run: RunState, step: int) -> list[RecentStep]:
    """The last `RECENT_STEPS_SHOWN` steps the run's window holds before `step`, their results
    cut: what a request's page shows of what led to it. The asking step's own result only
    repeats the question; steps after it are not what the person was asked about."""
    done = [r for r in run.tool_results if r.step < step][-RECENT_STEPS_SHOWN:]
    return [
        RecentStep(step=r.step, tool=r.tool, result=_clip(r.text, RESULT_PREVIEW_CHARS))
        for r in done
    ]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
