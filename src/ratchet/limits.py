"""How many runs of an agent, and of each of its keys, may work a step at the same time.

An agent says it (`Agent.max_concurrent`); a deployment may override it with
`RATCHET_MAX_CONCURRENT`, a JSON object such as `{"support": 5}` (the local worker's
environment, or the stack's `max_concurrent`). Locally a worker's lease on a run is the run's
slot: a claim takes a run only while fewer runs of its agent are under a live lease than the
bound, in the same write transaction, so a SIGKILLed worker's slot frees when its lease
lapses. On AWS a step takes a slot item with a conditional write before its work and gives it
back after its commit (`ratchet.ports.Slots`). docs/limits.md says what each costs.

A run may be started with a `concurrency_key` (a tenant, a customer) and an agent may say
`max_concurrent_per_key`: at most that many runs of one key work a step at once, on top of
`max_concurrent`. Locally a claim counts the live leases of the run's agent and key in the same
transaction; on AWS a step takes a slot of its key (`ConcurrencyBound.key_slots`) and then one
of its agent, giving the first back if the second is not free. Of the runs waiting, the one of
highest `priority` goes first, its priority growing with the time it has waited
(`ratchet.state.effective_priority`), so none waits forever while slots free up.

One identity per agent serves every bound: its name, `Agent.name`. A run records its agent
by a reference (an import path, or the target of a registered name), and two references may
load one agent (`pkg:agent` re-exporting `pkg.mod:agent`); counted by reference, such an agent
would have a bound per reference. An override's key names the agent as a run is started by it
(a name the deployment registers, its `module:attr`, a built-in scenario's name), and is
turned into the agent's name when the runtime starts (`resolve_overrides`): a key that names no
agent is refused then, rather than bounding nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from ratchet.agents import SCENARIOS, AgentRegistry
from ratchet.errors import AgentNotFound, InvalidInput
from ratchet.ports import ConcurrencyBound
from ratchet.tools import check_max_concurrent

MAX_CONCURRENT_ENV = "RATCHET_MAX_CONCURRENT"
MAX_REQUESTS_PER_MINUTE = 1_000_000
"""The most `requests_per_minute` takes: the deployment's model calls a minute, shared by all
its runs (`RATCHET_REQUESTS_PER_MINUTE`, the stack's `ratchet:requestsPerMinute`). Every step
counts as one (a step calls the model at most once, and a summary of old steps once more);
over it, a step waits for the next minute without using an attempt."""
DEFAULT_QUEUE_RETRY_SECONDS = 10
"""On AWS a queued step (no slot free) is tried again after 1 to this many seconds, at random
(`RATCHET_QUEUE_RETRY_SECONDS`, the stack's `ratchet:queueRetrySeconds`)."""


def parse_overrides(text: str | None) -> dict[str, int]:
    """`RATCHET_MAX_CONCURRENT`'s bounds by the key each agent is named by; `ValueError`
    naming what is wrong (whether each key names an agent is `resolve_overrides`'s to say)."""
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ValueError(f'{MAX_CONCURRENT_ENV} is not JSON: use {{"agent": 5}}') from None
    if not isinstance(parsed, dict):
        raise ValueError(f'{MAX_CONCURRENT_ENV} must be a JSON object: use {{"agent": 5}}')
    bounds: dict[str, int] = {}
    for name, bound in parsed.items():
        checked = check_max_concurrent(bound, f"{MAX_CONCURRENT_ENV}[{name!r}]")
        if checked is None:
            raise ValueError(f"{MAX_CONCURRENT_ENV}[{name!r}] must be a whole number of runs")
        bounds[name] = checked
    return bounds


def resolve_overrides(overrides: Mapping[str, int], names: AgentRegistry) -> dict[str, int]:
    """`RATCHET_MAX_CONCURRENT`'s bounds by the name of the agent each key names, as `names`
    resolves a run's agent (a name it registers, a registered `module:attr`, a built-in
    scenario, and where it takes them any import path). Loads each key's agent. `InvalidInput`,
    one line, if a key names no agent, or two keys name one: a key that named nothing would
    bound nothing, and two would leave the agent's bound to chance."""
    by_agent: dict[str, tuple[str, int]] = {}
    for key, bound in overrides.items():
        try:
            names.resolve(key)
        except AgentNotFound:
            raise InvalidInput(
                f"{MAX_CONCURRENT_ENV}: {key!r} names no agent: {_how_to_name(names)}"
            ) from None
        try:
            agent = names.load(key)
        except AgentNotFound as unloadable:
            raise InvalidInput(
                f"{MAX_CONCURRENT_ENV}: {key!r} names no agent: {unloadable}"
            ) from None
        if agent.name in by_agent:
            first = by_agent[agent.name][0]
            raise InvalidInput(
                f"{MAX_CONCURRENT_ENV}: {first!r} and {key!r} name one agent ({agent.name!r}): "
                "give it one bound"
            )
        by_agent[agent.name] = (key, bound)
    return {name: bound for name, (_, bound) in by_agent.items()}


def _how_to_name(names: AgentRegistry) -> str:
    """How an override may name an agent, for a key that named none."""
    if names.import_paths:
        return f"use its module:attr, as a run is started by it, or one of {', '.join(SCENARIOS)}"
    return f"use a name this deployment registers ({', '.join(names.names)})"


@dataclass
class ConcurrencyLimits:
    """The bound of each agent's runs, by the reference a run stores: the agent's name (the
    slots every reference to it shares) and the override for that name if there is one
    (`resolve_overrides`), else its `max_concurrent`. An agent that cannot be loaded has none
    here (its step fails, saying why, as it would without a bound)."""

    registry: AgentRegistry
    overrides: Mapping[str, int] = field(default_factory=dict)
    """By agent name (`Agent.name`), as `resolve_overrides` gives them."""
    _known: dict[str, ConcurrencyBound | None] = field(default_factory=dict, init=False, repr=False)

    def __call__(self, reference: str) -> ConcurrencyBound | None:
        if reference not in self._known:
            try:
                agent = self.registry.load(reference)
            except Exception:
                return None  # not remembered: a module fixed meanwhile is read again
            limit = self.overrides.get(agent.name, agent.max_concurrent)
            per_key = agent.max_concurrent_per_key
            self._known[reference] = (
                ConcurrencyBound(agent.name, limit, per_key)
                if limit is not None or per_key is not None
                else None
            )
        return self._known[reference]
