"""The bound on an agent's concurrent runs: what `Agent(max_concurrent=)` and
`RATCHET_MAX_CONCURRENT` take, and the bound a worker reads for a run's stored agent."""

from __future__ import annotations

import pytest

from ratchet.agents import AgentRegistry
from ratchet.errors import InvalidInput
from ratchet.limits import ConcurrencyLimits, parse_overrides
from ratchet.runtime.local import LocalSettings
from ratchet.tools import Agent
from tests.bounded_agent import AGENT


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (0, "max_concurrent must be from 1 to 10,000, not 0"),
        (-1, "max_concurrent must be from 1 to 10,000, not -1"),
        (10_001, "max_concurrent must be from 1 to 10,000, not 10001"),
        (True, "max_concurrent must be a whole number of runs, not True"),
        (2.5, "max_concurrent must be a whole number of runs, not 2.5"),
    ],
)
def test_an_agent_refuses_a_bound_that_is_not_a_number_of_runs(value, said):
    with pytest.raises(ValueError, match=r"^agent 'a': ") as refused:
        Agent(name="a", tools=[], max_concurrent=value)
    assert str(refused.value).endswith(said)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{", "RATCHET_MAX_CONCURRENT is not valid: RATCHET_MAX_CONCURRENT is not JSON"),
        ("[3]", "must be a JSON object"),
        ('{"bounded": 0}', "RATCHET_MAX_CONCURRENT['bounded'] must be from 1 to 10,000, not 0"),
        ('{"bounded": null}', "RATCHET_MAX_CONCURRENT['bounded'] must be a whole number"),
        ('{"bounded": "3"}', "must be a whole number of runs, not '3'"),
    ],
)
def test_a_bad_override_is_one_line_naming_the_setting(text, said):
    with pytest.raises(InvalidInput) as refused:
        LocalSettings.from_env({"RATCHET_MAX_CONCURRENT": text})
    assert said in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_override_for_an_agents_name_wins_over_its_own_bound():
    registry = AgentRegistry.local()
    assert ConcurrencyLimits(registry)(AGENT) == 3
    assert ConcurrencyLimits(registry, parse_overrides('{"bounded": 7}'))(AGENT) == 7
    assert ConcurrencyLimits(registry, parse_overrides('{"other": 7}'))(AGENT) == 3
    assert ConcurrencyLimits(registry)("migration") is None  # no bound of its own
    assert ConcurrencyLimits(registry)("no.such.module:agent") is None


@pytest.mark.parametrize("text", ["0", "-5", "1000001", "many"])
def test_a_bad_requests_per_minute_is_one_line_naming_the_setting(text):
    with pytest.raises(InvalidInput, match=r"^RATCHET_REQUESTS_PER_MINUTE is not valid: "):
        LocalSettings.from_env({"RATCHET_REQUESTS_PER_MINUTE": text})
    assert LocalSettings.from_env({"RATCHET_REQUESTS_PER_MINUTE": "50"}).requests_per_minute == 50
