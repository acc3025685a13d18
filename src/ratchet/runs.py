"""What it takes to start a run, checked once for every entry point (the CLI and the API).

`new_run` validates a request completely before anything touches a store, so a bad request
changes nothing wherever it arrives. Its refusals (`RunRequestInvalid`) name the request's
fields, and each entry point says them in its own words: the API names JSON fields, the CLI
its flags.
"""

from __future__ import annotations

import importlib.util
import json
import uuid
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from ratchet.agents import LOCAL, AgentRegistry
from ratchet.errors import AgentNotFound, InvalidInput
from ratchet.model_names import (
    DEFAULT_CLAUDE_MODEL,
    MODEL_NAMES,
    SCRIPTED,
    ModelKind,
    load_model,
    model_kind,
)
from ratchet.state import (
    CONCURRENCY_KEY_PATTERN,
    MAX_BUDGET_USD,
    MAX_GOAL_BYTES,
    MAX_PRIORITY,
    MIN_PRIORITY,
    RUN_ID_PATTERN,
    Budget,
    ConcurrencyKey,
    NotifyTargets,
    RunOptions,
    RunState,
)
from ratchet.tools import Agent
from ratchet.untrusted import within_depth

DEFAULT_AGENT = "notebook"
"""The agent of a run started with a goal only."""

# --- what each number may be: the most the runtimes can honour ------------------------------

MAX_STEPS = 10_000
"""A run's step cap. Steps are cheap to store (one record each) and the AWS runtime rolls a
long run over into fresh executions, so this bounds cost, not capacity: a run that needs more
than 10,000 model calls is a runaway agent, not a workload."""

MAX_INPUT_BYTES = 16 * 1024
"""A run's input, as compact JSON: it rides in every head, so it stays small; bulk data belongs
in the agent's own store."""

MAX_TOOL_LATENCY_MS = 30_000
"""The artificial slowdown per tool call. A step on AWS must finish in the step function's
180 s: the model call may take up to 2 x 60 s (the Anthropic client's timeout, one retry),
and 30 s more leaves 30 s for a cold start, the tool itself and the commit."""

MAX_BATCHES = 500
"""The most batches a migration run may ask for (`batches`; the migration agent bounds its
`input.batches` with this too). Its `prepare` seeds every batch (one 27 KB item of 1,000 rows
each) inside the API's own request, which API Gateway cuts off at 29 s. On DynamoDB (moto, in
process) seeding takes ~4 ms a batch: 500 batches take ~2 s; on a real on-demand table they
are 13,500 write units, ~3.4 s at a new table's 4,000 units/s, so even throttled and retried
they fit well inside the function's 29 s. (1,000,000 batches, 27 GB, ran the function out of
time: a 502 and no run.)"""

MAX_NAME_CHARS = 200

NameText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)]
ModelName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:@/-]{0,199}$")]
"""What a model name may be: `scripted`, `claude-...`, `bedrock:<model id>` or `module:attr`."""


class RunRequest(BaseModel):
    """A request to start a run. Field names are the API's JSON body; the CLI's options map
    one to one (`--agent` is `agent`, `--run-id` is `run_id`; `notify` is the API's only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN.pattern)] | None = Field(
        default=None,
        description="A stable id: 1-128 letters, digits, '.', '_', ':' or '-'. The same "
        "request under it again changes nothing; another agent, goal or input is a 409.",
    )
    scenario: NameText | None = Field(
        default=None, description="A built-in agent: migration, notebook."
    )
    agent: NameText | None = Field(
        default=None,
        description="An agent the deployment registered, by name (locally, the CLI also "
        "takes module:attr).",
    )
    goal: str | None = Field(
        default=None,
        description="What the agent should do: at most 64 KB of UTF-8.",
        # Documented for schemas (so at most 64 Ki characters); `new_run` checks the bytes.
        json_schema_extra={"maxLength": MAX_GOAL_BYTES},
    )
    model: ModelName | None = Field(
        default=None,
        description="'scripted' (the agent's own policy, offline), a Claude model on the "
        "Anthropic API ('claude-sonnet-4-6'), or on Amazon Bedrock ('bedrock:<model id>'); "
        "locally also your own Model as module:attr. Default: the agent's scripted policy "
        "when it has one; else Claude when a key is configured.",
    )
    max_steps: int | None = Field(
        default=None, ge=1, le=MAX_STEPS, description="The step cap (default 60)."
    )
    input: Annotated[dict[str, Any] | None, BeforeValidator(within_depth)] = Field(
        default=None,
        description="The agent's input, checked against the input model it declares (at most "
        "16 KB of JSON); its fields become the run's params.",
    )
    batches: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BATCHES,
        description="Migration: 1,000-row batches to copy (the same as input.batches).",
    )
    tool_latency_ms: int | None = Field(
        default=None, ge=0, le=MAX_TOOL_LATENCY_MS, description="Slow every tool call down."
    )
    notify: NotifyTargets | None = Field(
        default=None,
        description="Who is asked when the run waits for a person; none: the deployment's "
        "default recipients.",
    )
    concurrency_key: ConcurrencyKey | None = Field(
        default=None,
        description="The tenant (a customer, ...) the run works for: 1-64 letters, digits, "
        "'.', '_', ':', '@' or '-'. At most the agent's max_concurrent_per_key runs of one key "
        "work a step at once.",
    )
    priority: int | None = Field(
        default=None,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="0 (the default) to 9: of the runs waiting for a slot, the higher goes "
        "first; a waiting run's priority grows by one every 30 s.",
    )
    budget_usd: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BUDGET_USD,
        allow_inf_nan=False,
        description="The run's budget in US dollars, above 0 and at most 10,000 (default: the "
        "agent's max_cost_usd): a model call that might pass it is not made, and the run waits "
        "for a person to raise it.",
    )


CLI_FLAGS: Mapping[str, str] = {
    "run_id": "--run-id",
    "scenario": "--scenario",
    "agent": "--agent",
    "goal": "--goal",
    "model": "--model",
    "max_steps": "--max-steps",
    "input": "--input/--param",
    "batches": "--batches",
    "tool_latency_ms": "--tool-latency-ms",
    "notify": "--notify/--notify-slack",
    "notify.email": "--notify",
    "notify.slack_channel": "--notify-slack",
    "concurrency_key": "--key",
    "priority": "--priority",
    "budget_usd": "--budget",
}
"""How the CLI spells each field of `RunRequest`."""


class RunRequestInvalid(InvalidInput):
    """A request to start a run, refused before anything was written.

    `message` says what is wrong without quoting what was sent and without naming any entry
    point's spelling; `fields` are the `RunRequest` fields at fault. `str()` is the API's
    wording; `for_cli()` the CLI's (flags, and its own text where the two differ)."""

    def __init__(self, message: str, *fields: str, cli: str | None = None) -> None:
        self.message = message
        self.fields = fields
        self._cli = cli
        noun = "field" if len(fields) == 1 else "fields"
        super().__init__(f"{message} ({noun} {', '.join(fields)})" if fields else message)

    def for_cli(self) -> str:
        if self._cli is not None:
            return self._cli
        flags = ", ".join(cli_flag(f) for f in self.fields)
        return f"{self.message} ({flags})" if flags else self.message


class RunConflict(RunRequestInvalid):
    """A start under the id of a run that exists with another agent, goal or input: the same
    request again changes nothing, a different one under a taken id is refused (409 in the
    API), naming what differs."""

    http_status = 409

    def __init__(self, run_id: str, *fields: str) -> None:
        differs = ", ".join(fields)
        super().__init__(
            f"run {run_id!r} exists with another {differs}: starting it again changes nothing "
            "only with the same request; choose another run id",
            *fields,
        )


def check_concurrency_key(key: str, name: str) -> str:
    """`key` if it is a concurrency key (`ratchet.state.CONCURRENCY_KEY_PATTERN`);
    `InvalidInput` naming it as `name` (a flag, a parameter) otherwise, in one line (`repr`
    escapes what a terminal would act on)."""
    if not CONCURRENCY_KEY_PATTERN.fullmatch(key):
        raise InvalidInput(
            f"{name}: {key!r} is not a concurrency key: use 1-64 letters, digits, '.', '_', "
            "':', '@' or '-'"
        )
    return key


def conflicting_fields(existing: RunState, wanted: RunState) -> tuple[str, ...]:
    """The request's fields in which `wanted` differs from the run that holds its id."""
    differs = []
    if existing.agent != wanted.agent:
        differs.append("agent")
    if existing.goal != wanted.goal:
        differs.append("goal")
    if existing.options.params != wanted.options.params:
        differs.append("input")
    if existing.concurrency_key != wanted.concurrency_key:
        differs.append("concurrency_key")
    if existing.priority != wanted.priority:
        differs.append("priority")
    return tuple(differs)


class AgentNotRunnable(RunRequestInvalid):
    """The agent cannot run on this runtime (it keeps its data on a local disk, and this is
    AWS): refused before the run starts, naming the request's `agent`."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "agent", cli=message)


class McpToolsUnavailable(RunRequestInvalid):
    """The agent's MCP tools could not be listed and pinned for the new run (a server down,
    a tool it was to take missing, two tools of one name): refused before anything was
    written, naming the request's `agent`."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "agent", cli=message)


class ModelNotGranted(RunRequestInvalid):
    """A Bedrock model this deployment's step function may not invoke: refused before the run
    starts (its first step would be denied), naming the request's `model`."""

    def __init__(self, granted: tuple[str, ...]) -> None:
        if granted:
            said = "this deployment may call only these Bedrock models: " + ", ".join(granted)
        else:
            said = "this deployment may call no Bedrock model"
        super().__init__(
            f"{said} (its operator grants more with the stack's ratchet:bedrockModels context)",
            "model",
        )


def cli_flag(field: str) -> str:
    """How the CLI spells a `RunRequest` field (or a field inside it, such as `input.batches`)."""
    if field.startswith("input."):
        return f"--param {field.removeprefix('input.')}"
    return CLI_FLAGS.get(field) or CLI_FLAGS.get(field.rsplit(".", 1)[0], field)


class NoAnthropicKey(RunRequestInvalid):
    """A Claude model was asked for where no Anthropic API key is configured."""

    def __init__(self, model: str) -> None:
        super().__init__(
            "this deployment has no Anthropic API key configured: use model 'scripted' "
            "(the agent's own policy), or ask its operator to configure a key",
            "model",
            cli=f"--model {model} needs ANTHROPIC_API_KEY in the environment",
        )


def check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.fullmatch(run_id):
        raise InvalidInput(
            f"malformed run id {run_id!r}: use 1-128 letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit"
        )
    return run_id


def request_problems(error: ValidationError) -> list[tuple[str, str]]:
    """(field, message) for each problem pydantic found, never the input it found it in."""
    return [
        (".".join(str(p) for p in e["loc"]) or "(body)", e["msg"].removeprefix("Value error, "))
        for e in error.errors(include_url=False, include_input=False)
    ]


def new_run(
    request: RunRequest, *, has_anthropic_key: bool, agents: AgentRegistry = LOCAL
) -> RunState:
    """The initial state of the run `request` asks for, or `RunRequestInvalid` saying what is
    wrong with it. `agents` says which agents may be named; nothing is imported unless it
    allows the reference. Loads the agent, but writes nothing."""
    if request.scenario and request.agent:
        raise RunRequestInvalid("give a scenario or an agent, not both", "scenario", "agent")
    goal = request.goal
    if goal is None and request.scenario is None and request.agent is None:
        raise RunRequestInvalid(
            "give a goal, a scenario or an agent",
            "goal",
            "scenario",
            "agent",
            cli="give --goal TEXT or --scenario NAME (or --agent module:attr)",
        )
    if goal is not None:
        if not goal.strip():
            raise RunRequestInvalid("the goal is empty", "goal")
        if len(goal.encode("utf-8")) > MAX_GOAL_BYTES:
            raise RunRequestInvalid(f"the goal is over {MAX_GOAL_BYTES // 1024} KB", "goal")
    field = "agent" if request.agent else "scenario"
    reference = request.agent or request.scenario or DEFAULT_AGENT
    # A scenario is a built-in agent; the CLI has always taken either field for either.
    if field == "scenario" and not agents.import_paths:
        agents = AgentRegistry(models=agents.models)
    try:
        stored = agents.stored_reference(reference)
    except AgentNotFound as unknown:
        known = ", ".join(agents.names)
        raise RunRequestInvalid(
            f"unknown {field}: use one of {known}", field, cli=str(unknown)
        ) from None
    try:
        agent = agents.load(stored)
    except AgentNotFound as unloadable:
        if not agents.import_paths:
            raise  # a registered agent that does not load: the deployment's fault, not the caller's
        raise RunRequestInvalid(str(unloadable), field, cli=str(unloadable)) from None
    model = request.model or default_model(agent, has_anthropic_key=has_anthropic_key)
    # A model the deployment registers is named like an agent; the run records its target.
    model = agents.models.get(model, model)
    _check_model_request(agent, model, has_anthropic_key=has_anthropic_key, agents=agents)
    params = _params(agent, request)
    try:
        options = RunOptions(
            model=model,
            max_steps=request.max_steps
            if request.max_steps is not None
            else RunOptions().max_steps,
            tool_latency_ms=request.tool_latency_ms or 0,
            params=params,
            notify=request.notify or NotifyTargets(),
            memory_window=agent.memory_window,
            model_summary=agent.model_summary,
        )
    except ValidationError as error:
        (where, what), *_ = request_problems(error)
        raise RunRequestInvalid(f"bad option {where}: {what}") from None
    if goal is None and not agent.goal:
        raise RunRequestInvalid("the agent has no default goal: give one", "goal")
    run_id = request.run_id
    return RunState(
        run_id=check_run_id(run_id) if run_id is not None else f"run-{uuid.uuid4().hex[:12]}",
        agent=stored,
        goal=goal if goal is not None else agent.goal_for(params),
        options=options,
        concurrency_key=request.concurrency_key,
        priority=request.priority if request.priority is not None else MIN_PRIORITY,
        budget=_budget(agent, request, model),
    )


def _budget(agent: Agent, request: RunRequest, model: str) -> Budget | None:
    """The run's budget: the start's `budget_usd`, else the agent's `max_cost_usd`, and the
    agent's `max_tokens_total`; None for no bound. A bound in dollars on a model without a
    price could never let a call through: refused, naming `budget_usd`."""
    from ratchet.engine.spending import price_of  # only for a run with a budget

    usd = request.budget_usd if request.budget_usd is not None else agent.max_cost_usd
    if usd is None and agent.max_tokens_total is None:
        return None
    if usd is not None and price_of(model) is None:
        raise RunRequestInvalid(
            f"model {model!r} has no price, so a budget in dollars cannot hold it: give it one "
            "in RATCHET_PRICES, or bound the run in tokens (Agent.max_tokens_total)",
            "budget_usd",
        )
    return Budget(usd=usd, tokens=agent.max_tokens_total)


def default_model(agent: Agent, *, has_anthropic_key: bool) -> str:
    """The model of a run that names none: the agent's own policy when it has one, so that a
    key in the environment never turns an offline run into a paid one unasked; Claude only
    for an agent that has nothing else (refused without a key, naming `model`)."""
    if agent.policy is not None or not has_anthropic_key:
        return SCRIPTED
    return DEFAULT_CLAUDE_MODEL


def _params(agent: Agent, request: RunRequest) -> dict[str, Any]:
    """The run's params: its input, checked against the agent's input model. `batches` is the
    older spelling of `input.batches`, still taken."""
    given: dict[str, Any] = dict(request.input or {})
    if request.batches is not None:
        if given.get("batches", request.batches) != request.batches:
            raise RunRequestInvalid("batches is given twice, differently", "batches", "input")
        given["batches"] = request.batches
    size = len(json.dumps(given, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > MAX_INPUT_BYTES:
        raise RunRequestInvalid(f"the input is over {MAX_INPUT_BYTES // 1024} KB", "input")
    legacy = request.batches is not None and not request.input
    try:
        return agent.params_for(given)
    except ValidationError as error:
        (where, what), *_ = request_problems(error)
        field = where if legacy and where == "batches" else f"input.{where}"
        raise RunRequestInvalid(f"bad input for agent {agent.name!r}: {what}", field) from None
    except ValueError as error:
        raise RunRequestInvalid(str(error), "batches" if legacy else "input") from None


def _check_model_request(
    agent: Agent, model: str, *, has_anthropic_key: bool, agents: AgentRegistry
) -> None:
    """`new_run`'s checks of the model, each naming the request's `model`."""
    kind = model_kind(model)
    if kind is None:
        raise RunRequestInvalid(f"unknown model: {MODEL_NAMES}", "model")
    if kind is ModelKind.SCRIPTED and agent.policy is None:
        raise RunRequestInvalid(
            "the agent has no scripted policy: name a Claude model",
            "model",
            cli=f"agent {agent.name!r} has no scripted policy; run it with --model "
            "<claude model> and ANTHROPIC_API_KEY set",
        )
    if kind is ModelKind.ANTHROPIC and not has_anthropic_key:
        raise NoAnthropicKey(model)
    if kind in (ModelKind.ANTHROPIC, ModelKind.BEDROCK):
        missing = [
            package
            for package in ("anthropic", "botocore")[: 2 if kind is ModelKind.BEDROCK else 1]
            if importlib.util.find_spec(package) is None
        ]
        if missing:
            extra = "anthropic,aws" if kind is ModelKind.BEDROCK else "anthropic"
            raise RunRequestInvalid(
                f"{'Bedrock' if kind is ModelKind.BEDROCK else 'Claude'} models need the "
                f"{' and '.join(missing)} package{'s' if len(missing) > 1 else ''}, which this "
                "installation lacks",
                "model",
                cli=f"--model {model} needs {' and '.join(missing)}: "
                f"pip install 'ratchet-agents[{extra}]'",
            )
    if kind is ModelKind.IMPORTED:
        # Importing runs the module's code: only where the person naming it runs code anyway,
        # as with agents, or a model the deployment registered by name.
        if not agents.import_paths and model not in agents.models.values():
            registered = ", ".join(sorted(agents.models))
            raise RunRequestInvalid(
                "this deployment takes no module:attr models: use 'scripted', 'claude-...', "
                "'bedrock:<model id>'"
                + (f" or a model it registers ({registered})" if registered else ""),
                "model",
            )
        try:
            load_model(model)
        except InvalidInput as error:
            raise RunRequestInvalid(str(error), "model", cli=f"--model {model}: {error}") from None
