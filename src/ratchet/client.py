"""The Python API: start, work, wait for, decide and read runs, on any store.

    import ratchet

    client = ratchet.connect("sqlite:///runs.db")  # or "dynamodb://TABLE?ledger=...&app=..."
    run = client.run(run_id="r1", scenario="migration", input={"batches": 2})
    assert run.status == "waiting"  # it asked a person before dropping the old table
    client.approve("r1", by="me", comment="ok")
    assert client.run(run_id="r1").status == "done"

`run` starts the run if it is new (an existing id continues) and works it in this process until
it is done, waiting for a person or failed; `start` only creates it, for workers (`ratchet
worker`) or the state machine to advance, and `wait` follows it from elsewhere. Every answer is
a pydantic model. The CLI, `ratchet serve` and the deployed runs API start and decide runs
through this same client.
"""

from __future__ import annotations

import base64
import binascii
import functools
import getpass
import inspect
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from ratchet.agents import LOCAL, AgentRegistry
from ratchet.engine.fold import replay
from ratchet.errors import (
    InvalidInput,
    NotResumable,
    NotSleeping,
    RatchetError,
    RunNotFound,
    ScheduleExists,
    ScheduleInvalid,
    ScheduleNotFound,
    SchedulesNotKept,
    StoreBusy,
)
from ratchet.faults import NO_FAULTS, FaultPlan
from ratchet.ports import RunCursor, RunSummary
from ratchet.pricing import estimate
from ratchet.runs import (
    McpToolsUnavailable,
    RunConflict,
    RunRequest,
    RunRequestInvalid,
    check_concurrency_key,
    check_run_id,
    conflicting_fields,
    new_run,
    request_problems,
)
from ratchet.state import FINISHED as ENDED  # `ratchet.feed.ENDED`, without loading the feed
from ratchet.state import (
    Budget,
    ChildrenWait,
    Created,
    EventWait,
    PersonDecided,
    RunOptions,
    RunState,
    RunStatus,
    StepCompleted,
    StoredCheckpoint,
    TimerWait,
    Usage,
    WaitSettled,
    utcnow,
    wait_kind,
)
from ratchet.summary import checkpoint_fields, usage_totals
from ratchet.tools import Agent
from ratchet.waits import MAX_BY_CHARS, MAX_COMMENT_CHARS, Verdict

if TYPE_CHECKING:
    from ratchet.engine import Binding, Engine
    from ratchet.feed import FeedBatch, FeedCursor, FeedEvent
    from ratchet.ports import (
        BlobStore,
        CheckpointStore,
        DailySpend,
        HookOpener,
        IdempotencyLedger,
    )
    from ratchet.schedules import Schedule, ScheduleBook
    from ratchet.tools import RunContext
    from ratchet.waiting.desk import EventDesk

__all__ = [
    "AsyncClient",
    "Checkpoint",
    "Client",
    "DayBudgetRaised",
    "EventSent",
    "FeedEvent",
    "HookOpened",
    "Run",
    "RunListed",
    "RunPage",
    "Started",
    "UsageTotals",
    "Wait",
    "WaitTimedOut",
]


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """`FeedEvent`, loaded with the feed when first asked for: a command that starts or
        decides a run does not follow one (issue 36)."""
        if name != "FeedEvent":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from ratchet.feed import FeedEvent

        return FeedEvent


SETTLED = frozenset({RunStatus.DONE, RunStatus.WAITING, RunStatus.FAILED})
"""Where `run` and `wait` stop by default: nothing more happens without someone."""
DEFAULT_WAIT_SECONDS = 60.0
DEFAULT_POLL_SECONDS = 0.1
FOLLOW_POLL_SECONDS = 0.2
"""How often `follow` reads the run's records while nothing new is there: one range read
(on DynamoDB, a Query of about one read unit)."""
FOLLOW_RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
"""How long `follow` waits before reading again after the store turned a read away for now
(throttled, a dropped connection): then every 5 s, for as long as it takes."""


class AnswerModel(BaseModel):
    """What the Python API and the runs API (`ratchet.web.runs`) answer: frozen models."""

    model_config = ConfigDict(frozen=True)


class WaitingFor(AnswerModel):
    """What a waiting run asked, in words (a person's request, or what an event or timer
    wait is: `Run.wait` says which)."""

    step: int
    prompt: str
    details: dict[str, Any]
    since: datetime


WaitKind = Literal["person", "event", "timer", "children"]


class Wait(AnswerModel):
    """What a waiting run waits for: a person, an event, a time, or child runs."""

    kind: WaitKind
    step: int
    """The step that waits (its result is what settles the wait)."""
    since: datetime
    prompt: str
    """The wait in words: the person's question, `Waiting for the event 'ci-finished' until
    ...`, `Sleeping until ...`."""
    name: str | None
    """The event's name, for an event wait: send it with `Client.send_event`."""
    until: datetime | None
    """When the wait settles by itself: a timer's time (`Client.wake` settles it sooner), an
    event wait's timeout; None for a person (the request's expiry is its approval's) and an
    event wait without a timeout."""
    answer_schema: dict[str, Any] | None
    """The JSON schema the event's payload (or the person's answer) must match; None: any."""
    children: list[str] | None = None
    """The child runs a children wait waits for (`start_runs`), in the order started."""

    @classmethod
    def of(cls, state: RunState) -> Wait | None:
        waiting = state.waiting
        if waiting is None or state.status is not RunStatus.WAITING:
            return None
        request = waiting.request
        return cls(
            kind=cast(WaitKind, wait_kind(request)),
            step=waiting.step,
            since=waiting.since,
            prompt=request.prompt,
            name=request.name if isinstance(request, EventWait) else None,
            until=waiting.due,
            answer_schema=request.answer_schema,
            children=list(request.children) if isinstance(request, ChildrenWait) else None,
        )


class EventSent(AnswerModel):
    """What sending an event answers; a retry with the same `event_id` gets the same answer
    (`duplicate` then true)."""

    run_id: str
    name: str
    event_id: str
    """The id given, or the one made for it: send again with it to be sure it was taken."""
    status: Literal["delivered", "queued", "refused"]
    """`delivered`: the run waited for it, and it settled the wait (at `step`); `queued`:
    kept in the run's mailbox until a wait for its name takes it; `refused`: kept, but the
    wait it reached refused its payload (`refused` says why)."""
    step: int | None
    """The step whose wait it settled; None while it waits in the mailbox."""
    duplicate: bool
    refused: str | None


class HookOpened(AnswerModel):
    """A run's webhook for one event name: where a sender (GitHub, Stripe, a CI server)
    delivers the event, and the secret it signs each delivery with (docs/webhooks.md). The
    same run and name always give the same hook; the secret is for the sender's settings
    only (it is never logged)."""

    run_id: str
    name: str
    hook_id: str
    url: str
    """`<public url>/hooks/<hook id>`: needs no AWS signature, only a signed delivery."""
    secret: str = Field(repr=False)
    """HMAC-SHA256 key of the deliveries (64 hex characters): GitHub's webhook Secret."""


class DayBudgetRaised(AnswerModel):
    """An agent's daily budget raised for one UTC day (`Client.raise_day_budget`)."""

    agent: str
    day: str
    """`YYYY-MM-DD`, UTC."""
    raised_usd: float
    """What the day's budget was raised by, this raise and the earlier ones of the day."""
    spent_usd: float
    """What the agent's runs spent on the day so far, holds of calls under way included."""
    woken: list[str]
    """The runs that waited for the day's budget and were woken to try again."""


class UsageTotals(AnswerModel):
    """Tokens model calls used, as the provider counted them."""

    input_tokens: int
    """Input billed at the full rate (not read from or written to the prompt cache)."""
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    calls: int
    cached_share: float
    """The share of all input tokens read from the prompt cache (0 to 1)."""

    @classmethod
    def of(cls, usage: Usage) -> UsageTotals:
        return cls(**usage_totals(usage.model_dump()))


class Run(AnswerModel):
    """Where a run stands: its head, read from the store."""

    # The fields in the order the runs API answers them (`ratchet.web.runs.RunView`).
    run_id: str
    status: RunStatus
    step: int
    """Steps committed so far."""
    version: int
    attempts: int
    """Attempts counted at the next step (0 when none failed)."""
    summary: str | None
    error: str | None
    agent: str
    model: str
    max_steps: int
    goal: str
    input: dict[str, Any]
    """The run's params: its input, with the agent's defaults filled in."""
    parent: str | None = None
    """The run whose step started this one (`start_runs`); None for a run started from
    outside."""
    waiting: WaitingFor | None
    """What the run waits for, in words, while it waits."""
    wait: Wait | None
    """What the run waits for, while it waits: its kind, an event's name, when it settles by
    itself."""
    usage: UsageTotals
    """What the run's model calls used, summed over its steps."""
    cost_usd: float | None
    """The estimated cost of `usage` in US dollars (`ratchet.pricing`); None when no price
    is known for the model (scripted, your own)."""
    budget: Budget | None = None
    """The run's budget and what its model calls spent against it (`spent_usd`), with what
    the step under way holds (`reserved_usd`); None for a run without one."""
    created_at: datetime
    updated_at: datetime
    concurrency_key: str | None = None
    """The tenant the run was started for (`max_concurrent_per_key`); None for none."""
    priority: int = 0
    """Of the runs waiting for a slot, the higher goes first (0-9)."""

    @classmethod
    def of(cls, state: RunState) -> Self:
        waiting = state.waiting
        return cls(
            run_id=state.run_id,
            status=state.status,
            step=state.step,
            version=state.version,
            attempts=state.attempts,
            agent=state.agent,
            goal=state.goal,
            model=state.options.model,
            max_steps=state.options.max_steps,
            input=dict(state.options.params),
            parent=state.parent,
            summary=state.summary,
            error=state.error,
            waiting=WaitingFor(
                step=waiting.step,
                prompt=waiting.request.prompt,
                details=dict(waiting.request.details),
                since=waiting.since,
            )
            if waiting
            else None,
            wait=Wait.of(state),
            usage=UsageTotals.of(state.usage),
            cost_usd=estimate(state.options.model, state.usage),
            budget=state.budget,
            created_at=state.created_at,
            updated_at=state.updated_at,
            concurrency_key=state.concurrency_key,
            priority=state.priority,
        )


class Started(AnswerModel):
    run: Run
    created: bool
    """False when the run existed: the start changed nothing."""


class Checkpoint(AnswerModel):
    """One durable write of a run: what `history` lists."""

    version: int
    step: int
    status: RunStatus
    event: str
    """What the write recorded: created, step, decided, attempt_failed, finished, ..."""
    worker: str
    bytes: int
    time: datetime
    usage: UsageTotals | None = None
    """What the write's model call used (a step, a failed attempt, the finish); None when
    no model was called."""
    tool: str | None = None
    """The tool a step ran."""
    arguments: dict[str, Any] | None = None
    """Its arguments (a preview when they were kept as a blob)."""
    result: str | None = None
    """A preview of what the tool returned."""
    by: str | None = None
    """Who decided (a person's decision) or retried the run."""
    comment: str | None = None
    """The decider's comment."""
    error: str | None = None
    """Why an attempt failed, or the run."""
    explanation: str = ""
    """The write in words: "step committed", "person decided by dana: approved (ok)", ..."""
    duration_ms: float | None = None
    """How long a step took, its commit included."""
    attempt: int | None = None
    """Which attempt at its step a step record, or a failed attempt, was (1 for the first)."""


class RunListed(AnswerModel):
    run_id: str
    status: RunStatus | Literal["damaged"]
    """The run's status; `damaged` for a run whose stored row cannot be read (see `damage`):
    no command can advance or change it until it is repaired."""
    step: int
    version: int
    updated_at: datetime
    damage: str | None = None
    """Why a damaged run cannot be read (the column and what is wrong with it); None
    otherwise."""
    agent: str | None = None
    """The run's agent; None for a run whose stored row does not say (see
    `ratchet.ports.RunSummary.agent`)."""
    concurrency_key: str | None = None
    """The run's key, in a full listing (`runs`) and a page by key (`runs_page(key=...)`);
    None for a run without one, and in a page of every run (the DynamoDB runs index keeps
    no key)."""


def _answer(c: StoredCheckpoint) -> Checkpoint:
    return Checkpoint(
        **checkpoint_fields(
            {
                "version": c.version,
                "step": c.step,
                "status": c.status.value,
                "worker": c.worker_id,
                "bytes": c.size,
                "time": c.created_at,
                "event": c.event.model_dump(mode="json", exclude_none=True),
            }
        )
    )


@dataclass(frozen=True)
class Recent:
    """A run's head, its newest checkpoints (oldest first) and the child runs they started
    (`Client.recent`)."""

    head: RunState
    checkpoints: list[Checkpoint]
    children: list[Run]


class RunPage(AnswerModel):
    """One page of runs, most recently changed first."""

    runs: list[RunListed]
    next: str | None
    """Give it as `after` for the next page; None on the last page."""


MAX_PAGE_RUNS = 100
_CURSOR_PARTS = 2


def page_cursor(updated_at: datetime, run_id: str) -> str:
    """An opaque `next` token: where a page ended (the last run's change time and id)."""
    text = json.dumps([updated_at.isoformat(), run_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


def parse_cursor(token: str) -> RunCursor:
    """`InvalidInput` for a token no page gave."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        parts = json.loads(raw)
        if not isinstance(parts, list) or len(parts) != _CURSOR_PARTS:
            raise ValueError
        moment, run_id = datetime.fromisoformat(parts[0]), check_run_id(parts[1])
        if moment.tzinfo is None:
            raise ValueError
    except (ValueError, TypeError, InvalidInput, binascii.Error):
        raise InvalidInput("after: not a token that a page of runs gave as its next") from None
    return RunCursor(moment, run_id)


class WaitTimedOut(RatchetError):
    """`Client.wait` gave up: the run did not reach the statuses asked for in time."""

    def __init__(self, run: Run, until: Collection[RunStatus], timeout: float) -> None:
        wanted = " or ".join(sorted(s.value for s in until))
        super().__init__(
            f"run {run.run_id!r} is still {run.status.value} at step {run.step} after "
            f"{timeout:g} s (waited for {wanted})"
        )
        self.run = run


class NoCheckpointAtStep(InvalidInput):
    """`state_at` was asked for a step the run has no checkpoint at."""


class CheckpointsExpired(RatchetError):
    """The run's first checkpoints are gone (past the store's retention): no state can be
    rebuilt from them."""


class AgentHookFailed(RatchetError):
    """An agent's own hook (prepare, verify) raised; the message names the agent and hook."""


_Result = TypeVar("_Result")


def call_hook(agent: str, hook: str, call: Callable[[], _Result]) -> _Result:
    """Run an agent's own code: whatever it raises (even `sys.exit`) becomes one line naming
    the agent and the hook (`AgentHookFailed`), not a traceback from somewhere inside it."""
    try:
        return call()
    except RatchetError:
        raise
    except (Exception, SystemExit) as error:
        reason = " ".join(str(error).split())
        raise AgentHookFailed(
            f"agent {agent!r}: its {hook} hook failed: {type(error).__name__}: {reason}"
        ) from None


def _status(value: RunStatus | str) -> RunStatus:
    try:
        return RunStatus(value)
    except ValueError:
        known = ", ".join(s.value for s in RunStatus)
        raise InvalidInput(f"unknown run status {value!r}: use one of {known}") from None


_STATUSES = frozenset(status.value for status in RunStatus)


def _listed(summary: RunSummary) -> RunListed:
    damage = summary.damage or _status_damage(summary.status)
    return RunListed(
        run_id=summary.run_id,
        status="damaged" if damage else RunStatus(summary.status),
        step=summary.step,
        version=summary.version,
        updated_at=summary.updated_at,
        damage=damage,
        agent=summary.agent,
        concurrency_key=summary.concurrency_key,
    )


def _status_damage(status: str) -> str | None:
    """Why a stored status column cannot be a run's, if it cannot (a tampered row): it is
    never shown as it is, since it may hold anything, a terminal's escape codes included."""
    if status in _STATUSES:
        return None
    return "column 'status' holds no run status"


def _default_worker_id() -> str:
    return f"client:{socket.gethostname()}:{uuid.uuid4().hex[:8]}"


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in this environment (a bare container)
        return "python client"


class Resumed(AnswerModel):
    """What `Client.resume` did for a run."""

    run_id: str
    execution: str | None
    """The name of the execution that now works the run; None where none is needed (a local
    store: any worker takes a running run)."""
    started: bool
    """Whether this call started it (False: another resume started it first, or none was
    needed)."""


class Runtime(Protocol):
    """What a client acts through: a runtime (`ratchet.runtime`: `LocalRuntime`,
    `AwsRuntime`), built from a store URL by `ratchet.runtime.open_runtime`."""

    @property
    def store(self) -> CheckpointStore: ...

    @property
    def ledger(self) -> IdempotencyLedger: ...

    @property
    def blobs(self) -> BlobStore: ...

    @property
    def anthropic_configured(self) -> bool:
        """Whether runs here may use a Claude model (an Anthropic API key is configured)."""
        ...

    def context(self, run_id: str, options: RunOptions) -> RunContext:
        """The run's agent context: its options, its durable data, a scratch folder."""
        ...

    def bind(self, state: RunState) -> Binding: ...

    def engine(self, *, worker_id: str, logger: Any, faults: FaultPlan = NO_FAULTS) -> Engine: ...

    def check_agent(self, agent: Agent) -> None:
        """Refuse (`AgentNotRunnable`) an agent this runtime cannot run, before it starts."""
        ...

    def check_model(self, model: str) -> None:
        """Refuse (`ModelNotGranted`) a model this runtime may not call, before it starts."""
        ...

    def before_prepare(self) -> None:
        """Called before a new run's agent prepares its data (`Agent.prepare`): locally, takes
        the store's write lock once, so a store another process holds refuses the start before
        the hook writes anything."""
        ...

    def work(self, run_id: str, *, worker_id: str, logger: Any, faults: FaultPlan) -> None:
        """Advance the run in this process until it is done, waiting or failed (or another
        process holds it)."""
        ...

    def decide(
        self, run_id: str, verdict: Verdict, *, channel: str, worker_id: str, logger: Any
    ) -> None:
        """Take a person's decision on a waiting run: through its open approval request if it
        has one (so the request's page and links show the decision), directly only if the
        step has no request at all. A request decided already, even one the run has not
        recorded yet, is never overruled: `ApprovalDecided` says who decided, and when."""
        ...

    @property
    def daily_spend(self) -> DailySpend:
        """The agents' daily spend counters (`Agent.max_cost_usd_per_day`)."""
        ...

    def event_desk(self, engine: Engine) -> EventDesk:
        """The desk every event and wake goes through (`ratchet.waiting.desk`), settling
        waits with `engine`; on AWS it also wakes the execution parked on the wait."""
        ...

    def hooks(self, agents: AgentRegistry) -> HookOpener:
        """The runtime's webhooks (`ratchet.runtime.hooks` builds them), whose event names are
        checked against what the agents in `agents` declare."""
        ...

    def cancel(self, run_id: str, *, by: str, reason: str, worker_id: str, logger: Any) -> RunState:
        """End a running or waiting run as `cancelled` (`Engine.cancel`, which refuses a
        finished run and cancels the child runs it started that have not ended, each through
        this method), keeping its checkpoints; close its open approval requests (`CLOSED`)
        and, on AWS, stop the execution working it. Returns the cancelled head."""
        ...

    def resume(self, run_id: str, *, logger: Any) -> tuple[str, bool] | None:
        """On AWS, start the next execution of a run that no execution works any more, and
        return its name and whether this call started it (`NotResumable` while one runs);
        locally None: no execution works a run there."""
        ...

    def close(self) -> None: ...


class Client:
    """Runs on one store, through its `Runtime`.

    Safe to share between threads: on SQLite each thread gets a connection of its own, and
    on AWS the boto3 clients are shared, as boto3 allows. Each thread that works runs (`run`,
    `work`) does so as a worker of its own (`worker_id` plus the thread's name, off the main
    thread), so two threads never work one run at once: the second finds it held and
    returns where it stands. For asyncio code, `AsyncClient`.

    `agents` says which agents may be started: by default the built-in scenarios and any
    `module:attr` (this process runs the code anyway); a service that starts runs for callers
    passes the deployment's registry, so that a name is all they can give. `logger` takes
    the engine's structured events (default: the standard `logging` logger "ratchet");
    `channel` is what decisions record they came through.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        agents: AgentRegistry = LOCAL,
        worker_id: str | None = None,
        logger: Any = None,
        faults: FaultPlan = NO_FAULTS,
        channel: str = "python",
    ) -> None:
        self.runtime = runtime
        self.channel = channel
        self.agents = agents
        self.worker_id = worker_id or _default_worker_id()
        self.logger = logger if logger is not None else logging.getLogger("ratchet")
        self.faults = faults

    # --- starting and working -------------------------------------------------------------

    def start(
        self,
        *,
        run_id: str | None = None,
        scenario: str | None = None,
        agent: str | None = None,
        goal: str | None = None,
        input: Mapping[str, JsonValue] | None = None,
        model: str | None = None,
        max_steps: int | None = None,
        notify: Mapping[str, Any] | None = None,
        tool_latency_ms: int | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        budget_usd: float | None = None,
    ) -> Run:
        """Create the run unless its id exists (then nothing changes); return where it
        stands. Raises `RunRequestInvalid`, naming the argument at fault, and writes nothing
        if the request cannot run: an unknown agent, input its model refuses, a Claude model
        without a key, a `concurrency_key` that is not 1-64 of [A-Za-z0-9._:@-], a `priority`
        not from 0 to 9, a budget that is not above $0 and at most $10,000, ...

        `budget_usd` bounds what the run's model calls may cost (default: the agent's
        `max_cost_usd`): see docs/limits.md."""
        fields = {
            "run_id": run_id,
            "scenario": scenario,
            "agent": agent,
            "goal": goal,
            "input": dict(input) if input is not None else None,
            "model": model,
            "max_steps": max_steps,
            "notify": dict(notify) if notify is not None else None,
            "tool_latency_ms": tool_latency_ms,
            "concurrency_key": concurrency_key,
            "priority": priority,
            "budget_usd": budget_usd,
        }
        try:
            request = RunRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as error:
            field, message = request_problems(error)[0]
            raise RunRequestInvalid(message, field) from None
        return self.submit(request).run

    def submit(self, request: RunRequest) -> Started:
        """`start` for a request already parsed (the CLI's flags, the API's JSON body)."""
        return self.create(
            new_run(
                request, has_anthropic_key=self.runtime.anthropic_configured, agents=self.agents
            )
        )

    def create(self, state: RunState) -> Started:
        """Create the run `state` describes (from `new_run`, which checked it) unless its id
        exists: the agent is checked against this runtime, prepares its data, and the first
        checkpoint is written."""
        existing = self.runtime.store.load_head(state.run_id)
        if existing is not None:
            differs = conflicting_fields(existing, state)
            if differs:
                raise RunConflict(state.run_id, *differs)
            return Started(run=Run.of(existing), created=False)
        agent = self.agents.load(state.agent)
        self.runtime.check_agent(agent)
        self.runtime.check_model(state.options.model)
        self._pin_mcp_tools(agent, state)
        self._prepare(agent, state)
        created = self.runtime.engine(worker_id=self.worker_id, logger=self.logger).start(state)
        return Started(run=self.get(state.run_id), created=created)

    def _pin_mcp_tools(self, agent: Agent, state: RunState) -> None:
        """List the agent's MCP servers once, at the run's start, and pin their tools in its
        data, where every binding of the run reads them (`ratchet.mcp`)."""
        if not agent.mcp:
            return
        from ratchet.errors import McpServerUnavailable
        from ratchet.mcp import pins_for

        try:
            pins = pins_for(agent)
        except (McpServerUnavailable, ValueError) as error:
            raise McpToolsUnavailable(
                f"agent {agent.name!r} cannot start: {error}; nothing was written"
            ) from None
        data = self.runtime.context(state.run_id, state.options).data
        if data is None:
            raise McpToolsUnavailable(f"agent {agent.name!r}: this runtime keeps no run data")
        self.runtime.before_prepare()
        for key, value in pins.items():
            data.put_once(key, value)

    def _prepare(self, agent: Agent, state: RunState) -> None:
        prepare = agent.prepare
        if prepare is None:
            return
        context = self.runtime.context(state.run_id, state.options)
        self.runtime.before_prepare()
        call_hook(agent.name, "prepare", lambda: prepare(context))

    def run(self, run_id: str | None = None, **start: Any) -> Run:
        """Start the run if it is new (with `start`'s arguments), or continue the one with
        this id, and work it in this process until it is done, waiting or failed."""
        if run_id is not None and not start and self.runtime.store.load_head(run_id):
            return self._work(run_id)
        return self._work(self.start(run_id=run_id, **start).run_id)

    def work(self, run_id: str) -> Run:
        """Work an existing run in this process until it is done, waiting or failed (or
        another worker holds it; then where it stands)."""
        self.get(run_id)
        return self._work(run_id)

    def _work(self, run_id: str) -> Run:
        """`work` for a run just read or created: no read to check that it exists."""
        self.runtime.work(run_id, worker_id=self._worker(), logger=self.logger, faults=self.faults)
        return self.get(run_id)

    def wait(
        self,
        run_id: str,
        *,
        until: Collection[RunStatus | str] = SETTLED,
        timeout: float = DEFAULT_WAIT_SECONDS,
        poll: float = DEFAULT_POLL_SECONDS,
    ) -> Run:
        """Wait until the run, worked elsewhere, reaches one of `until` (default: done,
        waiting or failed); `WaitTimedOut` after `timeout` seconds."""
        wanted = {_status(s) for s in until}
        deadline = time.monotonic() + timeout
        while True:
            run = self.get(run_id)
            if run.status in wanted:
                return run
            if time.monotonic() >= deadline:
                raise WaitTimedOut(run, wanted, timeout)
            time.sleep(poll)

    def follow(
        self,
        run_id: str,
        *,
        after: int | None = None,
        until: Collection[RunStatus | str] = ENDED,
        poll: float = FOLLOW_POLL_SECONDS,
        timeout: float | None = None,
    ) -> Iterator[FeedEvent]:
        """The run's feed (`ratchet.feed`): each event once, in order, from after the event
        `after` (an id a feed gave; None: from the run's start), as the run writes them; it
        ends once the run reaches one of `until` (default: done, failed, stopped or
        cancelled; add `waiting` to end where it parks). `RunNotFound` if there is no run.

        It reads the store itself, so it goes on across the restarts of whatever works the
        run; a read the store turns away for now (a dropped connection, throttling) is read
        again, and nothing is skipped or repeated. To resume in another process, pass the last
        id read as `after`. `WaitTimedOut` after `timeout` seconds, if given."""
        cursor = self._feed_cursor(run_id, after, until)
        deadline = None if timeout is None else time.monotonic() + timeout
        busy = 0
        while True:
            try:
                batch = cursor.read()
            except StoreBusy:
                time.sleep(FOLLOW_RETRY_SECONDS[min(busy, len(FOLLOW_RETRY_SECONDS) - 1)])
                busy += 1
                continue
            busy = 0
            yield from batch.events
            if batch.ended:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimedOut(self.get(run_id), cursor.until, cast(float, timeout))
            time.sleep(poll)

    def _feed_cursor(
        self, run_id: str, after: int | None, until: Collection[RunStatus | str]
    ) -> FeedCursor:
        """A cursor on the run's feed, the run checked to exist (`RunNotFound`) and `after`
        to be an id (`InvalidInput`)."""
        if after is not None and (
            isinstance(after, bool) or not isinstance(after, int) or after < 0
        ):
            raise InvalidInput(f"after: {after!r} is not an event id (a whole number, 0 or more)")
        wanted = frozenset(_status(s) for s in until)
        if not wanted:
            raise InvalidInput("until: name at least one run status the feed ends at")
        self.head(run_id)
        from ratchet.feed import FeedCursor  # loaded by what follows a run (see `__getattr__`)

        return FeedCursor(self.runtime.store, run_id, after=after or 0, until=wanted)

    # --- deciding ---------------------------------------------------------------------------

    def approve(
        self,
        run_id: str,
        *,
        by: str | None = None,
        comment: str = "",
        answer: Mapping[str, JsonValue] | None = None,
    ) -> Run:
        """Approve what the waiting run asked; a worker (or `run`) resumes it. A request
        that asks for a structured answer needs `answer`, which its schema must accept
        (`AnswerInvalid` names the field at fault; nothing changes)."""
        return self._decide(run_id, approved=True, by=by, comment=comment, answer=answer)

    def reject(self, run_id: str, *, by: str | None = None, comment: str = "") -> Run:
        """Reject what the waiting run asked; it goes on knowing the answer was no."""
        return self._decide(run_id, approved=False, by=by, comment=comment)

    def _decide(
        self,
        run_id: str,
        *,
        approved: bool,
        by: str | None,
        comment: str,
        answer: Mapping[str, JsonValue] | None = None,
    ) -> Run:
        self.get(run_id)
        try:
            verdict = Verdict(
                approved=approved,
                by=by or _operator(),
                comment=comment,
                answer=dict(answer) if answer is not None else None,
            )
        except ValidationError as error:
            field, message = request_problems(error)[0]
            raise InvalidInput(f"bad decision: {field}: {message}") from None
        self.runtime.decide(
            run_id, verdict, channel=self.channel, worker_id=self.worker_id, logger=self.logger
        )
        return self.get(run_id)

    # --- schedules ---------------------------------------------------------------------------

    def schedule_add(
        self,
        name: str,
        *,
        agent: str,
        cron: str | None = None,
        every: str | None = None,
        input: Mapping[str, JsonValue] | None = None,
        timezone: str = "UTC",
    ) -> Schedule:
        """Add a schedule that starts a run of `agent` (with `input`) on the five-field `cron`
        expression in `timezone`, or `every` interval (`15m`, `2h`, `1d`; a minute at least),
        fired by the store's workers (`ratchet.schedules`). The agent and input are checked
        as a start would check them. `ScheduleInvalid` naming the field (`ScheduleExists` for a
        name taken), and nothing written, if the schedule cannot fire; `SchedulesNotKept` on a
        store that keeps no schedules (AWS: they are deployed from the project)."""
        # Loaded by what schedules runs, not by every command (`ratchet start`: issue 36).
        from ratchet.schedules import MAX_SCHEDULES, ScheduleSpec, new_schedule, parse_every

        book = self._schedules()
        fields: dict[str, Any] = {
            "name": name,
            "agent": agent,
            "cron": cron,
            "input": dict(input or {}),
            "timezone": timezone,
        }
        if every is not None:
            fields["every_seconds"] = parse_every(every)
        try:
            spec = ScheduleSpec.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as error:
            field, message = request_problems(error)[0]
            # The one check of the whole spec is that it has one rule: cron, or every.
            raise ScheduleInvalid("cron" if field == "(body)" else field, message) from None
        request = RunRequest(agent=spec.agent, input=spec.input)
        new_run(request, has_anthropic_key=self.runtime.anthropic_configured, agents=self.agents)
        if len(book.all()) >= MAX_SCHEDULES:
            raise ScheduleInvalid("name", f"a store keeps at most {MAX_SCHEDULES} schedules")
        schedule = new_schedule(spec, utcnow())
        if not book.add(schedule):
            raise ScheduleExists("name", f"a schedule named {name!r} exists; remove it first")
        return schedule

    def schedules(self) -> list[Schedule]:
        """The store's schedules, by name."""
        return self._schedules().all()

    def schedule_pause(self, name: str, *, pause: bool = True) -> Schedule:
        """Pause the schedule (its fires are skipped until it is resumed), or resume it (it
        fires next at its first time from now). `InvalidInput` if there is no such schedule."""
        from ratchet.schedules import paused

        book = self._schedules()
        for _ in range(3):  # a fire, a pause or a resume may land meanwhile: read it again
            schedule = book.get(name)
            if schedule is None:
                raise ScheduleNotFound("name", f"no schedule named {name!r}")
            changed = paused(schedule, utcnow(), pause=pause)
            if book.replace(changed, expected=schedule):
                return changed
        raise InvalidInput(f"name: schedule {name!r} kept changing; try again")

    def schedule_remove(self, name: str) -> None:
        """Remove the schedule; the runs it started stay. `InvalidInput` if there is none."""
        if not self._schedules().remove(name):
            raise ScheduleNotFound("name", f"no schedule named {name!r}")

    def _schedules(self) -> ScheduleBook:
        book = getattr(self.runtime, "schedules", None)
        if book is None:
            raise SchedulesNotKept(
                "schedules are kept by a local store and fired by its workers; this store "
                "keeps none"
            )
        return cast("ScheduleBook", book)

    # --- events and timers -------------------------------------------------------------------

    def send_event(
        self, run_id: str, name: str, data: Any = None, *, event_id: str | None = None
    ) -> EventSent:
        """Send the event `name` (payload `data`, any JSON value) to the run: delivered now if
        the run waits for an event of that name (a worker, or `work`, resumes it), else kept
        in its mailbox until a wait for it takes it. Taken once per `event_id` (default: a new
        id): sending again with the same id answers the same, `duplicate` set. Raises, with
        nothing written: `InvalidInput` (a bad name or id, `data` that is not JSON),
        `PayloadTooLarge`, `RunNotFound`, `RunEnded` (a finished run), `EventNotAwaited`
        (the agent declares its events, not this one), `EventInvalid` (the wait's schema
        refuses `data`, naming the field) or `MailboxFull`."""
        check_run_id(run_id)
        sent = self._event_desk().send(
            run_id, name, data, event_id=event_id, source=_SOURCES.get(self.channel, self.channel)
        )
        answer = EventSent.model_validate(sent.answer())
        self.logger.info(
            "event sent",
            extra={
                "run_id": run_id,
                "event": answer.name,
                "event_id": answer.event_id,
                "status": answer.status,
                "duplicate": answer.duplicate,
            },
        )
        return answer

    def wake(self, run_id: str, *, by: str | None = None) -> Run:
        """Wake a sleeping run now (`sleep`, `sleep_until`): its step's result says who woke
        it and when; a worker (or `work`) resumes it. `NotSleeping` if it does not sleep (it
        waits for a person or an event, or not at all); `by` is bounded as a decision's is
        (`InvalidInput`)."""
        steering = _Steering.checked("wake", by=by or _operator())
        check_run_id(run_id)
        return Run.of(self._event_desk().wake(run_id, by=steering.by))

    def hook(self, run_id: str, name: str) -> HookOpened:
        """The run's webhook for the event `name` (made if it is new; the same each time): its
        URL and signing secret, for the sender that delivers the event (docs/webhooks.md).
        Raises, with nothing written: `InvalidInput` (a bad run id or name), `RunNotFound`,
        `RunEnded`, `EventNotAwaited` (the agent declares its events, not this one),
        `WebhooksNotTaken` (the run waits for `name` now with `webhook=False`)."""
        check_run_id(run_id)
        opened = self.runtime.hooks(self.agents).open(run_id, name)
        self.logger.info(
            "hook opened", extra={"run_id": run_id, "event": name, "hook_id": opened.hook.hook_id}
        )
        return HookOpened(
            run_id=run_id,
            name=name,
            hook_id=opened.hook.hook_id,
            url=opened.url,
            secret=opened.secret,
        )

    def raise_day_budget(
        self, agent: str, usd: float, *, day: str | None = None, by: str | None = None
    ) -> DayBudgetRaised:
        """Let the runs of the agent named `agent` (`Agent.name`) spend `usd` more on `day`
        (`YYYY-MM-DD`, UTC; today by default) than its `max_cost_usd_per_day`, on every worker,
        and wake its runs that wait for today's budget (they try their step again; one that
        still finds no room waits again). Raises add up. `InvalidInput`, with nothing written,
        for an amount that is not above $0 and at most $10,000, a day that is not a date, or
        a bad agent name or `by`."""
        from ratchet.engine.spending import MICROS, micros
        from ratchet.tools import check_budget, check_day

        steering = _Steering.checked("raise", by=by or _operator())
        if not agent or len(agent) > 128 or not agent.isprintable():
            raise InvalidInput(f"agent: {agent!r} is not an agent's name")
        try:
            amount = check_budget(usd, "usd")
            day = check_day(day, "day")
        except ValueError as error:
            raise InvalidInput(str(error)) from None
        assert amount is not None
        desk = self._event_desk()
        today = desk.clock().astimezone(UTC).date().isoformat()  # the runtime's time
        day = today if day is None else day
        counter = self.runtime.daily_spend
        raised = counter.raise_budget(agent, day, micros(amount))
        self.logger.info(
            "daily budget raised",
            extra={"agent": agent, "day": day, "usd": amount, "by": steering.by},
        )
        woken = self._wake_for_day(desk, agent, by=steering.by) if day == today else []
        return DayBudgetRaised(
            agent=agent,
            day=day,
            raised_usd=raised / MICROS,
            spent_usd=counter.spent(agent, day) / MICROS,
            woken=woken,
        )

    def _wake_for_day(self, desk: EventDesk, agent: str, *, by: str) -> list[str]:
        """Wake the agent's runs that wait for its daily budget (reading every waiting run's
        head: the runs index keeps no wait's reason)."""
        woken = []
        for listed in self.runtime.store.list_runs():
            if listed.status != RunStatus.WAITING.value:
                continue
            head = self.runtime.store.load_head(listed.run_id)
            request = head.waiting.request if head and head.waiting else None
            if not isinstance(request, TimerWait) or request.day_budget_of != agent:
                continue
            try:
                desk.wake(listed.run_id, by=f"{by} (raised the daily budget)")
            except NotSleeping:
                continue  # went on another way meanwhile (a cancel, tomorrow's coming)
            woken.append(listed.run_id)
        return woken

    def _event_desk(self) -> EventDesk:
        engine = self.runtime.engine(worker_id=self.worker_id, logger=self.logger)
        return self.runtime.event_desk(engine)

    # --- steering ---------------------------------------------------------------------------

    def retry(self, run_id: str, *, by: str | None = None) -> Run:
        """Give a failed run a fresh set of attempts at the step that failed, from its last
        checkpoint (`Engine.retry`); `NotRetryable` unless it failed. The next worker (or
        `work`) takes it; on AWS the API also starts a new execution for it. `by` is bounded
        as a decision's is (`InvalidInput`)."""
        steering = _Steering.checked("retry", by=by or _operator())
        self.get(run_id)
        engine = self.runtime.engine(worker_id=self.worker_id, logger=self.logger)
        return Run.of(engine.retry(run_id, by=steering.by))

    def cancel(self, run_id: str, *, reason: str = "", by: str | None = None) -> Run:
        """End a running or waiting run as `cancelled`, keeping its checkpoints; its open
        approval requests are closed and, on AWS, its execution stopped; the child runs it
        waits for, or that the step it was taking had started, are cancelled with it, and
        theirs in turn (`ratchet.children`). `NotCancellable` if it has already finished.
        `by` and `reason` are bounded as a decision's `by` and comment are (`InvalidInput`)."""
        steering = _Steering.checked("cancel", by=by or _operator(), reason=reason)
        self.head(run_id)
        head = self.runtime.cancel(
            run_id,
            by=steering.by,
            reason=steering.reason,
            worker_id=self.worker_id,
            logger=self.logger,
        )
        return Run.of(head)

    def resume(self, run_id: str) -> Resumed:
        """Go on with a running or waiting run that nothing works: on AWS, start its next
        execution, where its last one ended without ending the run (a deployment whose bundle
        lacked its agent: docs/deploy.md). `NotResumable` for a run that has ended (a failed
        one takes `retry`) or whose execution runs; `InvalidInput` for a store URL that names
        no state machine. Locally nothing is needed: any worker takes a running run."""
        head = self.head(run_id)
        if head.status is RunStatus.FAILED:
            raise NotResumable(run_id, "has failed: retry it instead (ratchet retry)")
        if head.status in ENDED:
            raise NotResumable(run_id, f"is {head.status.value}: there is nothing to resume")
        started = self.runtime.resume(run_id, logger=self.logger)
        if started is None:
            return Resumed(run_id=run_id, execution=None, started=False)
        execution, by_this_call = started
        return Resumed(run_id=run_id, execution=execution, started=by_this_call)

    def children(self, run_id: str) -> list[Run]:
        """The child runs the run's steps started (`start_runs`), in the order they were
        started, each where it stands now (one read of the run's records, one of each
        child's head). Steps whose records are past their retention are not read."""
        self.head(run_id)
        started = [
            child
            for checkpoint in self.runtime.store.list_checkpoints(run_id)
            if isinstance(checkpoint.event, StepCompleted)
            for child in checkpoint.event.started or []
        ]
        heads = (self.runtime.store.load_head(child) for child in dict.fromkeys(started))
        return [Run.of(head) for head in heads if head is not None]

    def fork(self, source: str, /, *, from_step: int, run_id: str | None = None) -> Run:
        """A new run (`run_id`, default `<source>-fork-<random>`) whose state is the source's
        as of step `from_step`: its last step record or decision there. The fork is running,
        or waiting if the source still waited at that step with nobody having decided; its
        later steps take keys under its own id, and the source is untouched. Its data is the
        agent's to give (`Agent.fork`, then `prepare`): the agent copies or rebuilds what the
        fork's state depends on, or refuses (`ForkRefused`, with its reason). Refuses a step
        past the source's, and an id in use; a refused fork writes nothing."""
        head = self.head(source)
        if not 0 <= from_step <= head.step:
            raise InvalidInput(
                f"run {source!r} has completed {head.step} steps: it cannot be forked from step "
                f"{from_step}"
            )
        new_id = check_run_id(run_id) if run_id is not None else _fork_id(source)
        if self.runtime.store.load_head(new_id) is not None:
            raise InvalidInput(f"run {new_id!r} already exists: choose another id for the fork")
        checkpoints = self._all_checkpoints(source)
        # The step's own records (the step, a person's answer), not what came after at the
        # same step number: a failed attempt, a retry, the run's end.
        last = max(
            (
                c.version
                for c in checkpoints
                if c.step == from_step
                and isinstance(c.event, Created | StepCompleted | PersonDecided | WaitSettled)
            ),
            default=None,
        )
        if last is None:
            # A fork starts at its source's step: it has no record of the steps before.
            raise NoCheckpointAtStep(
                f"run {source!r} has no record of step {from_step} (its first is step "
                f"{checkpoints[0].step}): it cannot be forked from there"
            )
        state = replay(c for c in checkpoints if c.version <= last)
        assert state is not None, "the records up to a checkpoint rebuild a state"
        now = utcnow()
        forked = state.model_copy(
            update={
                "run_id": new_id,
                "version": 1,
                "status": RunStatus.WAITING if state.waiting else RunStatus.RUNNING,
                "attempts": 0,
                "error": None,
                "summary": None,
                "not_before": None,
                "usage": Usage(),
                "created_at": now,
                "updated_at": now,
            }
        )
        self._fork_data(head, forked, from_step)
        started = self.create(forked)
        if not started.created:
            raise InvalidInput(f"run {new_id!r} already exists: choose another id for the fork")
        return started.run

    def _fork_data(self, source: RunState, fork: RunState, step: int) -> None:
        """The agent's `fork` hook: the fork's data from the source's, as of `step`."""
        agent = self.agents.load(fork.agent)
        hook = agent.fork
        if hook is None:
            return
        # Checked before the hook writes anything: a fork its runtime cannot run gets no data.
        self.runtime.check_agent(agent)
        self.runtime.check_model(fork.options.model)
        source_context = self.runtime.context(source.run_id, source.options)
        fork_context = self.runtime.context(fork.run_id, fork.options)
        self.runtime.before_prepare()
        call_hook(agent.name, "fork", lambda: hook(source_context, fork_context, step))

    def replay(self, run_id: str, *, step: int) -> str:
        """The exact prompt the model saw for step `step`, rendered from the recorded state.

        That state is the fold of every record before the step's own record: the last step
        (and a person's answer to it), then any failed attempts at this step, so the prompt
        carries the last failure as the completing attempt's did, and none after a retry. If
        an earlier attempt recorded the decision and then failed (its tool raised), the model
        was asked in that attempt instead, which saw one failure fewer; the records do not say
        which attempt asked."""
        head = self.head(run_id)
        checkpoints = self._all_checkpoints(run_id)
        completed = next(
            (c for c in checkpoints if isinstance(c.event, StepCompleted) and c.event.step == step),
            None,
        )
        if completed is None:
            raise NoCheckpointAtStep(
                f"run {run_id} has no record of step {step} (steps completed: {head.step}"
                + (", some by the run it was forked from)" if step <= head.step else ")")
            )
        from ratchet.engine.prompt import step_prompt

        before = replay(c for c in checkpoints if c.version < completed.version)
        assert before is not None, "a step record follows the run's creation"
        return step_prompt(before)[1]

    def _all_checkpoints(self, run_id: str) -> list[StoredCheckpoint]:
        checkpoints = self.runtime.store.list_checkpoints(run_id)
        if not checkpoints or checkpoints[0].event.kind != "created":
            raise CheckpointsExpired(
                f"run {run_id}'s early checkpoints are past their retention: its earlier "
                "states can no longer be rebuilt"
            )
        return checkpoints

    # --- reading ----------------------------------------------------------------------------

    def get(self, run_id: str) -> Run:
        return Run.of(self.head(run_id))

    def head(self, run_id: str) -> RunState:
        """The run's full state as it stands (`get` is the short form)."""
        state = self.runtime.store.load_head(check_run_id(run_id))
        if state is None:
            raise RunNotFound(run_id)
        return state

    def history(self, run_id: str, *, after: int = 0) -> list[Checkpoint]:
        """Every durable write of the run, oldest first; with `after`, only those of a later
        version (to follow a run, read from the last version seen: one range read)."""
        self.head(run_id)
        return [_answer(c) for c in self.runtime.store.list_checkpoints(run_id, after=after)]

    def recent(self, run_id: str, *, last: int) -> Recent:
        """The run as it stands, its last `last` checkpoints and the child runs those started,
        each where it stands: what a page about the run shows, in reads that never grow with
        the run (its head, one range read of its newest records, one head per child)."""
        head = self.head(run_id)
        stored = self.runtime.store.last_checkpoints(run_id, limit=last)
        started = [
            child
            for checkpoint in stored
            if isinstance(checkpoint.event, StepCompleted)
            for child in checkpoint.event.started or []
        ]
        heads = (self.runtime.store.load_head(child) for child in dict.fromkeys(started))
        return Recent(
            head=head,
            checkpoints=[_answer(c) for c in stored],
            children=[Run.of(child) for child in heads if child is not None],
        )

    def state_at(self, run_id: str, *, step: int) -> RunState:
        """The run's state as of its last checkpoint at `step`, rebuilt from the records.
        `NoCheckpointAtStep` if the run has none there; `CheckpointsExpired` if its first
        records are past their retention (on AWS, a TTL), so the state cannot be rebuilt."""
        self.head(run_id)
        checkpoints = self.runtime.store.list_checkpoints(run_id)
        last = max((c.version for c in checkpoints if c.step == step), default=None)
        if last is None:
            raise NoCheckpointAtStep(f"run {run_id} has no checkpoint at step {step}")
        if checkpoints[0].event.kind != "created":
            raise CheckpointsExpired(
                f"run {run_id}'s early checkpoints are past their retention: its state as of "
                f"step {step} can no longer be rebuilt"
            )
        rebuilt = replay(c for c in checkpoints if c.version <= last)
        assert rebuilt is not None, "the records up to a checkpoint rebuild a state"
        return rebuilt

    def runs(
        self, *, status: RunStatus | str | None = None, key: str | None = None
    ) -> list[RunListed]:
        """Every run in the store, most recently updated first; only those in `status`, and
        only those started with `concurrency_key=key` (`InvalidInput` for a key that is not
        one)."""
        wanted = _status(status) if status is not None else None
        if key is not None:
            check_concurrency_key(key, "key")
        listed = [_listed(r) for r in self.runtime.store.list_runs()]
        return sorted(
            (
                r
                for r in listed
                if (wanted is None or r.status is wanted)
                and (key is None or r.concurrency_key == key)
            ),
            key=lambda r: r.updated_at,
            reverse=True,
        )

    def runs_page(
        self,
        *,
        status: RunStatus | str | None = None,
        limit: int = 20,
        after: str | None = None,
        key: str | None = None,
    ) -> RunPage:
        """A page of at most `limit` runs (1-100), most recently changed first, only those in
        `status` if given, each with its agent; `after` is the `next` of the page before. It
        reads the page's runs, not every run the store holds (on DynamoDB an index, not a
        Scan), except by `key` (only the runs started with that `concurrency_key`), which
        reads them all. `InvalidInput` for a bad status, limit, token or key."""
        wanted = _status(status) if status is not None else None
        if not 1 <= limit <= MAX_PAGE_RUNS:
            raise InvalidInput(f"limit: {limit} is not between 1 and {MAX_PAGE_RUNS}")
        cursor = parse_cursor(after) if after is not None else None
        if key is not None:
            # The stores' pages (the DynamoDB runs index) do not keep a run's key: a listing
            # by key reads every run (on DynamoDB a Scan), and pages what it kept.
            keyed = sorted(
                (
                    run
                    for run in self.runs(status=wanted, key=key)
                    if cursor is None
                    or (run.updated_at, run.run_id) < (cursor.updated_at, cursor.run_id)
                ),
                key=lambda run: (run.updated_at, run.run_id),
                reverse=True,
            )
            page, more = keyed[:limit], len(keyed) > limit
            end = page[-1] if page and more else None
            return RunPage(runs=page, next=page_cursor(end.updated_at, end.run_id) if end else None)
        found = self.runtime.store.list_page(
            status=wanted.value if wanted is not None else None, limit=limit + 1, after=cursor
        )
        # No key here: the DynamoDB runs index keeps none, and a page says the same of a run
        # on every store (a listing by key, above, says it).
        listed = [_listed(r).model_copy(update={"concurrency_key": None}) for r in found[:limit]]
        more = len(found) > limit
        last = listed[-1] if listed and more else None
        return RunPage(
            runs=listed, next=page_cursor(last.updated_at, last.run_id) if last else None
        )

    def verify(self, run_id: str) -> dict[str, Any]:
        """The agent's own invariants for the run (`Agent.verify`): a dict with at least
        `ok`."""
        state = self.head(run_id)
        agent = self.agents.load(state.agent)
        check = agent.verify
        if check is None:
            return {"ok": True, "note": f"agent {agent.name} has no checks"}
        context = self.runtime.context(run_id, state.options)
        result = call_hook(agent.name, "verify", lambda: check(context, state))
        if not isinstance(result, dict):
            raise AgentHookFailed(
                f"agent {agent.name!r}: its verify hook returned {type(result).__name__}, "
                "not a dict"
            )
        return result

    def _worker(self) -> str:
        """Who works runs from this thread: a thread of its own is a worker of its own, since
        a lease held by one worker id lets that id in again."""
        from ratchet.worker import MAX_WORKER_ID_CHARS  # loaded by what works runs

        thread = threading.current_thread()
        if thread is threading.main_thread():
            return self.worker_id
        return f"{self.worker_id}/{thread.name}"[:MAX_WORKER_ID_CHARS]

    # --- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        self.runtime.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncClient:
    """A `Client` for asyncio code: every public method of `Client`, as a coroutine
    (`await client.run(...)`, `await client.approve(...)`), with the same arguments and
    answers.

    Each call runs the `Client`'s method on a thread of the running loop's default executor
    (`asyncio.to_thread`), so a call never blocks the loop, and many may run at once on the
    one shared, thread-safe `Client`. Cancelling an awaited call stops the waiting, not the
    call: the thread finishes what it started (a step it works is committed or not, as for
    any worker). An agent's own async tools run on Ratchet's event loop, not the caller's.

        client = AsyncClient(ratchet.connect("sqlite:///runs.db"))
        runs = await asyncio.gather(*(client.run(agent="billing", input=i) for i in inputs))
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.client, name) if not name.startswith("_") else None
        if method is None or not inspect.ismethod(method):
            raise AttributeError(f"{type(self).__name__!r} has no method {name!r}")

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await _to_thread(method, *args, **kwargs)

        return call

    def __dir__(self) -> list[str]:
        methods = [n for n in dir(Client) if not n.startswith("_") and callable(getattr(Client, n))]
        return sorted({*super().__dir__(), *methods})

    async def follow(
        self,
        run_id: str,
        *,
        after: int | None = None,
        until: Collection[RunStatus | str] = ENDED,
        poll: float = FOLLOW_POLL_SECONDS,
    ) -> AsyncIterator[FeedEvent]:
        """`Client.follow` as an async iterator (`async for event in client.follow(...)`):
        each read of the store on a thread of the loop's executor, the waits between them on
        the loop."""
        import asyncio  # loaded already: this runs on a loop (see `_to_thread`)

        cursor = await asyncio.to_thread(self.client._feed_cursor, run_id, after, until)
        busy = 0
        while True:
            try:
                batch: FeedBatch = await asyncio.to_thread(cursor.read)
            except StoreBusy:
                await asyncio.sleep(FOLLOW_RETRY_SECONDS[min(busy, len(FOLLOW_RETRY_SECONDS) - 1)])
                busy += 1
                continue
            busy = 0
            for event in batch.events:
                yield event
            if batch.ended:
                return
            await asyncio.sleep(poll)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await _to_thread(self.client.close)


async def _to_thread(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`asyncio.to_thread`. `asyncio` is imported here, not with this module: it is loaded
    already wherever a coroutine runs, and the commands that never run one (`ratchet start`,
    `approve`) would otherwise pay for loading it (bench/cli_start.py)."""
    import asyncio

    return await asyncio.to_thread(function, *args, **kwargs)


class _Steering(BaseModel):
    """Who retries or cancels a run, and why: bounded as a decision's `by` and comment are."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: str = Field(min_length=1, max_length=MAX_BY_CHARS)
    reason: str = Field(default="", max_length=MAX_COMMENT_CHARS)

    @classmethod
    def checked(cls, what: str, **given: str) -> _Steering:
        """`InvalidInput` naming the field at fault, as a decision's refusal does."""
        try:
            return cls(**given)
        except ValidationError as error:
            field, message = request_problems(error)[0]
            raise InvalidInput(f"bad {what}: {field}: {message}") from None


_SOURCES = {"python": "client"}
"""What an event's mailbox entry says it came through, by the client's channel (`cli`,
`api` as they are)."""


def _fork_id(source: str) -> str:
    suffix = f"-fork-{uuid.uuid4().hex[:8]}"
    return source[: 128 - len(suffix)] + suffix
