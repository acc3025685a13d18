"""How many runs of an agent may work a step at the same time.

An agent says it (`Agent.max_concurrent`); a deployment may override it by agent name with
`RATCHET_MAX_CONCURRENT`, a JSON object such as `{"support": 5}` (the local worker's
environment, or the stack's `max_concurrent`). Locally a worker's lease on a run is the run's
slot: a claim takes a run only while fewer runs of its agent are under a live lease than the
bound, in the same write transaction, so a SIGKILLed worker's slot frees when its lease
lapses. On AWS a step takes a slot item with a conditional write before its work and gives it
back after its commit (`ratchet.ports.Slots`). docs/limits.md says what each costs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from ratchet.agents import AgentRegistry
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
    """`RATCHET_MAX_CONCURRENT`'s bounds by agent name; `ValueError` naming what is wrong."""
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


@dataclass
class ConcurrencyLimits:
    """The bound of each agent's runs, by the reference a run stores: the override for the
    agent's name if there is one, else its `max_concurrent`. An agent that cannot be loaded
    has none here (its step fails, saying why, as it would without a bound)."""

    registry: AgentRegistry
    overrides: Mapping[str, int] = field(default_factory=dict)
    _known: dict[str, int | None] = field(default_factory=dict, init=False, repr=False)

    def __call__(self, reference: str) -> int | None:
        if reference not in self._known:
            try:
                agent = self.registry.load(reference)
            except Exception:
                return None  # not remembered: a module fixed meanwhile is read again
            self._known[reference] = self.overrides.get(agent.name, agent.max_concurrent)
        return self._known[reference]
