"""Each run's model, chosen by its name and built once per process and run (`Bindings`, the
binder every runtime hands its engine).

The Claude adapters (and so the anthropic SDK) are imported only when a run names Claude: the
base install runs scripted and `module:attr` models without them.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import SecretStr

from ratchet.adapters.scripted import ScriptedModel
from ratchet.agents import LOCAL, AgentRegistry
from ratchet.engine import Binding
from ratchet.engine.deadline import await_on_loop
from ratchet.errors import AgentNotFound, AgentUnloadable, InvalidInput
from ratchet.model_names import (
    BEDROCK_PREFIX,
    MODEL_NAMES,
    ModelKind,
    load_model,
    model_kind,
)
from ratchet.ports import Model
from ratchet.state import RunOptions, RunState
from ratchet.tools import Agent, RunContext

if TYPE_CHECKING:
    from ratchet.adapters.anthropic_model import Pacing


def check_model(agent: Agent, model: str, *, has_anthropic_key: bool) -> None:
    """Refuse a model the run could never use (when its step binds the agent: a run
    created before its deployment lost the key)."""
    kind = model_kind(model)
    if kind is None:
        raise InvalidInput(f"unknown model {model!r}: {MODEL_NAMES}")
    if kind is ModelKind.SCRIPTED:
        if agent.policy is None:
            raise AgentNotFound(
                f"agent {agent.name!r} has no scripted policy; run it with a Claude model and "
                "an Anthropic API key"
            )
    elif kind is ModelKind.ANTHROPIC and not has_anthropic_key:
        raise InvalidInput(
            f"model {model!r} needs an Anthropic API key: ANTHROPIC_API_KEY locally, the "
            "stack's Anthropic secret on AWS"
        )


def build_model(
    agent: Agent,
    model: str,
    *,
    anthropic_api_key: SecretStr | None,
    anthropic_base_url: str | None = None,
    bedrock_base_url: str | None = None,
    pacing: Pacing | None = None,
) -> Model:
    """The model a run asked for: its agent's scripted policy, Claude on the Anthropic API
    or on Bedrock, or the user's own `Model` (`module:attr`). `pacing` replaces the Claude
    adapters' clock and sleep (tests)."""
    check_model(agent, model, has_anthropic_key=anthropic_api_key is not None)
    kind = model_kind(model)
    if kind is ModelKind.SCRIPTED:
        assert agent.policy is not None
        return ScriptedModel(agent.policy)
    if kind is ModelKind.IMPORTED:
        return load_model(model)
    from ratchet.adapters.anthropic_model import (
        SYSTEM_PACING,
        AnthropicModel,
        anthropic_client,
        bedrock_client,
    )

    if kind is ModelKind.BEDROCK:
        try:
            bedrock = bedrock_client(base_url=bedrock_base_url)
        except ValueError as error:  # no region: the SDK says which settings it tried
            raise InvalidInput(f"model {model!r}: {error}") from None
        model_id = model[len(BEDROCK_PREFIX) :]
        return AnthropicModel(bedrock, model_id, pacing=pacing or SYSTEM_PACING)
    assert anthropic_api_key is not None
    client = anthropic_client(anthropic_api_key.get_secret_value(), base_url=anthropic_base_url)
    return AnthropicModel(client, model, pacing=pacing or SYSTEM_PACING)


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
        agents: AgentRegistry = LOCAL,
    ) -> None:
        """`agents` resolves each run's stored agent: a built-in name, or the `module:attr`
        its start resolved (see `AgentRegistry.stored_reference`)."""
        self._context = context
        self._agents = agents
        self._api_key = anthropic_api_key
        self._base_url = anthropic_base_url
        self._limit = limit
        self._bound: dict[str, Binding] = {}
        self._lock = threading.Lock()

    def forget(self, run_id: str) -> None:
        """Drop the run's binding (after a timed-out step, whose thread may still use it);
        its resources are not closed here: the abandoned step may still hold them."""
        with self._lock:
            self._bound.pop(run_id, None)

    def __call__(self, state: RunState) -> Binding:
        # The lock keeps the book whole between a shared client's threads; the hooks run
        # outside it (two threads binding one run at once is left to the leases).
        with self._lock:
            binding = self._bound.get(state.run_id)
        if binding is None:
            try:
                agent = self._agents.load(state.agent)
            except AgentNotFound as missing:
                raise AgentUnloadable(state.run_id, state.agent, str(missing)) from None
            context = self._context(state.run_id, state.options)
            if agent.mcp:
                # The tools pinned when the run started, the same in every process.
                from ratchet.mcp import bind_tools

                agent = bind_tools(agent, context.data)
            resources = agent.resources(context) if agent.resources else None
            if inspect.isawaitable(resources):
                # An async hook: awaited on the process's event loop, where the run's async
                # tools run, so a client it opens (an `httpx.AsyncClient`) is on their loop.
                resources = await_on_loop(resources)
            model = build_model(
                agent,
                state.options.model,
                anthropic_api_key=self._api_key,
                anthropic_base_url=self._base_url,
            )
            binding = Binding(agent, model, resources)
            with self._lock:
                if len(self._bound) >= self._limit:
                    self._bound.pop(next(iter(self._bound)))
                self._bound[state.run_id] = binding
        return binding
