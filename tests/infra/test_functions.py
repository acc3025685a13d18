"""The functions: the handlers they name exist, they share one asset, and their environment is
exactly what `ratchet.runtime.aws_settings` reads, with and without the optional configuration."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from ratchet import sealing
from ratchet.cdk import contract, functions
from ratchet.cdk.bundling import ARCHITECTURE, RUNTIME
from ratchet.cdk.config import DeployConfig
from ratchet.cdk.workflow import AslDefinition
from ratchet.runtime.aws_settings import ENVIRONMENT, AwsSettings
from ratchet.waiting.wakes import SWEEP_EVERY_SECONDS, WAKE_GRACE_SECONDS
from tests.infra.queries import HANDLERS, environment, function_id, function_names
from tests.infra.synth import (
    ANTHROPIC_SECRET,
    ASL,
    CONFIGURED,
    REPO_ROOT,
    Synthesized,
    synthesize,
)

CORE_FUNCTIONS = {
    "sweep",
    "step",
    "notify",
    "decide",
    "mark_failed",
    "api",
    "approvals",
    "open_wait",
    "record_wait",
    "hooks",
    "status_events",
}
POWERTOOLS = {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_LOG_LEVEL"}

EVERY_FUNCTION = {
    "checkpoints_table",
    "idempotency_table",
    "app_table",
    "blob_bucket",
    "rollover_after",
    "approval_timeout_seconds",
    "checkpoint_retention_days",
}
"""Every handler builds `AwsSettings`, whose table names are required."""
UNCONFIGURED = {
    # Starts executions; decides approvals through the desk, which builds links.
    # ... and refuses at start a Bedrock model the step may not invoke (`[]`: none granted);
    # opens a run's webhook (POST /runs/{id}/hooks/{name}), whose secret derives from the key.
    "api": {
        "state_machine_arn",
        "public_url",
        "link_key_secret_arn",
        "hook_key_secret_arn",
        "bedrock_models",
    },
    # Signs links into the messages it sends.
    "notify": {"public_url", "link_key_secret_arn"},
    # Checks links, and builds the page's form on the same URL.
    "approvals": {"public_url", "link_key_secret_arn"},
    # Derives each hook's secret to check a delivery's signature.
    "hooks": {"hook_key_secret_arn"},
    # Waits this long at most before trying a step queued for its agent's slot again; starts
    # the executions of the child runs a step starts; takes at most so many steps an invocation.
    "step": {"queue_retry_seconds", "state_machine_arn", "max_steps_per_invocation"},
    # Restarts a sleeper whose waker died between the wake and the restart.
    "sweep": {"state_machine_arn"},
    # Puts each change of a run's status on the deployment's bus.
    "status_events": {"event_bus_name"},
}
"""Beyond `EVERY_FUNCTION`, with none of the optional context."""
CONFIGURED_ONLY = {
    "api": {"agents", "prices"},
    "step": {"agents", "max_concurrent", "requests_per_minute"},
    "notify": {
        "email_sender",
        "notify_emails",
        "notify_slack_channel",
        "slack_bot_token_secret_arn",
    },
    "approvals": {"slack_signing_secret_arn"},
}
"""Beyond those, with every optional key. `slack_api_url` is never set: Slack's own."""

KEY_ARN = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
SEALED = {**CONFIGURED, "ratchet:kmsKeyArn": KEY_ARN, "ratchet:payloadEncryption": "true"}
"""Every optional key, and payloads sealed with a key of the deployer's (its ARN a literal, so
the functions' settings can be checked as they will read them)."""
SEALED_ONLY = {"payload_key"}
"""Beyond `CONFIGURED_ONLY`, on every function with payloads sealed: each reads or writes the
runs' records."""


@pytest.fixture(scope="module")
def sealed() -> Synthesized:
    return synthesize(context=SEALED)


def test_the_stack_has_the_core_functions_and_those_the_definition_calls(
    synthesized: Synthesized,
) -> None:
    called = set(AslDefinition.load(ASL).functions)
    assert function_names(synthesized) == CORE_FUNCTIONS | called


ENTRY_POINTS = CORE_FUNCTIONS | {"schedule"}
"""Beside the core functions, the schedule function, deployed with a project's schedules."""


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_each_handler_is_a_function_in_the_package(name: str) -> None:
    module, attribute = HANDLERS[name].rsplit(".", 1)
    source = REPO_ROOT / "lambdas" / Path(*module.split(".")).with_suffix(".py")
    assert source.exists(), f"{HANDLERS[name]}: no {source.relative_to(REPO_ROOT)}"
    defined = {
        node.name
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.FunctionDef)
    }
    assert attribute in defined


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_each_entry_point_hands_its_event_to_the_librarys_handler(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry_point = importlib.import_module(HANDLERS[name].rsplit(".", 1)[0])
    library = importlib.import_module(f"ratchet.handlers.{name}")
    seen: list[tuple[Any, Any]] = []

    def recorded(event: Any, context: Any) -> dict[str, Any]:
        seen.append((event, context))
        return {"answered": name}

    monkeypatch.setattr(library, "handler", recorded)
    event, context = {"run_id": "r-1"}, object()

    assert entry_point.handler(event, context) == {"answered": name}
    assert seen == [(event, context)]


def test_functions_share_one_asset_and_match_the_bundling_platform(
    synthesized: Synthesized,
) -> None:
    functions = synthesized.of_type("AWS::Lambda::Function").values()
    assert len({repr(f["Properties"]["Code"]) for f in functions}) == 1
    for function in functions:
        props = function["Properties"]
        assert props["Runtime"] == RUNTIME.name
        assert props["Architectures"] == [ARCHITECTURE.name]
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert "LogGroup" in props["LoggingConfig"]


def test_every_function_logs_to_its_own_group_with_a_retention(synthesized: Synthesized) -> None:
    functions = synthesized.of_type("AWS::Lambda::Function").values()
    groups = [f["Properties"]["LoggingConfig"]["LogGroup"]["Ref"] for f in functions]
    assert len(set(groups)) == len(groups)
    for group in groups:
        assert synthesized.resources[group]["Properties"]["RetentionInDays"] == 30


def test_the_approvals_function_answers_within_slacks_three_seconds(
    synthesized: Synthesized,
) -> None:
    props = synthesized.resources[function_id(synthesized, "approvals")]["Properties"]
    # Slack gives up after 3 s; anything still running after 10 s helps nobody.
    assert props["Timeout"] <= 10
    assert props["MemorySize"] >= 256


LAMBDA_MAX_TIMEOUT_SECONDS = 900


def test_the_step_function_outlasts_the_longest_step_time_limit(synthesized: Synthesized) -> None:
    """The engine, not Lambda, must end a step that runs too long: it records the timeout as a
    failed attempt, where a killed invocation leaves only a crash for the retry to find."""
    props = synthesized.resources[function_id(synthesized, "step")]["Properties"]

    assert props["Timeout"] == contract.MAX_STEP_TIMEOUT_SECONDS + functions.STEP_MARGIN_SECONDS
    assert props["Timeout"] <= LAMBDA_MAX_TIMEOUT_SECONDS
    assert functions.STEP_MARGIN_SECONDS >= 30, "room for a cold start and four store calls"


def test_the_step_time_limit_the_stack_allows_for_is_the_engines() -> None:
    from ratchet import tools
    from ratchet.engine import budget

    assert contract.MAX_STEP_TIMEOUT_SECONDS == tools.MAX_STEP_TIMEOUT_SECONDS
    # Every step an invocation takes has the room its first has: the limit and the margin.
    assert functions.STEP_MARGIN_SECONDS == budget.STEP_MARGIN_SECONDS
    assert tools.DEFAULT_STEP_TIMEOUT_SECONDS <= contract.MAX_STEP_TIMEOUT_SECONDS


def test_no_function_is_ever_given_faults_to_inject(
    synthesized: Synthesized, configured: Synthesized
) -> None:
    from ratchet.handlers import _wiring

    for synth in (synthesized, configured):
        for name in function_names(synth):
            assert _wiring.FAULT not in environment(synth, name), name


def _names(settings: set[str]) -> set[str]:
    return {ENVIRONMENT[setting] for setting in settings}


@pytest.mark.parametrize("name", sorted(CORE_FUNCTIONS))
def test_each_function_gets_exactly_the_settings_it_reads(
    synthesized: Synthesized, name: str
) -> None:
    expected = _names(EVERY_FUNCTION | UNCONFIGURED.get(name, set()))
    assert set(environment(synthesized, name)) == expected | POWERTOOLS


@pytest.mark.parametrize("name", sorted(CORE_FUNCTIONS))
@pytest.mark.parametrize("variant", ["configured", "sealed"])
def test_configured_each_function_gets_exactly_the_settings_it_reads(
    request: pytest.FixtureRequest, variant: str, name: str
) -> None:
    synth: Synthesized = request.getfixturevalue(variant)
    settings = EVERY_FUNCTION | UNCONFIGURED.get(name, set()) | CONFIGURED_ONLY.get(name, set())
    if variant == "sealed":
        settings |= SEALED_ONLY
    expected = _names(settings)
    if name in {"step", "api"}:
        expected.add(contract.ANTHROPIC_SECRET_ARN)
    assert set(environment(synth, name)) == expected | POWERTOOLS


def test_every_setting_but_slacks_own_api_url_and_the_projects_secrets_reaches_some_function(
    sealed: Synthesized,
) -> None:
    # With every optional key, payloads sealed included. The project's secrets and models
    # reach the functions only with a project that declares some
    # (tests/infra/test_project_settings.py).
    given = {key for name in CORE_FUNCTIONS for key in environment(sealed, name)}
    assert set(ENVIRONMENT.values()) - given == {
        ENVIRONMENT["slack_api_url"],
        ENVIRONMENT["secrets"],
        ENVIRONMENT["models"],
    }


@pytest.mark.parametrize("name", sorted(CORE_FUNCTIONS))
@pytest.mark.parametrize("variant", ["configured", "sealed"])
def test_the_settings_the_stack_passes_are_valid_settings(
    request: pytest.FixtureRequest, variant: str, name: str
) -> None:
    # Values known only at deploy time (table names, ARNs) are tokens; every literal the
    # configuration produced must be a value the handler accepts.
    synth: Synthesized = request.getfixturevalue(variant)
    variables = {
        key: value if isinstance(value, str) else "resolved-at-deploy"
        for key, value in environment(synth, name).items()
        if key not in POWERTOOLS and key != contract.ANTHROPIC_SECRET_ARN
    }
    settings = AwsSettings.from_env(variables)

    assert settings.payload_key == (f"kms:{KEY_ARN}" if variant == "sealed" else None)

    assert settings.rollover_after == DeployConfig().rollover_after
    if name == "notify":
        assert settings.notify_emails == ["ops@example.com", "lead@example.com"]
        assert settings.notify_slack_channel == "#approvals"
        assert settings.email_sender == CONFIGURED["ratchet:emailSender"]
    if name in {"notify", "approvals", "api"}:
        assert settings.public_url == "https://approvals.example.com"
    if name in {"api", "step"}:
        assert settings.agents is not None
        assert json.loads(settings.agents) == {"billing": "my_pkg.agents:billing"}
    if name == "step":
        assert settings.max_concurrent == {"billing": 5}
        assert settings.requests_per_minute == 50
        assert settings.queue_retry_seconds == DeployConfig().queue_retry_seconds
        assert settings.max_steps_per_invocation == DeployConfig().max_steps_per_invocation
    if name == "api":
        assert settings.bedrock_models == ()
        assert settings.prices is not None
        assert json.loads(settings.prices) == {"claude-opus-9*": {"input": 20, "output": 100}}


def test_deploy_defaults_are_the_runtime_defaults() -> None:
    defaults = AwsSettings(checkpoints_table="ckp", idempotency_table="idm", app_table="app")
    config = DeployConfig()
    assert config.rollover_after == defaults.rollover_after
    assert config.approval_timeout_seconds == defaults.approval_timeout_seconds
    assert config.checkpoint_retention_days == defaults.checkpoint_retention_days
    assert config.queue_retry_seconds == defaults.queue_retry_seconds
    assert config.max_steps_per_invocation == defaults.max_steps_per_invocation


def test_the_environment_names_are_the_settings_names() -> None:
    from ratchet.handlers import _wiring

    shared = {
        value
        for name, value in vars(contract).items()
        if name.isupper() and isinstance(value, str) and value.startswith("RATCHET_")
    }
    assert shared - {contract.ANTHROPIC_SECRET_ARN} <= set(ENVIRONMENT.values())
    assert set(ENVIRONMENT.values()) - shared == {ENVIRONMENT["slack_api_url"]}
    assert contract.ANTHROPIC_SECRET_ARN == _wiring.ANTHROPIC_SECRET_ARN
    assert contract.PAYLOAD_KEY == sealing.SETTING
    assert contract.POWERTOOLS_SERVICE_NAME == _wiring.SERVICE
    assert contract.POWERTOOLS_METRICS_NAMESPACE == _wiring.METRICS_NAMESPACE


def test_a_configured_anthropic_key_reaches_the_step_and_the_api_only(
    configured: Synthesized,
) -> None:
    for name in function_names(configured):
        given = environment(configured, name).get(contract.ANTHROPIC_SECRET_ARN)
        assert given == (ANTHROPIC_SECRET if name in {"step", "api"} else None), name


def test_the_wake_sweep_runs_every_minute_and_nothing_retries_it(synthesized: Synthesized) -> None:
    """The bound a dead waker's run waits within (ratchet.waiting.wakes): the grace and this
    period. A failed run is not retried: the next minute's takes what it left."""
    (rule,) = synthesized.of_type("AWS::Events::Rule").values()
    props = rule["Properties"]
    assert props["ScheduleExpression"] == f"rate({SWEEP_EVERY_SECONDS // 60} minute)"
    assert props["State"] == "ENABLED"
    (target,) = props["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [function_id(synthesized, "sweep"), "Arn"]}
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 0
    assert SWEEP_EVERY_SECONDS + WAKE_GRACE_SECONDS <= 120, "a dead waker's run waits minutes"
