"""The run state: one serializable object per run, and the events that move it forward.

This module is the ground floor: it imports nothing from Ratchet. Everything a worker needs to
resume a run is in `RunState`; everything a checkpoint records is a `CheckpointEvent`. The head
of a run is always the fold of its checkpoint events (see `ratchet.engine.fold`), which
is what lets `ratchet show --step N` rebuild the state as of any earlier checkpoint.

What a step writes must not grow with the run's length, so the state keeps a bounded view: the
last `memory_window` steps in full (the window), a per-tool digest of the older ones, a running
summary and the facts the agent pinned. The full history is in the immutable checkpoint records,
and the stores write no more of the head than changes (see `ratchet.stored`): the window is read
back from the step records, the static part (goal, options) is written once.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationInfo,
    model_validator,
)

SCHEMA_VERSION = 4
"""Bump it with a migration in `ratchet.migrations` whenever a stored field changes meaning.
2: tool calls, messages and their records may carry a `blob` (arguments kept by reference).
3: the stored head leaves out the window (read back from step records) and the static part
(kept apart, written once); runs keep pinned facts and a running summary.
4: a run may end `stopped` (the step cap) or `cancelled`, and a failed run may be retried."""

RECENT_STEPS = 5
"""How many completed steps the state (and so the model) sees in full, unless the agent says
(`Agent.memory_window`)."""
MAX_MEMORY_WINDOW = 50
MAX_PINNED_FACTS = 20
MAX_FACT_CHARS = 300
"""The `remember` tool keeps at most this many facts of at most this many characters."""
MAX_SUMMARY_CHARS = 4000
"""A model-written running summary is cut to this length."""

MAX_ATTEMPTS = 3
"""The third failed attempt at a step marks the run failed."""

DEFAULT_MAX_STEPS = 60
MAX_GOAL_BYTES = 64 * 1024
PREVIEW_CHARS = 400
"""Tool output kept inline in the state; the full output is in the step record or a blob."""

INLINE_BYTES = 2048
"""The per-item budget: tool arguments, tool output or a DONE summary up to this size (UTF-8
JSON for arguments) are kept inline; larger ones go to the blob store and every record (head,
step record, ledger) keeps a preview and a `BlobRef`. So what a step writes is bounded whatever
the agent passes around."""

MAX_APPROVAL_REQUEST_BYTES = 16 * 1024
"""An `ask_person` request (prompt and details, as JSON) is shown in full to a person and kept
in the head while the run waits; a larger one fails the attempt with the reason."""

EXPIRED_BY = "nobody"
"""Who decided a request nobody answered in time, on either runtime."""

MAX_ERROR_CHARS = 2000
"""An error kept on the run (and in its `attempt_failed` record) is cut to this length."""

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
RunId = Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN.pattern)]

CONCURRENCY_KEY_PATTERN = re.compile(r"^[A-Za-z0-9._:@-]{1,64}$")
"""A run's `concurrency_key` (a tenant, a customer): 1-64 letters, digits, '.', '_', ':', '@'
or '-'. Short and printable: it names a slot partition on AWS and shows in every listing."""
ConcurrencyKey = Annotated[str, StringConstraints(pattern=CONCURRENCY_KEY_PATTERN.pattern)]
MIN_PRIORITY = 0
MAX_PRIORITY = 9
"""A run's `priority`: 0 (the default) to 9; of the runs waiting for a slot, the higher goes
first, as aged by `effective_priority`."""
PRIORITY_AGING_SECONDS = 30.0
"""A waiting run's priority grows by one for each this many seconds it has waited."""


def effective_priority(priority: int, waited_seconds: float) -> float:
    """Which waiting run takes a freed slot first: the highest of these. A run's priority
    grows by one for every `PRIORITY_AGING_SECONDS` it waits, so no run waits forever while
    slots free up: one of priority 0 outranks a fresh one of priority 9 once it has waited
    9 x 30 s, and from then on only runs that have waited longer go before it."""
    return priority + max(waited_seconds, 0.0) / PRIORITY_AGING_SECONDS


def utcnow() -> datetime:
    return datetime.now(UTC)


def idempotency_key(run_id: str, step: int) -> str:
    """The key every side-effecting call of a step carries: `<run_id>/step-<n>`."""
    return f"{run_id}/step-{step}"


class RunStatus(StrEnum):
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    """The agent reported the goal done."""
    FAILED = "failed"
    STOPPED = "stopped"
    """The run reached its step cap before the agent reported the goal done."""
    CANCELLED = "cancelled"
    """Someone cancelled the run; its checkpoints stay."""


FINISHED = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.CANCELLED})


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


EMAIL_PATTERN = r"^[^@\s<>\"',;]{1,64}@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$"
SLACK_CHANNEL_PATTERN = r"^#?[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$"
MAX_NOTIFY_EMAILS = 10


def _email_address(address: str) -> str:
    if len(address) > 254 or not re.fullmatch(EMAIL_PATTERN, address):
        raise ValueError("not an email address (name@example.com)")
    return address


def _slack_channel(channel: str) -> str:
    if not re.fullmatch(SLACK_CHANNEL_PATTERN, channel):
        raise ValueError("not a Slack channel (an id such as C0123ABCD, or #name)")
    return channel


class NotifyTargets(_Model):
    """Who is asked when the run waits for a person: email addresses and/or a Slack channel.
    Empty: the deployment's defaults (locally, the outbox and the worker's printed link)."""

    email: list[Annotated[str, AfterValidator(_email_address)]] = Field(
        default_factory=list, max_length=MAX_NOTIFY_EMAILS
    )
    slack_channel: Annotated[str, AfterValidator(_slack_channel)] | None = None

    @property
    def is_empty(self) -> bool:
        return not self.email and self.slack_channel is None


class Usage(_Model):
    """Tokens a model call (or a run, summed) used, as the provider counted them."""

    input_tokens: int = Field(default=0, ge=0)
    """Input tokens billed at the full rate (not read from or written to the prompt cache)."""
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    calls: int = Field(default=0, ge=0)
    """Model calls counted (a run's total; 1 for one call)."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            calls=self.calls + other.calls,
        )

    @property
    def prompt_tokens(self) -> int:
        """All input: full-rate, cache reads and cache writes."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def cached_share(self) -> float:
        """The share of input tokens read from the prompt cache (0 when there was none)."""
        total = self.prompt_tokens
        return self.cache_read_tokens / total if total else 0.0


MAX_BUDGET_USD = 10_000.0
"""The most a run's budget (or one raise of it) may be, in US dollars: a larger one is a typo
(or cents given as dollars), not a bound."""
MAX_BUDGET_TOKENS = 1_000_000_000
"""The most a run's token budget (`max_tokens_total`, or one raise of it) may be."""


class Budget(_Model):
    """A run's spending bound and what its model calls have spent against it: in US dollars
    at the prices Ratchet knows (`usd`), or in tokens (`tokens`, for a model without a price),
    or both. Every model call is reserved before it is made, at the most it can cost, and the
    reservation settles to what the call used once that is recorded; a reservation never
    settled (its process died in the call) counts in full (`ratchet.engine.spending`)."""

    usd: float | None = Field(default=None, ge=0)
    """The bound in dollars, raises included (None: none)."""
    tokens: int | None = Field(default=None, ge=0)
    """The bound in tokens, input and output, raises included (None: none)."""
    spent_usd: float = Field(default=0.0, ge=0)
    spent_tokens: int = Field(default=0, ge=0)
    """Settled spending: what recorded calls used, and reservations counted in full."""
    reserved_usd: float = Field(default=0.0, ge=0)
    reserved_tokens: int = Field(default=0, ge=0)
    """What the attempt under way (or the last one, if its process died) holds for its
    model calls, not yet settled."""
    refused: str | None = None
    """Set when a person would not raise the budget, to what the run ends with: the run's
    next step stops it (`RunStatus.STOPPED`)."""


class RunOptions(_Model):
    model: str = "scripted"
    max_steps: int = Field(default=DEFAULT_MAX_STEPS, ge=1, le=100_000)
    tool_latency_ms: int = Field(default=0, ge=0, le=600_000)
    params: dict[str, Any] = Field(default_factory=dict)
    """Agent-specific options, e.g. `{"batches": 40}` for the migration scenario."""
    notify: NotifyTargets = NotifyTargets()
    memory_window: int = Field(default=RECENT_STEPS, ge=1, le=MAX_MEMORY_WINDOW)
    """Completed steps the model sees in full; older ones are in the summary."""
    model_summary: bool = False
    """Whether steps leaving the window are summarised by the model (else: a per-tool digest)."""
    approval_timeout_seconds: int | None = Field(default=None, ge=1, le=365 * 24 * 3600)
    """Locally, how long a person has to answer this run's requests (None: the runtime's
    setting). On AWS the deployment's setting times out the parked task."""


class BlobRef(_Model):
    sha256: str
    size: int


class ToolCall(_Model):
    """The model's decision at one step: the single tool it asked for.

    With `blob`, the arguments were over `INLINE_BYTES`: `arguments` is then a preview (small
    values kept, large ones replaced by their size) and the full arguments, as UTF-8 JSON, are
    the blob. The engine hands the tool the full ones."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    blob: BlobRef | None = None


class Done(_Model):
    """The model reported the goal complete."""

    summary: str


Decision = ToolCall | Done


class Message(_Model):
    """What the assistant decided at a step (`arguments` is a preview when `blob` is set)."""

    step: int
    role: Literal["assistant"] = "assistant"
    tool: str
    arguments: dict[str, Any]
    blob: BlobRef | None = None


class ToolOutput(_Model):
    """A tool's result at a step. `text` is a preview when the full output lives in a blob."""

    step: int
    tool: str
    text: str
    blob: BlobRef | None = None


class ApprovalRequest(_Model):
    """What a tool asks a person before the run may go on."""

    prompt: str
    details: dict[str, Any] = Field(default_factory=dict)
    answer_schema: dict[str, Any] | None = None
    """The JSON schema of the answer the person gives when approving (`ask_person(...,
    answer=Model)`), or None: a plain yes or no."""
    reply: bool | None = None
    """True for `wait_for_reply`: the person writes a reply (the answer's `reply` field) and
    sends it, or declines; the page and the message say so. None for an approval."""
    uncertain: str | None = None
    """Set (to the tool's name) when the engine asks whether an at-most-once tool's call,
    started and never recorded, ran (`Tool.at_most_once`): the answer's `ran` says."""
    raises_budget: bool = False
    """Set when the engine asks a person to raise the run's budget (its next model call may
    cost more than is left): approving raises it by the answer's `raise_usd` (or
    `raise_tokens`), rejecting stops the run with the reason."""


EVENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
EventName = Annotated[str, StringConstraints(pattern=EVENT_NAME_PATTERN)]
MIN_SLEEP_SECONDS = 1
MAX_WAIT_SECONDS = 365 * 24 * 3600
"""A wait (a sleep, an event's timeout) lasts from 1 second to a year."""
MAX_EVENT_BYTES = 256 * 1024
"""An event's payload, as UTF-8 JSON, is at most this; one over `INLINE_BYTES` is kept in the
blob store by hash, and the records hold a preview and the reference."""


class EventWait(_Model):
    """What a tool waits for with `wait_for_event`: an event of this name sent to the run."""

    kind: Literal["event"] = "event"
    name: EventName
    timeout_seconds: int | None = Field(default=None, ge=MIN_SLEEP_SECONDS, le=MAX_WAIT_SECONDS)
    expires_at: datetime | None = None
    """When the wait gives up (`timeout_seconds` after the step committed; None: never)."""
    answer_schema: dict[str, Any] | None = None
    """The JSON schema the payload must match (`wait_for_event(schema=Model)`), or None."""
    details: dict[str, Any] = Field(default_factory=dict)
    webhook: bool = False
    """Whether the wait takes the event from a signed webhook URL too (`ratchet hook`)."""

    @property
    def prompt(self) -> str:
        """What the run waits for, in words (as a person's request says it)."""
        return f"Waiting for the event {self.name!r}" + (
            f" until {_when(self.expires_at)}" if self.expires_at else ""
        )


class TimerWait(_Model):
    """What a tool waits for with `sleep` or `sleep_until`: a time."""

    kind: Literal["timer"] = "timer"
    seconds: float | None = Field(default=None, ge=MIN_SLEEP_SECONDS, le=MAX_WAIT_SECONDS)
    """As asked by `sleep` (relative), or None for `sleep_until`."""
    until: datetime | None = None
    """When the run wakes: set by `sleep_until`, or by the engine from `seconds`."""
    day_budget_of: str | None = None
    """Set (to the agent's name) when the engine parks the run because its agent's daily
    budget is spent: it wakes at the next UTC day (`until`) or when a person raises the day's
    budget, and its settling moves no step's result (no step of the run asked for it)."""
    day_budget_usd: float | None = None
    """The day's budget it found spent, for its prompt."""

    @property
    def prompt(self) -> str:
        if self.day_budget_of is not None and self.until is not None:
            return day_budget_prompt(self.day_budget_of, self.day_budget_usd, self.until)
        return f"Sleeping until {_when(self.until)}" if self.until else "Sleeping"

    @property
    def details(self) -> dict[str, Any]:
        return {}

    @property
    def answer_schema(self) -> None:
        return None


MAX_CHILDREN = 100
"""The most runs one step may start (`start_runs`)."""
MAX_CHILD_DEPTH = 5
"""How deep runs may nest: a run started by a run started by ... five levels at most."""
ChildWaitMode = Literal["all", "first"]


class ChildrenWait(_Model):
    """What a step that started child runs (`start_runs(..., wait="all" | "first")`) waits
    for: all of them to end, or the first one."""

    kind: Literal["children"] = "children"
    children: list[RunId] = Field(min_length=1, max_length=MAX_CHILDREN)
    """The child runs' ids, in the order the tool gave them (`child_run_id`)."""
    wait: ChildWaitMode = "all"

    @property
    def prompt(self) -> str:
        count = len(self.children)
        runs = "run" if count == 1 else "runs"
        if self.wait == "first":
            return f"Waiting for the first of {count} child {runs} to end"
        return f"Waiting for {count} child {runs} to end"

    @property
    def details(self) -> dict[str, Any]:
        return {"children": list(self.children)}

    @property
    def answer_schema(self) -> None:
        return None


ChildWaitChoice = Literal["all", "first", "none"]


class RunSpec(_Model):
    """One run a tool starts (`start_runs`): an agent the deployment knows, by name (locally
    also `module:attr`), with its input; the goal, model and step cap default as a start's do,
    except the model, which is the parent's."""

    agent: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] | None = None
    goal: str | None = Field(default=None, min_length=1, max_length=MAX_GOAL_BYTES)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    max_steps: int | None = Field(default=None, ge=1)


class StartRuns(_Model):
    """What `start_runs` returns for the engine: the runs to start at this step (their ids
    derived from the step's key) and what the run waits for then."""

    kind: Literal["start_runs"] = "start_runs"
    runs: list[RunSpec] = Field(min_length=1, max_length=MAX_CHILDREN)
    wait: ChildWaitChoice = "all"

    def waits_for(self, parent: str, step: int) -> ChildrenWait | None:
        if self.wait == "none":
            return None
        children = [child_run_id(parent, step, i) for i in range(len(self.runs))]
        return ChildrenWait(children=children, wait=self.wait)


def child_run_id(parent: str, step: int, index: int) -> str:
    """The id of the `index`th run that step `step` of run `parent` starts: its idempotency
    key with `/` as `.` (`<run>.step-<n>.<i>`), so a retried step starts no second child. An
    id over 128 characters keeps its start and ends in a hash of the whole."""
    whole = f"{parent}.step-{step}.{index}"
    if len(whole) <= 128:
        return whole
    digest = hashlib.sha256(whole.encode("utf-8")).hexdigest()[:24]
    return f"{whole[:96].rstrip('.')}.{digest}.{index}"[:128]


def parent_cancelled(parent: str) -> str:
    """Why a child run was cancelled with its parent (`Cancelled by <who>: ...`)."""
    return f"its parent run {parent} was cancelled"


def duration_words(seconds: float) -> str:
    """`45 s`, `90 min`, `2 h`, `3 d`: a wait's length, as a result or a status says it."""
    if seconds < 120:
        return f"{seconds:g} s"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size or unit == "min":
            amount = seconds / size
            return f"{amount:.0f} {unit}" if amount == round(amount) else f"{amount:.1f} {unit}"
    return f"{seconds:g} s"  # pragma: no cover


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def day_budget_prompt(agent: str, usd: float | None, until: datetime) -> str:
    """What a run parked for its agent's spent daily budget says: "agent support's daily
    budget of $5.00 is spent; resumes at 2026-12-07T00:00Z or when raised"."""
    budget = "" if usd is None else f" of ${usd:,.2f}" if usd >= 0.1 else f" of ${usd:.4f}"
    return (
        f"agent {agent}'s daily budget{budget} is spent; "
        f"resumes at {until.astimezone(UTC):%Y-%m-%dT%H:%MZ} or when raised"
    )


_WAIT_KINDS = ("event", "timer", "children")


def _wait_kind(value: Any) -> str:
    if not isinstance(value, dict):
        kind = getattr(value, "kind", None)
        return kind if kind in _WAIT_KINDS else "person"
    kind = value.get("kind")
    if kind in _WAIT_KINDS:
        return str(kind)
    # A head is stored without the fields at their default, `kind` among them; and records
    # written before there were other waits hold an approval request with no kind. Each
    # kind has a field the others lack.
    if "name" in value:
        return "event"
    if "until" in value or "seconds" in value:
        return "timer"
    if "children" in value:
        return "children"
    return "person"


WaitRequest = Annotated[
    Annotated[ApprovalRequest, Tag("person")]
    | Annotated[EventWait, Tag("event")]
    | Annotated[TimerWait, Tag("timer")]
    | Annotated[ChildrenWait, Tag("children")],
    Discriminator(_wait_kind),
]
"""What a step waits for: a person's decision, an event, a time, or child runs."""

AnyWait = ApprovalRequest | EventWait | TimerWait | ChildrenWait


def wait_kind(request: AnyWait) -> str:
    """`person`, `event`, `timer` or `children`."""
    return _wait_kind(request)


def wait_due(request: AnyWait) -> datetime | None:
    """When the wait settles by itself: a timer's time, an event wait's timeout (None: a
    person's request, whose expiry its approval keeps, or an event wait without a timeout)."""
    if isinstance(request, TimerWait):
        return request.until
    if isinstance(request, EventWait):
        return request.expires_at
    return None


def stamped(request: EventWait | TimerWait, now: datetime) -> EventWait | TimerWait:
    """The wait with its times made absolute from `now` (the step's commit)."""
    if isinstance(request, TimerWait):
        if request.until is not None or request.seconds is None:
            return request
        return request.model_copy(update={"until": now + timedelta(seconds=request.seconds)})
    if request.timeout_seconds is None or request.expires_at is not None:
        return request
    return request.model_copy(
        update={"expires_at": now + timedelta(seconds=request.timeout_seconds)}
    )


class Waiting(_Model):
    step: int
    request: WaitRequest
    since: datetime

    @property
    def kind(self) -> str:
        return wait_kind(self.request)

    @property
    def due(self) -> datetime | None:
        return wait_due(self.request)


class SpanLink(_Model):
    """An OpenTelemetry span's context, as hex: the span of a step that parked its run, kept
    so the step that resumes links to it (`ratchet.tracing`)."""

    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    span_id: str = Field(pattern=r"^[0-9a-f]{16}$")


class ToolDigest(_Model):
    """Older calls of one tool, summarised so the state stays bounded."""

    calls: int
    first_step: int
    last_step: int
    last_arguments: dict[str, Any] | None = None
    """Kept by schema 2 and earlier; no longer written (it grew the head by an argument
    preview per tool, rewritten every step)."""


class RunState(_Model):
    """Everything needed to resume a run, and nothing that cannot be serialized."""

    schema_version: int = SCHEMA_VERSION
    run_id: RunId
    agent: str
    goal: str
    options: RunOptions = RunOptions()
    status: RunStatus = RunStatus.RUNNING
    step: int = 0
    """Completed steps. The next step to run is `step + 1`."""
    version: int = 1
    """Bumped by every write to the head; a write must name the version it read."""
    attempts: int = 0
    """Attempts started at step `step + 1`; counted before the work starts."""
    messages: list[Message] = Field(default_factory=list)
    tool_results: list[ToolOutput] = Field(default_factory=list)
    digest: dict[str, ToolDigest] = Field(default_factory=dict)
    last_result: str | None = None
    waiting: Waiting | None = None
    summary: str | None = None
    error: str | None = None
    usage: Usage = Usage()
    """Tokens the run's model calls used, summed over its step records."""
    pinned: list[str] = Field(default_factory=list)
    """Facts the agent pinned with the `remember` tool: in every prompt, never summarised."""
    memory: str | None = None
    """The model-written running summary of the steps that left the window (`model_summary`);
    recorded in the step record that evicted them."""
    memory_through: int = 0
    """The last step folded into `memory` (with `model_summary`; 0: none yet)."""
    not_before: datetime | None = None
    """After a failed attempt: the next attempt waits until then (backing off)."""
    redo_step: int | None = None
    """Set when a person said an at-most-once call that step made did not run: the next
    step makes the same call again, once, with no model call."""
    parked_span: SpanLink | None = None
    """With tracing on: the span of the step that parked the run (its record's `span`), kept
    until the next step commits, whose spans link to it."""
    budget: Budget | None = None
    """The run's spending bound and its spending (None: no bound; `Agent.max_cost_usd`,
    `max_tokens_total`, or a start's `budget_usd`)."""
    parent: RunId | None = None
    """The run whose step started this one (`start_runs`), told when this one ends."""
    parent_step: int | None = None
    depth: int = Field(default=0, ge=0, le=MAX_CHILD_DEPTH)
    """0 for a run started from outside; a child's is its parent's plus one."""
    concurrency_key: ConcurrencyKey | None = None
    """The tenant (a customer, ...) the run works for: at most its agent's
    `max_concurrent_per_key` runs of one key work a step at once (`ratchet.limits`)."""
    priority: int = Field(default=MIN_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    """Of the runs waiting for a slot, the higher goes first (`effective_priority`)."""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)

    @property
    def next_step(self) -> int:
        return self.step + 1

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    def cut_off_at(self, step: int) -> bool:
        """Whether this head shows the run's step `step` cut off by a cancel: the run was
        cancelled before that step committed, so it never will. The child runs such a step
        started are no committed step's, and end with the run (`ratchet.children`)."""
        return self.status is RunStatus.CANCELLED and self.step < step


# --- checkpoint events: what each checkpoint records ------------------------------------------


class Created(_Model):
    kind: Literal["created"] = "created"
    state: RunState


@dataclass(frozen=True)
class RecordRow:
    """The row (or item) a stored checkpoint record is read from, as the context its event is
    validated in (`ratchet.stored.parse_event`): what a step record leaves out because its row
    says it is filled back in from here (`StepCompleted.stored_exclusions`)."""

    run_id: str
    step: int


class StepCompleted(_Model):
    """One immutable step record: the decision, its key, and what the tool returned.

    Stored, it leaves out what its row already says (`stored_exclusions`): read back with that
    row (`RecordRow`), it is the same event, and a record stored whole (before) reads as it
    always did."""

    kind: Literal["step"] = "step"
    step: int
    key: str
    call: ToolCall
    output: ToolOutput
    wait: WaitRequest | None = None
    next_attempt_counted: bool = False
    """The commit also counted the next step's first attempt (a worker going straight on), as
    an older Ratchet's did; read so that its records replay, never written now: a process that
    died before that step began left a strike on it (each step counts its own attempt)."""
    attempt: int
    duration_ms: float
    usage: Usage | None = None
    """What this attempt's model call used; None when the decision was reused (no call)."""
    memory: str | None = None
    """The running summary after this step, when this step's commit summarised the steps it
    pushed out of the window with the model (written once here, so a replay reads it back)."""
    memory_through: int | None = None
    """The last step `memory` covers (set with it)."""
    started: list[str] | None = None
    """The child runs this step started (`start_runs`), in order, whether or not it waits
    for them."""
    span: SpanLink | None = None
    """With tracing on, a step that parks (`wait`) keeps its span here: the step that resumes
    links to it."""

    def stored_exclusions(self, run_id: str, step: int) -> dict[str, Any]:
        """What a stored record of this step leaves out (`exclude` for its dump), since its
        row says it: the step (the row's `step`), the key (`idempotency_key` of the run and
        the step), and the output's step and tool (the step's, and the call's name). Each only
        when it is what reading the record back fills in (`_filled_from_row`)."""
        left: dict[str, Any] = {}
        if self.step == step:
            left["step"] = True
        if self.key == idempotency_key(run_id, self.step):
            left["key"] = True
        output = {"step"} if self.output.step == self.step else set()
        if self.output.tool == self.call.name:
            output.add("tool")
        if output:
            left["output"] = output
        return left

    @model_validator(mode="before")
    @classmethod
    def _filled_from_row(cls, data: Any, info: ValidationInfo) -> Any:
        """A stored record read with its row (`RecordRow`), with what `stored_exclusions`
        left out filled back in; a field the record holds (one stored whole) is kept."""
        row = info.context
        if not isinstance(row, RecordRow) or not isinstance(data, dict):
            return data
        filled = {"step": row.step, **data}
        step = filled["step"]
        filled.setdefault("key", idempotency_key(row.run_id, step))
        output, call = filled.get("output"), filled.get("call")
        if isinstance(output, dict) and isinstance(call, dict) and "name" in call:
            filled["output"] = {"step": step, "tool": call["name"], **output}
        return filled


class PersonDecided(_Model):
    """A person's decision on a waiting run: the one model of it, as its checkpoint records
    it. A decision from outside arrives as a `ratchet.waits.Verdict`, this event with bounds
    on its fields, and is recorded as it is."""

    kind: Literal["decided"] = "decided"
    approved: bool
    by: str
    comment: str = ""
    answer: dict[str, Any] | None = None
    """The person's answer, checked against the request's `answer_schema`."""


SettledHow = Literal["event", "timeout", "due", "woken", "children"]


class ChildOutcome(_Model):
    """Where one child run stood when its parent's wait settled: what the parent's step
    reads (its status, and its summary or error, each cut to `CHILD_RESULT_CHARS`)."""

    run_id: str
    agent: str
    status: RunStatus
    steps: int = 0
    summary: str | None = None
    error: str | None = None


CHILD_RESULT_CHARS = 1000
"""A child's summary or error, as its parent's step result holds it, at most."""


class WaitSettled(_Model):
    """A wait for an event, a time or child runs, settled: by the event (`event`), its timeout
    passing first (`timeout`), the time coming (`due`), someone waking the run early
    (`woken`), or the child runs it waits for ending (`children`).
    `text` becomes the result of the step that waited, as a person's answer does."""

    kind: Literal["settled"] = "settled"
    step: int
    how: SettledHow
    text: str
    name: str | None = None
    """The event's name (an event wait)."""
    event_id: str | None = None
    """The event that settled it: consumed from the run's mailbox in the same write."""
    payload: Any = None
    """The event's payload when it is small; a large one is `blob` (and `text` a preview)."""
    blob: BlobRef | None = None
    by: str | None = None
    """Who woke the run early."""
    children: list[ChildOutcome] | None = None
    """How each child run stood when the wait settled (`children`), in the order started."""


class AttemptFailed(_Model):
    kind: Literal["attempt_failed"] = "attempt_failed"
    step: int
    attempt: int
    error: str
    not_before: datetime | None = None
    """When the next attempt may start (the backoff the failed attempt earned)."""
    usage: Usage | None = None


class Reserved(_Model):
    """The most the model calls of an attempt at step `step` may cost, held against the run's
    budget before the first of them is made (in the write that commits nothing else, so a
    process that dies in the call leaves it counted). It settles any reservation still open
    (an attempt whose process died) in full."""

    kind: Literal["reserved"] = "reserved"
    step: int
    attempt: int
    usd: float = Field(default=0.0, ge=0)
    tokens: int = Field(default=0, ge=0)
    day: str | None = None
    """The UTC day (`YYYY-MM-DD`) whose agent-wide counter holds `day_usd` for the attempt
    (`Agent.max_cost_usd_per_day`), taken before this record was written; None: none."""
    day_usd: float = Field(default=0.0, ge=0)


class BudgetAsked(_Model):
    """Step `step` would not fit in what is left of the run's budget, or of its agent's
    daily budget: the run did not call the model, and waits (`request`) at the last step."""

    kind: Literal["budget_asked"] = "budget_asked"
    step: int
    request: WaitRequest
    """A person's approval to raise the run's budget, or, when the agent's daily budget is
    spent, a wait until the next UTC day (`TimerWait.day_budget_of`) that a raise wakes."""


class Finished(_Model):
    kind: Literal["finished"] = "finished"
    status: Literal[RunStatus.DONE, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.CANCELLED]
    summary: str | None = None
    error: str | None = None
    attempts: int = 0
    """Attempts started at the step that did not complete (the DONE decision counts as one)."""
    usage: Usage | None = None


class Retried(_Model):
    """A failed run given a fresh set of attempts at the step that failed."""

    kind: Literal["retried"] = "retried"
    by: str


CheckpointEvent = Annotated[
    Created
    | StepCompleted
    | PersonDecided
    | WaitSettled
    | AttemptFailed
    | Finished
    | Retried
    | Reserved
    | BudgetAsked,
    Field(discriminator="kind"),
]


class StoredCheckpoint(_Model):
    """One row of a run's history. The head is the fold of these, in version order."""

    run_id: str
    version: int
    step: int
    status: RunStatus
    worker_id: str
    size: int = 0
    """Bytes the commit wrote (head, record and ledger rows), filled in by the store."""
    created_at: datetime = Field(default_factory=utcnow)
    event: CheckpointEvent


# --- what a run's window keeps of its events --------------------------------------------------
# The engine's fold (each new head) and a store reading the window back from the step records
# both build the window through these, so the two cannot tell a step differently.


def message_of(event: StepCompleted) -> Message:
    call = event.call
    return Message(step=event.step, tool=call.name, arguments=call.arguments, blob=call.blob)


def preview_of(event: StepCompleted) -> ToolOutput:
    output = event.output
    text = preview(output.text)
    return ToolOutput(step=event.step, tool=output.tool, text=text, blob=output.blob)


def answer_in_place(
    results: list[ToolOutput],
    asked_at: int,
    event: PersonDecided | WaitSettled,
    asked: AnyWait | None = None,
) -> tuple[list[ToolOutput], str]:
    """The window's results once a person answered the step that asked (`asked_at`), or its
    wait for an event or a time settled, and the new last result: the answer (`settled_text`),
    in place of that step's result. The fold that builds each
    new head (`ratchet.engine.fold.apply_event`, which `replay` runs too) and the window a store
    reads back (`ratchet.stored.with_window`, what the next step's prompt is rendered from) both
    answer through this, so the prompt the model gets and `ratchet replay` cannot tell the
    answer differently."""
    text = settled_text(event, asked)
    answered = [r.model_copy(update={"text": text}) if r.step == asked_at else r for r in results]
    return answered, text


def settled_text(
    event: PersonDecided | WaitSettled,
    asked: AnyWait | None = None,
) -> str:
    """What the model reads as the waiting step's result, however the wait settled (`asked`:
    what the step asked, when the reader knows it)."""
    if isinstance(event, WaitSettled):
        return event.text
    if isinstance(asked, ApprovalRequest) and asked.uncertain:
        return uncertain_text(event, asked.uncertain)
    if not (isinstance(asked, ApprovalRequest) and asked.reply):
        return decision_text(event)
    given = event.answer.get("reply") if event.answer is not None else None
    if event.approved and isinstance(given, str):
        return f"Reply from {event.by}: {given}"
    if not event.approved:
        if event.by == EXPIRED_BY:
            return f"No reply: {event.comment or 'the request expired'}."
        return f"No reply: {event.by} declined" + (f": {event.comment}" if event.comment else ".")
    return decision_text(event)


def call_ran(event: PersonDecided) -> bool | None:
    """What a person said of an uncertain at-most-once call: True (it ran), False (it did
    not: it is made again, once), None (they would not say)."""
    if not event.approved or event.answer is None:
        return None
    ran = event.answer.get("ran")
    return ran if isinstance(ran, bool) else None


def uncertain_text(event: PersonDecided, tool: str) -> str:
    """The uncertain step's result, once a person answered: `dana says send_wire ran: ...`."""
    ran = call_ran(event)
    if ran is None:
        why = f": {event.comment}" if event.comment else ""
        return f"{event.by} would not say whether {tool} ran{why}; it was not called again."
    if not ran:
        return f"{event.by} says {tool} did not run: it is called again, once, at the next step."
    said = event.answer.get("result") if event.answer else None
    return f"{event.by} says {tool} ran" + (f": {said}" if said else ".")


def decision_text(event: PersonDecided) -> str:
    """What the model reads as the asking step's result: `Rejected by dana: too risky`, or
    with a structured answer `Approved by dana: {"amount": 120}` (and `Comment: ...`)."""
    verdict = "Approved" if event.approved else "Rejected"
    text = f"{verdict} by {event.by}"
    if event.answer is None:
        return text + (f": {event.comment}" if event.comment else ".")
    text += ": " + json.dumps(event.answer, ensure_ascii=False)
    return text + (f". Comment: {event.comment}" if event.comment else "")


def preview(text: str) -> str:
    if len(text) <= PREVIEW_CHARS:
        return text
    return text[: PREVIEW_CHARS - 1] + "…"
