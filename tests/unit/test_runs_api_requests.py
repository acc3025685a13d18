"""Starting a run, checked once for both entry points: the bounds, the words each entry point
uses, and which agents a request may name (deciding that imports nothing)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from ratchet.agents import AGENT_NAME, SCENARIOS, AgentRegistry
from ratchet.errors import AgentNotFound
from ratchet.imports import IMPORT_PATH
from ratchet.runs import (
    MAX_BATCHES,
    MAX_STEPS,
    MAX_TOOL_LATENCY_MS,
    NoAnthropicKey,
    RunRequest,
    RunRequestInvalid,
    new_run,
)
from ratchet.state import NotifyTargets

REGISTERED = {"notes": "ratchet.scenarios.notebook:agent"}
DEPLOYMENT = AgentRegistry.deployment(json.dumps(REGISTERED))


@pytest.fixture
def no_imports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fail loudly if the registry imports anything; record what it tried."""
    tried: list[str] = []

    def refuse(name: str, *args: Any, **kwargs: Any) -> Any:
        tried.append(name)
        raise AssertionError(f"imported {name}")

    monkeypatch.setattr("ratchet.imports.importlib.import_module", refuse)
    return tried


# --- bounds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "lowest", "highest"),
    [
        ("max_steps", 1, MAX_STEPS),
        ("batches", 1, MAX_BATCHES),
        ("tool_latency_ms", 0, MAX_TOOL_LATENCY_MS),
    ],
)
def test_each_number_is_accepted_up_to_its_bound_and_refused_past_it(
    field: str, lowest: int, highest: int
):
    for fine in (lowest, highest):
        assert getattr(RunRequest.model_validate({field: fine}), field) == fine
    for wrong in (lowest - 1, highest + 1):
        with pytest.raises(ValidationError) as refused:
            RunRequest.model_validate({field: wrong})
        assert [e["loc"] for e in refused.value.errors()] == [(field,)]


def test_the_bounds_fit_the_runtime():
    # The step function has 180 s: two 60 s model attempts plus the slowdown, with room left.
    assert 2 * 60 + MAX_TOOL_LATENCY_MS / 1000 <= 180 - 30
    # A migration of MAX_BATCHES batches needs that many steps and a few more.
    assert MAX_BATCHES + 10 <= MAX_STEPS


def test_the_recipients_a_request_names_are_the_runs():
    targets = {"email": ["ops@example.com"], "slack_channel": "#ops"}

    state = new_run(
        RunRequest.model_validate({"scenario": "migration", "notify": targets}),
        has_anthropic_key=False,
    )

    assert state.options.notify == NotifyTargets(email=["ops@example.com"], slack_channel="#ops")
    assert new_run(RunRequest(goal="g"), has_anthropic_key=False).options.notify.is_empty


# --- each entry point's words --------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_fields", "api", "cli"),
    [
        (
            {},
            "give a goal, a scenario or an agent (fields goal, scenario, agent)",
            "give --goal TEXT or --scenario NAME (or --agent module:attr)",
        ),
        (
            {"scenario": "migration", "agent": "notes"},
            "give a scenario or an agent, not both (fields scenario, agent)",
            "give a scenario or an agent, not both (--scenario, --agent)",
        ),
        ({"goal": " "}, "the goal is empty (field goal)", "the goal is empty (--goal)"),
        (
            {"scenario": "migration", "model": "claude-x"},
            "this deployment has no Anthropic API key configured: use model 'scripted' (the "
            "agent's own policy), or ask its operator to configure a key (field model)",
            "--model claude-x needs ANTHROPIC_API_KEY in the environment",
        ),
    ],
)
def test_a_refusal_names_json_fields_on_the_api_and_flags_on_the_cli(
    request_fields: dict[str, str], api: str, cli: str
):
    with pytest.raises(RunRequestInvalid) as refused:
        new_run(RunRequest.model_validate(request_fields), has_anthropic_key=False)

    assert (str(refused.value), refused.value.for_cli()) == (api, cli)


def test_a_missing_key_never_sends_an_api_caller_to_an_environment_variable():
    refusal = NoAnthropicKey("claude-sonnet-4-5")

    assert "ANTHROPIC_API_KEY" not in str(refusal)
    assert "claude-sonnet-4-5" not in str(refusal), "the API quotes nothing it was sent"
    assert refusal.fields == ("model",)


# --- which agents a request may name -------------------------------------------------------


@pytest.mark.parametrize(
    "reference",
    ["this:s", "os:system", "ratchet.scenarios.notebook:agent.__class__", "nope", "notes:x"],
)
def test_a_deployment_refuses_what_it_did_not_register_without_importing_it(
    no_imports: list[str], reference: str
):
    with pytest.raises(AgentNotFound, match="unknown agent: use one of migration, notebook, notes"):
        DEPLOYMENT.resolve(reference)

    assert no_imports == []


def test_an_unregistered_agent_in_a_request_imports_nothing(no_imports: list[str]):
    with pytest.raises(RunRequestInvalid) as refused:
        new_run(RunRequest(agent="this:s"), has_anthropic_key=False, agents=DEPLOYMENT)

    assert refused.value.fields == ("agent",)
    assert no_imports == []


def test_a_registered_name_is_stored_as_its_target_which_resolves_again():
    state = new_run(RunRequest(agent="notes"), has_anthropic_key=False, agents=DEPLOYMENT)

    assert state.agent == REGISTERED["notes"]
    assert DEPLOYMENT.load(state.agent).name == "notebook"
    assert AgentRegistry.local().load(state.agent).name == "notebook"


def test_a_built_in_scenario_is_stored_by_name_everywhere():
    for registry in (DEPLOYMENT, AgentRegistry(), AgentRegistry.local()):
        assert registry.stored_reference("migration") == "migration"


def test_a_scenario_is_a_built_in_agent_on_the_api(no_imports: list[str]):
    with pytest.raises(
        RunRequestInvalid, match=r"unknown scenario: use one of migration, notebook \("
    ):
        new_run(RunRequest(scenario="notes"), has_anthropic_key=False, agents=DEPLOYMENT)


def test_the_cli_still_takes_an_import_path(no_imports: list[str]):
    assert AgentRegistry.local().resolve("my_pkg.agents:billing") == "my_pkg.agents:billing"
    assert no_imports == []


@pytest.mark.parametrize(
    ("agents_json", "problem"),
    [
        ("{not json", "not JSON"),
        ('["a"]', "JSON object"),
        ('{"bad name!": "a:b"}', "not an agent name"),
        ('{"billing": "a b"}', "module:attr"),
        ('{"billing": 3}', "module:attr"),
        ('{"migration": "my.fork:agent"}', "built-in"),
    ],
)
def test_a_malformed_registry_is_the_deployers_error(agents_json: str, problem: str):
    with pytest.raises(ValueError, match="RATCHET_AGENTS") as refused:
        AgentRegistry.deployment(agents_json)

    assert problem in str(refused.value)


def test_an_empty_registry_is_the_built_in_scenarios():
    assert AgentRegistry.deployment(None).names == sorted(SCENARIOS)
    assert AgentRegistry.deployment("").names == sorted(SCENARIOS)


def test_the_stack_accepts_exactly_the_names_and_paths_the_registry_does():
    from ratchet.cdk import config

    assert AGENT_NAME.pattern == config.AGENT_NAME_PATTERN
    assert IMPORT_PATH.pattern == config.IMPORT_PATH_PATTERN
    assert set(config.BUILT_IN_AGENTS) == set(SCENARIOS), "a deployment may not shadow these"
