"""What it takes to start a run, checked once for every entry point (the CLI and the API).

`new_run` validates a request completely before anything touches a store, so a bad request
changes nothing wherever it arrives, and both entry points refuse it with the same words.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from ratchet.adapters.scripted import ScriptedModel
from ratchet.engine.core import Binding
from ratchet.errors import AgentNotFound, InvalidInput
from ratchet.ports import Model
from ratchet.scenarios import load_agent
from ratchet.state import MAX_GOAL_BYTES, RUN_ID_PATTERN, RunOptions, RunState
from ratchet.tools import Agent, RunContext

SCRIPTED = "scripted"
"""The model name of an agent's own scripted policy (offline, no API key)."""

DEFAULT_CLAUDE_MODEL = "claude-sonnet-4-5"
DEFAULT_AGENT = "notebook"
"""The agent of a run started with a goal only."""


class RunRequest(BaseModel):
    """A request to start a run. Field names are the API's JSON body; the CLI's options map
    one to one (`--agent` is `agent`, `--run-id` is `run_id`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str | None = None
    scenario: str | None = None
    agent: str | None = None
    goal: str | None = None
    model: str | None = None
    max_steps: int | None = Field(default=None, ge=1)
    batches: int | None = Field(default=None, ge=1)
    tool_latency_ms: int | None = Field(default=None, ge=0)


def check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.fullmatch(run_id):
        raise InvalidInput(
            f"malformed run id {run_id!r}: use 1-128 letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit"
        )
    return run_id


def check_model(agent: Agent, model: str, *, has_anthropic_key: bool) -> None:
    """Refuse now, not in a step later, a model the run could never use."""
    if model == SCRIPTED:
        if agent.policy is None:
            raise AgentNotFound(
                f"agent {agent.name!r} has no scripted policy; run it with --model "
                "<claude model> and ANTHROPIC_API_KEY set"
            )
    elif not has_anthropic_key:
        raise InvalidInput(f"--model {model} needs ANTHROPIC_API_KEY in the environment")


def new_run(request: RunRequest, *, has_anthropic_key: bool) -> RunState:
    """The initial state of the run `request` asks for, or `InvalidInput`/`AgentNotFound`
    saying what is wrong with it. Loads the agent (importing an `--agent` module) but writes
    nothing."""
    if request.scenario and request.agent:
        raise InvalidInput("give --scenario or --agent, not both")
    goal = request.goal
    if goal is None and request.scenario is None and request.agent is None:
        raise InvalidInput("give --goal TEXT or --scenario NAME (or --agent module:attr)")
    if goal is not None:
        if not goal.strip():
            raise InvalidInput("the goal is empty")
        if len(goal.encode("utf-8")) > MAX_GOAL_BYTES:
            raise InvalidInput(f"the goal is over {MAX_GOAL_BYTES // 1024} KB")
    reference = request.agent or request.scenario or DEFAULT_AGENT
    agent = load_agent(reference)
    model = request.model or (DEFAULT_CLAUDE_MODEL if has_anthropic_key else SCRIPTED)
    params: dict[str, Any] = dict(agent.default_params)
    if request.batches is not None:
        params["batches"] = request.batches
    try:
        options = RunOptions(
            model=model,
            max_steps=request.max_steps
            if request.max_steps is not None
            else RunOptions().max_steps,
            tool_latency_ms=request.tool_latency_ms or 0,
            params=params,
        )
    except ValueError as error:
        raise InvalidInput(f"bad option: {error}") from None
    check_model(agent, model, has_anthropic_key=has_anthropic_key)
    if goal is None and not agent.goal:
        raise InvalidInput(f"agent {agent.name!r} has no default goal: give --goal TEXT")
    run_id = request.run_id
    return RunState(
        run_id=check_run_id(run_id) if run_id is not None else f"run-{uuid.uuid4().hex[:12]}",
        agent=reference,
        goal=goal if goal is not None else agent.goal_for(params),
        options=options,
    )


def build_model(
    agent: Agent,
    model: str,
    *,
    anthropic_api_key: SecretStr | None,
    anthropic_base_url: str | None = None,
) -> Model:
    """The model a run asked for: its agent's scripted policy, or Claude."""
    check_model(agent, model, has_anthropic_key=anthropic_api_key is not None)
    if model == SCRIPTED:
        assert agent.policy is not None
        return ScriptedModel(agent.policy)
    assert anthropic_api_key is not None
    from ratchet.adapters.anthropic_model import AnthropicModel, anthropic_client

    client = anthropic_client(anthropic_api_key.get_secret_value(), base_url=anthropic_base_url)
    return AnthropicModel(client, model)


class Bindings:
    """Each run's agent, model and opened resources, built once per process and run.

    A runtime hands this to the engine as its binder. At most `limit` runs are kept: a Lambda
    container serves many runs over its life, and each binding may hold open resources.
    """

    def __init__(
        self,
        context: Callable[[str, RunOptions], RunContext],
        *,
        anthropic_api_key: SecretStr | None,
        anthropic_base_url: str | None = None,
        limit: int = 64,
    ) -> None:
        self._context = context
        self._api_key = anthropic_api_key
        self._base_url = anthropic_base_url
        self._limit = limit
        self._bound: dict[str, Binding] = {}

    def __call__(self, state: RunState) -> Binding:
        binding = self._bound.get(state.run_id)
        if binding is None:
            agent = load_agent(state.agent)
            context = self._context(state.run_id, state.options)
            resources = agent.resources(context) if agent.resources else None
            model = build_model(
                agent,
                state.options.model,
                anthropic_api_key=self._api_key,
                anthropic_base_url=self._base_url,
            )
            if len(self._bound) >= self._limit:
                self._bound.pop(next(iter(self._bound)))
            binding = self._bound[state.run_id] = Binding(agent, model, resources)
        return binding
