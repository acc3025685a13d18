"""The public API for defining an agent: tools, their context, and an optional scripted policy.

A tool is a plain function with a pydantic argument model::

    class CopyBatch(BaseModel):
        batch: int = Field(ge=1)

    @tool(side_effect=True)
    def copy_batch(args: CopyBatch, ctx: ToolContext) -> str:
        \"\"\"Copy one batch of rows into the new table.\"\"\"
        return db.copy(args.batch, key=ctx.idempotency_key)

A handler may be `async def` (`await client.get(...)` with an `httpx.AsyncClient`, say): it
runs on the process's one event loop, under the same step deadline, and is cancelled when it
overruns (docs/tools.md).

A side-effecting tool must apply each `ctx.idempotency_key` at most once: a step that crashed
after its tool call is retried with the same key and the same arguments. An agent bundles the
tools with a goal, an optional scripted policy (for offline runs) and optional hooks that open
per-run resources, seed data and check invariants.

This module and `ratchet` itself are Ratchet's public face: what they export (`__all__`, pinned
by tests/unit/test_public_face.py) is what a project imports, including the model port for a
model of your own (`Model`, `ModelRequest`, `ModelReply`, `Usage`; docs/models.md). Every other
module is internal and may move between releases.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any, Generic, TypeVar, cast, get_type_hints

from pydantic import BaseModel, Field, ValidationError

from ratchet.errors import (
    ForkRefused,
    InvalidInput,
    ModelOutputInvalid,
    ModelUnavailable,
    PermanentError,
    WaitRequestInvalid,
)
from ratchet.ports import Model, ModelReply, ModelRequest, RunData, StepView, ToolSpec
from ratchet.state import (
    EVENT_NAME_PATTERN,
    MAX_BUDGET_TOKENS,
    MAX_BUDGET_USD,
    MAX_CHILDREN,
    MAX_WAIT_SECONDS,
    MIN_SLEEP_SECONDS,
    RECENT_STEPS,
    ApprovalRequest,
    Decision,
    Done,
    EventWait,
    RunOptions,
    RunSpec,
    RunState,
    StartRuns,
    TimerWait,
    ToolCall,
    Usage,
    duration_words,
    utcnow,
)
from ratchet.webhook_urls import check_webhook_url

ArgsT = TypeVar("ArgsT", bound=BaseModel)

__all__ = [
    "Agent",
    "ApprovalRequest",
    "Decision",
    "Done",
    "ForkRefused",
    "McpServer",
    "Model",
    "ModelOutputInvalid",
    "ModelReply",
    "ModelRequest",
    "ModelUnavailable",
    "PermanentError",
    "Policy",
    "RunContext",
    "RunData",
    "RunSpec",
    "RunState",
    "StepView",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "Usage",
    "ask_person",
    "sleep",
    "sleep_until",
    "start_runs",
    "tool",
    "wait_for_event",
    "wait_for_reply",
]


@dataclass(frozen=True)
class RunContext:
    """Where a run's agent keeps its own data, and the options the run was started with."""

    run_id: str
    options: RunOptions
    workdir: Path
    """A directory private to this run and store (locally, next to the SQLite file). On AWS it
    is scratch space in one container's /tmp, gone with it: keep what must last in `data`, and
    an agent that cannot (`Agent.needs_local_disk`) is refused there."""
    services: Mapping[str, Any] = field(default_factory=dict)
    """What the runtime offers the agent beyond the disk: on AWS, e.g. `dynamodb` (a client)
    and `app_table` (the table the stack made for agent data). Empty locally."""
    data: RunData | None = None
    """The run's durable key-value data (`RunData`), kept by the runtime's own store on every
    runtime; None only where a caller built a context by hand."""
    secrets: Mapping[str, str] = field(default_factory=dict)
    """The project's secrets by name (`secrets["PAYMENTS_API_KEY"]`): on AWS those its
    `[tool.ratchet] secrets` declares, fetched on first use and cached per container; locally
    the environment variable of each name. Hand them to clients in `resources`; never put
    one in a tool's result or a run's input (docs/your-agent-on-aws.md)."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool handler knows about the call it is serving."""

    run_id: str
    step: int
    idempotency_key: str
    """`<run_id>/step-<n>`: the same on every attempt of the step."""
    attempt: int
    resources: Any
    """Whatever the agent's `resources` hook returned for this run (e.g. a DB handle)."""


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer. `wait_for` parks the run until what it names settles: a person's
    decision (`ask_person`), an event (`wait_for_event`) or a time (`sleep`, `sleep_until`);
    `start` starts child runs (`start_runs`) and may park the run until they end."""

    output: str
    wait_for: ApprovalRequest | EventWait | TimerWait | None = None
    start: StartRuns | None = None
    """Child runs to start at this step (`start_runs`), and whether the run waits for them."""


def ask_person(
    prompt: str,
    *,
    answer: type[BaseModel] | None = None,
    details: Mapping[str, Any] | None = None,
    **more_details: Any,
) -> ToolResult:
    """Return this from a tool to park the run until a person decides.

    `details` (and any other keyword argument) are shown beside the question. With `answer`,
    a pydantic model of flat fields (text; whole numbers and numbers, with bounds; booleans;
    choices as `Literal` or `Enum`; any other field is given as JSON), approving means giving
    an answer that model's schema accepts: the page shows a form for it, and the answer, as
    JSON, becomes the step's result (`Approved by dana: {"amount": 120}`). Only the schema
    is kept, so the answer reaches the model as JSON, not as an instance of the class."""
    from ratchet.approvals.answers import answer_schema

    return ToolResult(
        output=f"Waiting for a person: {prompt}",
        wait_for=ApprovalRequest(
            prompt=prompt,
            details={**(details or {}), **more_details},
            answer_schema=answer_schema(answer) if answer is not None else None,
        ),
    )


class CallRan(BaseModel):
    """What a person answers when an at-most-once tool's call may or may not have run."""

    ran: bool = Field(description="Did the call run (did its effect happen)?")
    result: str = Field(
        default="",
        max_length=2000,
        description="What it did, if it ran and you know (a confirmation number, ...).",
    )


class RaiseBudget(BaseModel):
    """What a person answers when a run's next step would not fit in its budget in dollars."""

    raise_usd: float = Field(
        gt=0, le=MAX_BUDGET_USD, description="Raise the run's budget by this many US dollars."
    )


class RaiseTokens(BaseModel):
    """What a person answers when a run's next step would not fit in its budget in tokens."""

    raise_tokens: int = Field(
        gt=0, le=MAX_BUDGET_TOKENS, description="Raise the run's budget by this many tokens."
    )


class Reply(BaseModel):
    """What a person sends back to `wait_for_reply`: their reply, as text."""

    reply: str = Field(min_length=1, max_length=10_000, description="Your reply.")


def wait_for_reply(
    message: str, *, details: Mapping[str, Any] | None = None, **more_details: Any
) -> ToolResult:
    """Return this from a tool to send `message` to a person and park the run until they
    reply: the same signed, single-use link an approval sends (by email, Slack, or locally the
    outbox and the printed link) opens a page where they write their reply and send it, or
    decline. The reply becomes the step's result (`Reply from dana: Tuesday works`); a
    decline, or no answer before the request expires, reads `No reply: ...`. Looking at the
    page changes nothing; sending decides once."""
    from ratchet.approvals.answers import answer_schema

    return ToolResult(
        output=f"Waiting for a reply: {message}",
        wait_for=ApprovalRequest(
            prompt=message,
            details={**(details or {}), **more_details},
            answer_schema=answer_schema(Reply),
            reply=True,
        ),
    )


def wait_for_event(
    name: str,
    *,
    timeout: float | timedelta | None = None,
    schema: type[BaseModel] | None = None,
    details: Mapping[str, Any] | None = None,
    webhook: bool = False,
) -> ToolResult:
    """Return this from a tool to park the run until an event called `name` is sent to it
    (`ratchet send RUN NAME`, `Client.send_event`, `POST /runs/{id}/events/{name}`, or with
    `webhook=True` a signed delivery to the wait's webhook URL, `ratchet hook RUN NAME`).

    The event's payload (JSON) becomes the step's result: `Event 'ci-finished': {...}`. An
    event sent before the run waits is kept in its mailbox and taken by the first wait for
    its name. With `schema`, a pydantic model, a payload it refuses is refused to its sender
    (naming the field). With `timeout` (seconds, or a `timedelta`; 1 s to a year) the run
    goes on without it once that passes, the step's result saying so (`No 'ci-finished'
    event within 2 h.`). While it waits the run holds no process and, on AWS, no compute."""
    if not isinstance(name, str) or not re.fullmatch(EVENT_NAME_PATTERN, name):
        raise WaitRequestInvalid(
            f"an event name is 1-64 letters, digits and . _ : - (starting with a letter or "
            f"digit), not {name!r}"
        )
    if schema is not None and not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise WaitRequestInvalid(f"schema must be a pydantic model class, not {schema!r}")
    seconds = _seconds(timeout, what="timeout") if timeout is not None else None
    request = EventWait(
        name=name,
        timeout_seconds=math.ceil(seconds) if seconds is not None else None,
        answer_schema=schema.model_json_schema() if schema is not None else None,
        details=dict(details or {}),
        webhook=webhook,
    )
    within = f" (at most {duration_words(seconds)})" if seconds is not None else ""
    return ToolResult(output=f"Waiting for the event {name!r}{within}.", wait_for=request)


def sleep(seconds: float | timedelta) -> ToolResult:
    """Return this from a tool to park the run for `seconds` (or a `timedelta`; 1 s to a
    year). The run holds no process while it sleeps (on AWS a Step Functions `Wait` state,
    no Lambda running), can be woken early (`ratchet wake RUN`) or cancelled, and goes on
    when it is due, its step's result saying when it woke."""
    wait = _seconds(seconds, what="a sleep")
    return ToolResult(
        output=f"Sleeping for {duration_words(wait)}.", wait_for=TimerWait(seconds=wait)
    )


def sleep_until(when: datetime) -> ToolResult:
    """Return this from a tool to park the run until `when` (a timezone-aware `datetime`, at
    most a year ahead); a time already past goes on at once. As `sleep` otherwise."""
    if not isinstance(when, datetime) or when.tzinfo is None or when.utcoffset() is None:
        raise WaitRequestInvalid(f"sleep_until needs a timezone-aware datetime, not {when!r}")
    due = when.astimezone(UTC)
    if (due - utcnow()).total_seconds() > MAX_WAIT_SECONDS:
        raise WaitRequestInvalid(f"sleep_until {due.isoformat()} is more than a year ahead")
    return ToolResult(
        output=f"Sleeping until {due:%Y-%m-%d %H:%M:%S} UTC.", wait_for=TimerWait(until=due)
    )


def start_runs(runs: Sequence[RunSpec | Mapping[str, Any]], *, wait: str = "all") -> ToolResult:
    """Return this from a tool to start child runs (at most 100), each a `RunSpec(agent,
    input)`, and with `wait="all"` (the default) park the run until every one has ended, with
    `wait="first"` until the first has; with `wait="none"` the run goes straight on.

    Each child's id derives from the step's idempotency key (`<run>.step-<n>.<i>`), so a
    retried step starts no second child. While it waits the run holds no process and, on
    AWS, no compute. The step's result then says how each child ended (done, failed,
    stopped at its cap, cancelled) with its summary or error; a child still running (the
    others, with `wait="first"`) is listed as running. Cancelling the run cancels the
    children it waits for. Children nest at most five deep."""
    if wait not in ("all", "first", "none"):
        raise WaitRequestInvalid(f"start_runs: wait is 'all', 'first' or 'none', not {wait!r}")
    if isinstance(runs, str | bytes | Mapping) or not isinstance(runs, Sequence):
        raise WaitRequestInvalid("start_runs takes a list of RunSpec")
    if not 1 <= len(runs) <= MAX_CHILDREN:
        raise WaitRequestInvalid(
            f"start_runs: start 1 to {MAX_CHILDREN} runs at a step, not {len(runs)}"
        )
    specs: list[RunSpec] = []
    for i, given in enumerate(runs):
        try:
            specs.append(given if isinstance(given, RunSpec) else RunSpec.model_validate(given))
        except ValidationError as error:
            problem = error.errors(include_url=False, include_input=False)[0]
            where = ".".join(str(p) for p in problem["loc"]) or "(spec)"
            raise WaitRequestInvalid(f"start_runs: run {i}: {where}: {problem['msg']}") from None
    agents = sorted({spec.agent for spec in specs})
    shown = ", ".join(agents[:3]) + (", ..." if len(agents) > 3 else "")
    count = f"{len(specs)} child run{'s' if len(specs) != 1 else ''}"
    said = {"all": "waiting for all", "first": "waiting for the first", "none": "not waiting"}
    return ToolResult(
        output=f"Started {count} ({shown}); {said[wait]}.",
        start=StartRuns(runs=specs, wait=wait),
    )


def _seconds(value: float | timedelta, *, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not MIN_SLEEP_SECONDS <= seconds <= MAX_WAIT_SECONDS
    ):
        raise WaitRequestInvalid(
            f"{what} must be from {MIN_SLEEP_SECONDS} second to a year "
            f"({MAX_WAIT_SECONDS:,} s), not {value!r}"
        )
    return float(seconds)


Handler = Callable[[ArgsT, ToolContext], "ToolResult | str | Awaitable[ToolResult | str]"]


@dataclass(frozen=True)
class Tool(Generic[ArgsT]):
    name: str
    description: str
    args: type[ArgsT]
    handler: Handler[ArgsT]
    side_effect: bool = False
    at_most_once: bool = False
    """For a side effect that takes no idempotency key (an SMTP send, a wire through a bank
    portal): the ledger records that the call starts before it is made, and a step that
    finds a call started with no outcome recorded (its worker died, its Lambda timed out,
    the tool raised) never calls it again; the run asks a person whether it ran
    (docs/at-most-once.md)."""

    def __post_init__(self) -> None:
        if self.at_most_once and not self.side_effect:
            raise TypeError(f"tool {self.name!r}: at_most_once is for side_effect=True tools")

    @cached_property
    def _spec(self) -> ToolSpec:
        # Building a JSON schema costs about a millisecond; a tool's schema never changes.
        return ToolSpec(
            name=self.name,
            description=self.description,
            input_schema=self.args.model_json_schema(),
        )

    def spec(self) -> ToolSpec:
        return self._spec

    def parse(self, arguments: Mapping[str, Any]) -> ArgsT:
        return self.args.model_validate(dict(arguments))

    @cached_property
    def is_async(self) -> bool:
        """Whether the handler is `async def`: the engine awaits it on the process's event
        loop, where a call over the step's deadline is cancelled."""
        handler = self.handler
        # A callable object's `async def __call__` counts too (3.11's inspect does not see it).
        call = None if inspect.isroutine(handler) else type(handler).__call__
        return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)

    def __call__(self, args: ArgsT, ctx: ToolContext) -> ToolResult:
        """Call a sync handler (an async one: `call_async`)."""
        if self.is_async:
            raise TypeError(f"tool {self.name!r} is async def: await tool.call_async(args, ctx)")
        return self._result(self.handler(args, ctx))

    async def call_async(self, args: ArgsT, ctx: ToolContext) -> ToolResult:
        """Await an async handler (a sync one is called as `__call__` calls it)."""
        result = self.handler(args, ctx)
        if self.is_async and inspect.isawaitable(result):
            result = await result
        return self._result(result)

    def _result(self, result: object) -> ToolResult:
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # never awaited, on purpose: no "never awaited" warning
            raise TypeError(
                f"tool {self.name!r} returned {type(result).__name__}, an awaitable, not its "
                "result: a missing `await` (or a handler that should be `async def`)?"
            )
        return result if isinstance(result, ToolResult) else ToolResult(output=str(result))


def tool(
    *, name: str | None = None, side_effect: bool = False, at_most_once: bool = False
) -> Callable[[Handler[ArgsT]], Tool[ArgsT]]:
    """Make a `Tool` from a function `(args: SomeModel, ctx: ToolContext) -> str | ToolResult`,
    plain or `async def`.

    The name defaults to the function's, the description to its docstring, and the argument
    model is read from the first parameter's annotation. `at_most_once` (with `side_effect`)
    is for a call that cannot take the idempotency key: see `Tool.at_most_once`.
    """

    def wrap(fn: Handler[ArgsT]) -> Tool[ArgsT]:
        params = list(inspect.signature(fn).parameters)
        hints = get_type_hints(fn)
        args_model = hints.get(params[0]) if params else None
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise TypeError(f"{fn.__name__}: the first parameter must be a pydantic model")
        _check_called_with_context(fn)
        description = inspect.getdoc(fn)
        if not description:
            raise TypeError(f"{fn.__name__}: a tool needs a docstring; the model reads it")
        return Tool(
            name=name or fn.__name__,
            description=description,
            args=cast("type[ArgsT]", args_model),
            handler=fn,
            side_effect=side_effect,
            at_most_once=at_most_once,
        )

    return wrap


def _check_called_with_context(fn: Callable[..., Any]) -> None:
    """A tool is called as `fn(args, ctx)`: refuse, when the agent is defined, a function that
    cannot take that call (no `ctx` parameter, or a third one without a default), rather than
    at every attempt of the run's first step that calls it."""
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise TypeError(
            f"{fn.__name__}: a tool takes two parameters, (args: SomeModel, ctx: ToolContext); "
            "add ctx even if the tool does not use it"
        ) from None


MCP_SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class McpServer:
    """An MCP server whose tools an agent takes (`Agent(mcp=[...])`, docs/mcp.md): over
    streamable HTTP (`url`, with `headers` such as an `Authorization`), or locally over stdio
    (`command` and `args`, started for each call; a deployment on AWS takes HTTP only).

    Its tools are listed once, when a run starts, and pinned in the run's data: a server that
    changes its list later does not change a running run's tools. Each tool's annotations
    decide how it is called: `readOnlyHint` makes it a plain tool; any other is a side effect,
    sent the step's idempotency key in the request's `_meta` (`ratchet/idempotency_key`);
    and one not marked `idempotentHint`, on a server that does not say it honours the key
    (`honours_idempotency_key`), is at most once (`Tool.at_most_once`). `tools` keeps only
    the tools it names; `timeout_seconds` bounds each request to the server."""

    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    """Sent with every HTTP request; never written to the run (keep secrets here, not in
    the URL)."""
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    name: str = ""
    """What the run's data and messages call the server; by default taken from the URL's
    host and path or the command and its script. Two servers of one agent need two names."""
    honours_idempotency_key: bool = False
    """The server applies each `ratchet/idempotency_key` at most once: its tools are then
    retried with the key after a crash, instead of asking a person."""
    tools: Sequence[str] | None = None
    timeout_seconds: float = 60.0

    def __post_init__(self) -> None:
        if (self.url is None) == (self.command is None):
            raise ValueError("McpServer takes either url= (streamable HTTP) or command= (stdio)")
        if self.url is not None and not re.match(r"https?://", self.url):
            raise ValueError(f"McpServer url must be http:// or https://, not {self.url!r}")
        if self.headers and self.url is None:
            raise ValueError("McpServer headers are for url= servers")
        name = self.name or _server_name(self)
        if not MCP_SERVER_NAME.fullmatch(name):
            raise ValueError(
                f"McpServer name must be 1-64 letters, digits and . _ - (starting with a "
                f"letter or digit), not {name!r}"
            )
        object.__setattr__(self, "name", name)
        if not (0 < self.timeout_seconds <= MAX_STEP_TIMEOUT_SECONDS):
            raise ValueError(
                f"McpServer {name!r}: timeout_seconds must be from 0 to "
                f"{MAX_STEP_TIMEOUT_SECONDS:g}, not {self.timeout_seconds!r}"
            )

    @property
    def stdio(self) -> bool:
        return self.command is not None

    @property
    def where(self) -> str:
        """The server as a person knows it: its URL (without query), or its command."""
        if self.url is not None:
            return self.url.split("?", 1)[0]
        return " ".join([self.command or "", *self.args])


def _server_name(server: McpServer) -> str:
    """A default name: the URL's host, port and path (`mcp.example.com-mcp`), or the command
    and the script it runs (`python-server.py`, `mcp-server-github`)."""
    if server.url is not None:
        text = re.sub(r"^https?://([^@/]*@)?", "", server.url.split("?", 1)[0])
    else:
        script = [arg for arg in server.args[:1] if not arg.startswith("-")]
        text = "-".join(Path(word).name for word in [server.command or "", *script])
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-._")
    return name[:64].rstrip("-._")


Policy = Callable[[StepView], Decision]
"""A scripted model: decides the next step from the same bounded view Claude gets."""

DEFAULT_STEP_TIMEOUT_SECONDS = 120.0
"""How long one step's agent code (hooks, model call, tool) may take, unless the agent says."""
MIN_STEP_TIMEOUT_SECONDS = 0.1
MAX_STEP_TIMEOUT_SECONDS = 840.0
"""The longest step time limit an agent may set: a step Lambda's timeout (900 s at most) must
cover it plus the engine's own reads and writes, so a limit is always the engine's to enforce,
never Lambda's."""


MAX_CONCURRENT_RUNS = 10_000
"""The most `Agent.max_concurrent` (and a deployment's override) takes."""


def check_max_concurrent(value: object, what: str) -> int | None:
    """`value` if it is None or a whole number from 1 to `MAX_CONCURRENT_RUNS`; a
    `ValueError` starting with `what` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be a whole number of runs, not {value!r}")
    if not 1 <= value <= MAX_CONCURRENT_RUNS:
        raise ValueError(f"{what} must be from 1 to {MAX_CONCURRENT_RUNS:,}, not {value!r}")
    return value


def check_budget(value: object, what: str) -> float | None:
    """`value` if it is None or a number of dollars above 0 and at most `MAX_BUDGET_USD`; a
    `ValueError` starting with `what` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a number of US dollars, not {value!r}")
    if not 0 < value <= MAX_BUDGET_USD:
        raise ValueError(
            f"{what} must be above $0 and at most ${MAX_BUDGET_USD:,.0f}, not {value!r}"
        )
    return float(value)


def check_day(value: str | None, what: str) -> str | None:
    """`value` if it is None or a UTC day as `YYYY-MM-DD` (a daily budget's day)."""
    if value is None:
        return None
    try:
        if len(value) == 10:
            return date.fromisoformat(value).isoformat()
    except ValueError:
        pass
    raise ValueError(f"{what}: {value!r} is not a day (YYYY-MM-DD)")


def check_budget_tokens(value: object, what: str) -> int | None:
    """`value` if it is None or a whole number of tokens from 1 to `MAX_BUDGET_TOKENS`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be a whole number of tokens, not {value!r}")
    if not 1 <= value <= MAX_BUDGET_TOKENS:
        raise ValueError(f"{what} must be from 1 to {MAX_BUDGET_TOKENS:,}, not {value!r}")
    return value


@dataclass(frozen=True)
class Agent:
    """Everything Ratchet needs to run one kind of agent.

    `goal` is the default goal, formatted with the run's `params` (`--goal` overrides it).
    `resources(ctx)` opens what the tools need once per process and run (an `async def` hook
    is awaited on the process's event loop, where async tools run); `prepare(ctx)` runs
    once when the run is started (it must be idempotent); `verify(ctx)` returns the agent's
    invariants for the run as a dict with at least `ok`.

    `fork(source, fork, step)` gives a fork (`ratchet fork`, `Client.fork`, `POST
    /runs/{id}/fork`) the data its state depends on: a fork starts with its source's state as
    of `step` (what was done, and what the model was told), so its data must hold what the
    source's held after that step, and nothing the source did later. The hook gets the
    source's context and the fork's, and copies or rebuilds the fork's data (it runs before
    the fork's first checkpoint is written, then `prepare` runs for the fork as for any new
    run); or it raises `ForkRefused` with a reason, and the fork is refused with nothing
    written. Without the hook, a fork's data is whatever `prepare` makes for it: right for an
    agent whose tools keep no data of their own, wrong for one whose later steps rely on
    effects of earlier ones.

    `input` is the run's input as a pydantic model: validated when the run starts (the CLI's
    `--input`/`--param`, the API's and the Python client's `input`), its fields become the run's
    `params` (and fill the goal's placeholders). Without one, an agent takes no input.
    `needs_local_disk` says the agent keeps what must last in `RunContext.workdir`: such an
    agent runs locally only, and the AWS runtime refuses to start it.

    `step_timeout_seconds` bounds each step's agent code: the engine runs the hooks, the model
    call and the tool on a thread of its own (one per calling thread, reused step after step,
    so open thread-bound handles such as SQLite connections in `resources`, not beforehand).
    A step over the limit is abandoned and recorded as a failed attempt; its late result is
    discarded. The abandoned call cannot be stopped and may still act, so in the process that
    abandoned it the run's next attempt waits for it to end (within its own limit) before
    running the agent's code again, and the run is not marked failed while it runs (a worker
    stops instead, keeping the run's lease, and the process's end ends the call). Across
    processes only the idempotency key guards a tool. An `async def` tool is different: it
    runs on the process's event loop, and over the limit it is cancelled; once it has ended
    (within a second of the cancellation) nothing is fenced and the next attempt may run at
    once, with the same resources. `None` sets no limit.
    """

    name: str
    tools: Sequence[Tool[Any]]
    goal: str = ""
    policy: Policy | None = None
    default_params: Mapping[str, Any] = field(default_factory=dict)
    resources: Callable[[RunContext], Any] | Callable[[RunContext], Awaitable[Any]] | None = None
    prepare: Callable[[RunContext], None] | None = None
    verify: Callable[[RunContext, RunState], dict[str, Any]] | None = None
    fork: Callable[[RunContext, RunContext, int], None] | None = None
    step_timeout_seconds: float | None = DEFAULT_STEP_TIMEOUT_SECONDS
    input: type[BaseModel] | None = None
    needs_local_disk: bool = False
    instructions: str = ""
    """Standing instructions for the model: sent as the system prompt (the step prompt stays
    the user turn, byte for byte)."""
    max_tokens: int = 1024
    temperature: float | None = None
    model_retry_seconds: float = 60.0
    """How long one attempt may spend waiting out a provider's transient errors (rate limits,
    overload, timeouts) before the attempt counts as failed."""
    memory_window: int = RECENT_STEPS
    """Completed steps the model sees in full. Older steps are folded into a per-tool digest,
    or, with `model_summary`, into a summary the model writes (`memory_window` steps at a
    time, so the window holds between `memory_window` and twice that)."""
    model_summary: bool = False
    remember: bool = True
    """Offer the model the runtime's `remember` tool, which pins a fact (at most
    `MAX_FACT_CHARS` characters, `MAX_PINNED_FACTS` facts) into every later prompt."""
    sleep: bool = True
    """Offer the model the runtime's `sleep` tool: park the run for 1 s to a year (or until
    a time), at no cost while it sleeps."""
    events: Sequence[str] | None = None
    """The names of the events this agent's runs wait for. When given, an event of another
    name sent to a run is refused (404) instead of kept in its mailbox, where no wait would
    ever read it, and each name declared keeps a room of its own there (`MAX_MAILBOX_EVENTS`
    pending events), even before a run waits for it."""
    mcp: Sequence[McpServer] = ()
    """MCP servers whose tools this agent takes beside `tools`: listed when a run starts and
    pinned in its data (see `McpServer`; the `mcp` extra, `ratchet-agents[mcp]`)."""
    max_concurrent: int | None = None
    """At most this many runs of the agent work a step at the same time (on one store or
    deployment); the others wait their turn, without failing and without a model call. None
    sets no bound. A deployment may override it (`RATCHET_MAX_CONCURRENT`): see
    docs/limits.md."""
    max_concurrent_per_key: int | None = None
    """At most this many runs of the agent started with one `concurrency_key` (a tenant, a
    customer) work a step at the same time, on top of `max_concurrent`: one key's burst
    leaves the other keys their turns. Runs started without a key are not bounded by it.
    None sets no bound (docs/limits.md)."""
    max_cost_usd: float | None = None
    """Each run's budget in US dollars (a start's `budget_usd` overrides it), from its model
    calls' recorded usage at the prices Ratchet knows (`ratchet.pricing`): before every model
    call the most it can cost is reserved against what is left, and when it would not fit the
    run waits for a person to raise the budget. None sets no bound. See docs/limits.md."""
    max_tokens_total: int | None = None
    """Each run's budget in tokens (input and output), for a model without a price; held like
    `max_cost_usd`. None sets no bound."""
    max_cost_usd_per_day: float | None = None
    """What all the agent's runs together may spend on model calls each UTC day, in US
    dollars, on every worker of a store or deployment: one counter per agent and day, held
    like `max_cost_usd` (reserved before each call, settled after). A run that finds the day's
    budget spent waits, holding no process, until the next day or until a person raises it
    (`ratchet budget raise`). None sets no bound. See docs/limits.md."""
    webhooks: Sequence[str] = ()
    """URLs each change of a run's status is POSTed to, signed, beside the deployment's
    (`RATCHET_WEBHOOKS`): locally, by the webhook sender of a worker, `ratchet serve` or
    `ratchet run` (docs/following-runs.md). Checked here, by the deployment's rule: http or
    https with a host, no user or password, no link-local address."""

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"agent {self.name!r} has duplicate tool names: {sorted(duplicates)}")
        servers = [server.name for server in self.mcp]
        if len(set(servers)) != len(servers):
            raise ValueError(
                f"agent {self.name!r} has two MCP servers named alike ({sorted(servers)}): "
                "give each McpServer a name="
            )
        limit = self.step_timeout_seconds
        if limit is not None and not (
            isinstance(limit, int | float)
            and not isinstance(limit, bool)
            and math.isfinite(limit)
            and MIN_STEP_TIMEOUT_SECONDS <= limit <= MAX_STEP_TIMEOUT_SECONDS
        ):
            raise ValueError(
                f"agent {self.name!r}: step_timeout_seconds must be a number of seconds from "
                f"{MIN_STEP_TIMEOUT_SECONDS:g} to {MAX_STEP_TIMEOUT_SECONDS:g}, not {limit!r}"
            )

        check_max_concurrent(self.max_concurrent, f"agent {self.name!r}: max_concurrent")
        check_max_concurrent(
            self.max_concurrent_per_key, f"agent {self.name!r}: max_concurrent_per_key"
        )
        check_budget(self.max_cost_usd, f"agent {self.name!r}: max_cost_usd")
        check_budget_tokens(self.max_tokens_total, f"agent {self.name!r}: max_tokens_total")
        check_budget(self.max_cost_usd_per_day, f"agent {self.name!r}: max_cost_usd_per_day")
        if isinstance(self.webhooks, str):
            raise ValueError(f"agent {self.name!r}: webhooks must be a list of URLs, not one")
        urls: dict[str, None] = {}
        for url in self.webhooks:
            if not isinstance(url, str):
                raise ValueError(f"agent {self.name!r}: a webhook is a URL, not {url!r}")
            try:
                urls[check_webhook_url(url)] = None
            except InvalidInput as refused:
                raise ValueError(f"agent {self.name!r}: {refused}") from None
        object.__setattr__(self, "webhooks", tuple(urls))
        window = self.memory_window
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= 50:
            raise ValueError(
                f"agent {self.name!r}: memory_window must be a whole number of steps from 1 to "
                f"50, not {window!r}"
            )

    def tool_named(self, name: str) -> Tool[Any] | None:
        return next((t for t in self.tools if t.name == name), None)

    def params_for(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The run's params from the input it was started with: validated by the agent's
        `input` model (a `pydantic.ValidationError` names the field at fault), its defaults
        filled in. An agent without one takes its `default_params`, and no input beyond their
        names (a `ValueError` names the first unknown one)."""
        if self.input is not None:
            self._refuse_unknown_input(self.input, given)
            return self.input.model_validate(dict(given)).model_dump(mode="json")
        unknown = sorted(set(given) - set(self.default_params))
        if unknown:
            raise ValueError(
                f"agent {self.name!r} takes no input {unknown[0]!r}"
                + (
                    f" (it takes: {', '.join(sorted(self.default_params))})"
                    if self.default_params
                    else ""
                )
            )
        return {**self.default_params, **given}

    def _refuse_unknown_input(self, model: type[BaseModel], given: Mapping[str, Any]) -> None:
        """A field the input model does not have would be dropped without a word (pydantic's
        default): refused instead, as a misspelt `--param` is a mistake. A model that says
        what to do with extras (`extra="ignore"`, `"allow"`, `"forbid"`) decides itself."""
        if model.model_config.get("extra") is not None:
            return
        known = set(model.model_fields) | {
            f.alias for f in model.model_fields.values() if f.alias is not None
        }
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(
                f"agent {self.name!r} takes no input {unknown[0]!r} "
                f"(it takes: {', '.join(sorted(model.model_fields))})"
            )

    def goal_for(self, params: Mapping[str, Any]) -> str:
        return self.goal.format(**{**self.default_params, **params})
