"""The bound on an agent's concurrent runs: what `Agent(max_concurrent=)` and
`RATCHET_MAX_CONCURRENT` take, the agent each override's key names, and the bound a worker
reads for a run's stored agent: the agent's, under its name, whatever reference the run stores."""

from __future__ import annotations

import pytest

from ratchet.agents import AgentRegistry
from ratchet.errors import InvalidInput
from ratchet.limits import ConcurrencyLimits, resolve_overrides
from ratchet.ports import ConcurrencyBound
from ratchet.runtime.local import LocalSettings
from ratchet.tools import Agent
from tests.bounded_agent import AGENT, KEYED, TWO

ALIAS = "tests.bounded_alias:two"
"""`TWO` under another import path (`tests.bounded_alias` re-exports it)."""


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
    ("value", "said"),
    [
        (0, "max_concurrent_per_key must be from 1 to 10,000, not 0"),
        (True, "max_concurrent_per_key must be a whole number of runs, not True"),
        ("2", "max_concurrent_per_key must be a whole number of runs, not '2'"),
    ],
)
def test_an_agent_refuses_a_bound_per_key_that_is_not_a_number_of_runs(value, said):
    with pytest.raises(ValueError, match=r"^agent 'a': ") as refused:
        Agent(name="a", tools=[], max_concurrent_per_key=value)
    assert str(refused.value).endswith(said)


def test_an_agent_bounded_per_key_only_has_a_bound_and_one_with_neither_none():
    limits = ConcurrencyLimits(AgentRegistry.local())

    bound = limits(KEYED)
    assert bound == ConcurrencyBound("bounded-keyed", None, per_key=2)
    assert bound.key_slots("acme") == "bounded-keyed#key#acme"
    assert limits("tests.integration.aws.agents:heldout") is None


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
    assert ConcurrencyLimits(registry)(AGENT) == ConcurrencyBound("bounded", 3)
    assert ConcurrencyLimits(registry, {"bounded": 7})(AGENT) == ConcurrencyBound("bounded", 7)
    assert ConcurrencyLimits(registry, {"other": 7})(AGENT) == ConcurrencyBound("bounded", 3)
    assert ConcurrencyLimits(registry)("migration") is None  # no bound of its own
    assert ConcurrencyLimits(registry)("no.such.module:agent") is None


def test_every_reference_to_an_agent_has_the_agents_bound_under_its_name():
    limits = ConcurrencyLimits(AgentRegistry.local())
    assert limits(TWO) == limits("tests.bounded_alias:two") == ConcurrencyBound("bounded-two", 2)


@pytest.mark.parametrize(
    ("registry", "key"),
    [
        (AgentRegistry.local(), TWO),
        (AgentRegistry.local(), "tests.bounded_alias:two"),
        (AgentRegistry().with_agents({"by-name": "tests.bounded_alias:two"}), "by-name"),
        (AgentRegistry().with_agents({"by-name": "tests.bounded_alias:two"}), ALIAS),
    ],
)
def test_an_override_applies_to_the_agent_its_key_names(registry, key):
    overrides = resolve_overrides({key: 1}, registry)
    assert overrides == {"bounded-two": 1}
    assert ConcurrencyLimits(AgentRegistry.local(), overrides)(TWO) == ConcurrencyBound(
        "bounded-two", 1
    )


@pytest.mark.parametrize(
    ("registry", "overrides", "said"),
    [
        (
            AgentRegistry.local(),
            {"bounded-two": 1},
            "RATCHET_MAX_CONCURRENT: 'bounded-two' names no agent: use its module:attr, as a "
            "run is started by it, or one of migration, notebook",
        ),
        (
            AgentRegistry.local(),
            {"tests.bounded_agent:nothing": 1},
            "RATCHET_MAX_CONCURRENT: 'tests.bounded_agent:nothing' names no agent: ",
        ),
        (
            AgentRegistry.deployment('{"support": "tests.bounded_agent:two"}'),
            {"bounded-two": 1},
            "RATCHET_MAX_CONCURRENT: 'bounded-two' names no agent: use a name this deployment "
            "registers (migration, notebook, support)",
        ),
        (
            AgentRegistry.deployment('{"support": "tests.bounded_agent:two"}'),
            {"support": 1, TWO: 2},
            "RATCHET_MAX_CONCURRENT: 'support' and 'tests.bounded_agent:two' name one agent "
            "('bounded-two'): give it one bound",
        ),
        (
            AgentRegistry.local(),
            {TWO: 1, ALIAS: 1},
            "name one agent ('bounded-two')",
        ),
    ],
)
def test_an_override_that_names_no_agent_or_one_twice_is_one_line(registry, overrides, said):
    with pytest.raises(InvalidInput) as refused:
        resolve_overrides(overrides, registry)
    assert said in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("text", ["0", "-5", "1000001", "many"])
def test_a_bad_requests_per_minute_is_one_line_naming_the_setting(text):
    with pytest.raises(InvalidInput, match=r"^RATCHET_REQUESTS_PER_MINUTE is not valid: "):
        LocalSettings.from_env({"RATCHET_REQUESTS_PER_MINUTE": text})
    assert LocalSettings.from_env({"RATCHET_REQUESTS_PER_MINUTE": "50"}).requests_per_minute == 50
