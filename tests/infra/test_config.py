"""What a deployer may choose: the context keys, their checks, and their agreement with what the
functions accept at cold start (a value the stack lets through must not fail every invocation)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from annotated_types import Ge, Le
from aws_cdk import App

from ratchet import agents, imports, state
from ratchet.cdk import config as deploy_config
from ratchet.cdk.config import DeployConfig
from ratchet.runtime.aws_settings import AwsSettings

BOT = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ratchet/slack-bot-GhIjKl"
SIGNING = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ratchet/slack-sig-MnOpQr"
SES = "arn:aws:ses:eu-west-1:123456789012:identity/example.com"
AGENTS = '{"support": "acme.agents:support", "billing": "acme.agents:billing"}'


def _config(**context: Any) -> DeployConfig:
    return DeployConfig.from_context(App(context=context))


def test_nothing_is_required() -> None:
    assert _config() == DeployConfig()


def test_context_overrides_the_runtime_settings() -> None:
    config = _config(**{"ratchet:rolloverAfter": "50", "ratchet:approvalTimeoutSeconds": 600})
    assert (config.rollover_after, config.approval_timeout_seconds) == (50, 600)


def test_lists_come_from_the_cli_as_text_or_from_cdk_json_as_lists() -> None:
    from_cli = _config(
        **{
            "ratchet:emailSender": "approvals@example.com",
            "ratchet:notifyEmails": "a@example.com, b@example.com,a@example.com",
            "ratchet:sesIdentityArn": SES,
        }
    )
    from_json = _config(
        **{
            "ratchet:emailSender": "approvals@example.com",
            "ratchet:notifyEmails": ["a@example.com", "b@example.com"],
            "ratchet:sesIdentityArn": [SES],
        }
    )
    assert from_cli.notify_emails == from_json.notify_emails == ("a@example.com", "b@example.com")
    assert from_cli.ses_identity_arn == from_json.ses_identity_arn == (SES,)


def test_agents_come_as_json_text_or_an_object_and_reach_the_functions_as_json() -> None:
    text = _config(**{"ratchet:agents": '{"billing": "acme.agents:billing", "a": "m:x"}'})
    obj = _config(**{"ratchet:agents": {"a": "m:x", "billing": "acme.agents:billing"}})
    assert text.agents_json == obj.agents_json == '{"a":"m:x","billing":"acme.agents:billing"}'


def test_a_custom_public_url_loses_its_trailing_slash() -> None:
    config = _config(**{"ratchet:publicUrl": "https://approvals.example.com/ratchet/"})
    assert config.public_url == "https://approvals.example.com/ratchet"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ratchet:rolloverAfter", "many"),
        ("ratchet:rolloverAfter", "3001"),
        ("ratchet:checkpointRetentionDays", "0"),
        ("ratchet:approvalTimeoutSeconds", str(366 * 24 * 3600)),
        ("ratchet:anthropicSecretArn", "ratchet/anthropic"),
        ("ratchet:slackBotTokenSecretArn", "xoxb-a-token-pasted-by-mistake"),
        ("ratchet:emailSender", "Approvals <approvals@example.com>"),
        ("ratchet:emailSender", "approvals@localhost"),
        ("ratchet:sesIdentityArn", "arn:aws:ses:eu-west-1:123456789012:identity/*"),
        ("ratchet:notifyEmails", "ops@example.com;lead@example.com"),
        ("ratchet:notifyEmails", ",".join(f"p{i}@example.com" for i in range(11))),
        ("ratchet:notifySlackChannel", "#not a channel"),
        ("ratchet:agents", "billing=acme.agents:billing"),
        ("ratchet:agents", '{"billing": "acme/agents.py"}'),
        ("ratchet:agents", '{"bad name": "acme.agents:billing"}'),
        ("ratchet:agents", '{"migration": "acme.agents:migration"}'),
        ("ratchet:prices", "claude*=3,15"),
        ("ratchet:prices", '{"claude*": {"input": 3}}'),
        ("ratchet:prices", '{"claude*": {"input": -1, "output": 15}}'),
        ("ratchet:prices", '{"claude*": {"input": 3, "output": 15, "batch": 1}}'),
        ("ratchet:prices", '{"claude*": {"input": true, "output": 15}}'),
        ("ratchet:publicUrl", "http://approvals.example.com"),
        ("ratchet:publicUrl", "https://approvals.example.com/?x=1"),
        ("ratchet:requestsPerMinute", "0"),
        ("ratchet:maxConcurrent", "support=5"),
        ("ratchet:maxConcurrent", '{"support": 0}'),
        ("ratchet:maxConcurrent", '{"support": 10001}'),
        ("ratchet:maxConcurrent", '{"support": "5"}'),
    ],
)
def test_bad_context_fails_the_synth_with_its_key(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=key):
        _config(**{key: value})


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"ratchet:slackBotTokenSecretArn": BOT}, "go together"),
        ({"ratchet:slackSigningSecretArn": SIGNING}, "go together"),
        ({"ratchet:sesIdentityArn": SES}, "needs ratchet:emailSender"),
        ({"ratchet:notifyEmails": "ops@example.com"}, "needs ratchet:emailSender"),
        ({"ratchet:notifySlackChannel": "#approvals"}, "needs ratchet:slackBotTokenSecretArn"),
    ],
)
def test_half_a_channel_fails_the_synth(context: dict[str, str], message: str) -> None:
    # It would deploy, then post buttons nobody can press or defaults nobody sends to.
    with pytest.raises(ValueError, match=message):
        _config(**context)


@pytest.mark.parametrize("name", sorted(deploy_config.INTEGER_BOUNDS))
def test_integer_bounds_are_the_settings_bounds(name: str) -> None:
    metadata = AwsSettings.model_fields[name].metadata
    low = next(m.ge for m in metadata if isinstance(m, Ge))
    high = next(m.le for m in metadata if isinstance(m, Le))
    assert deploy_config.INTEGER_BOUNDS[name] == (low, high)


def test_addresses_channels_and_agents_follow_the_functions_rules() -> None:
    assert deploy_config.EMAIL_PATTERN == state.EMAIL_PATTERN
    assert deploy_config.SLACK_CHANNEL_PATTERN == state.SLACK_CHANNEL_PATTERN
    assert deploy_config.MAX_NOTIFY_EMAILS == state.MAX_NOTIFY_EMAILS
    assert agents.AGENT_NAME.pattern == deploy_config.AGENT_NAME_PATTERN
    assert imports.IMPORT_PATH.pattern == deploy_config.IMPORT_PATH_PATTERN
    assert set(deploy_config.BUILT_IN_AGENTS) == set(agents.SCENARIOS)


def test_defaults_the_stack_accepts_are_defaults_the_functions_accept() -> None:
    config = _config(
        **{
            "ratchet:emailSender": "approvals@example.com",
            "ratchet:notifyEmails": ",".join(f"p{i}@example.com" for i in range(10)),
            "ratchet:slackBotTokenSecretArn": BOT,
            "ratchet:slackSigningSecretArn": SIGNING,
            "ratchet:notifySlackChannel": "approvals.ops",
            "ratchet:agents": '{"billing": "acme.agents:billing"}',
        }
    )
    # What the desk builds at cold start from RATCHET_NOTIFY_EMAILS / _SLACK_CHANNEL.
    state.NotifyTargets(email=list(config.notify_emails), slack_channel=config.notify_slack_channel)
    assert agents.AgentRegistry.deployment(config.agents_json).resolve("billing")


@pytest.mark.parametrize(
    "prices",
    [
        {"claude*": {"input": 3, "output": 15}},
        {"claude*": {"input": 3, "output": 15, "cache_write": 3.75, "cache_read": 0.3}},
        {"claude*": {"input": 3}},
        {"claude*": {"input": -1, "output": 15}},
        {"claude*": {"input": 3, "output": 15, "batch": 1}},
        {"claude*": {"input": "3", "output": 15}},
        {"claude*": [3, 15]},
    ],
)
def test_the_stack_takes_exactly_the_prices_the_api_takes(prices: dict[str, Any]) -> None:
    from ratchet.errors import InvalidInput
    from ratchet.pricing import check_prices

    raw = json.dumps(prices)
    try:
        check_prices(raw)
        api_takes = True
    except InvalidInput:
        api_takes = False
    try:
        stack_value = _config(**{"ratchet:prices": raw}).prices
        stack_takes = True
    except ValueError:
        stack_takes = False

    assert stack_takes == api_takes
    if stack_takes:
        assert stack_value is not None
        assert json.loads(stack_value) == prices


def test_the_price_fields_are_those_the_api_takes() -> None:
    import inspect

    from ratchet.pricing import Prices

    parameters = inspect.signature(Prices).parameters.values()
    taken = {p.name: p.default is inspect.Parameter.empty for p in parameters}

    assert taken == deploy_config.PRICE_FIELDS


def test_the_bounds_the_stack_takes_are_the_bounds_the_step_function_takes() -> None:
    from ratchet import tools

    assert deploy_config.MAX_CONCURRENT_RUNS == tools.MAX_CONCURRENT_RUNS
    config = _config(
        **{"ratchet:agents": AGENTS, "ratchet:maxConcurrent": '{"support": 5, "billing": 1}'}
    )
    assert config.max_concurrent is not None
    settings = AwsSettings.model_validate(
        {
            "checkpoints_table": "ckpt",
            "idempotency_table": "idem",
            "app_table": "app",
            "max_concurrent": config.max_concurrent,
        }
    )
    assert settings.max_concurrent == {"support": 5, "billing": 1}


@pytest.mark.parametrize(
    ("bounds", "said"),
    [
        (
            '{"suport": 5}',
            "context ratchet:maxConcurrent: 'suport' names no agent this deployment registers "
            "(billing, migration, notebook, support)",
        ),
        (
            '{"acme.agents:other": 5}',
            "context ratchet:maxConcurrent: 'acme.agents:other' names no agent this deployment "
            "registers (billing, migration, notebook, support)",
        ),
        (
            '{"support": 5, "acme.agents:support": 3}',
            "context ratchet:maxConcurrent: 'support' and 'acme.agents:support' name one agent: "
            "give it one bound",
        ),
    ],
)
def test_a_bound_that_names_no_registered_agent_fails_the_synth(bounds: str, said: str) -> None:
    # The step function reads a key as POST /runs names an agent: one it cannot find would
    # bound nothing, and the deploy would go through.
    with pytest.raises(ValueError, match=r"^context ratchet:maxConcurrent: ") as refused:
        _config(**{"ratchet:agents": AGENTS, "ratchet:maxConcurrent": bounds})
    assert str(refused.value) == said


def test_a_bound_names_an_agent_as_the_api_starts_it() -> None:
    bounds = '{"support": 5, "acme.agents:billing": 2, "migration": 1}'
    config = _config(**{"ratchet:agents": AGENTS, "ratchet:maxConcurrent": bounds})
    assert config.max_concurrent == '{"support":5,"acme.agents:billing":2,"migration":1}'
    with pytest.raises(ValueError, match="'support' names no agent this deployment registers"):
        _config(**{"ratchet:maxConcurrent": '{"support": 5}'})  # registered by no one


def test_a_prop_wins_over_its_context_key_and_an_unset_prop_gives_way_to_it() -> None:
    app = App(context={"ratchet:rolloverAfter": "7", "ratchet:queueRetrySeconds": "3"})

    config = DeployConfig.from_context(app, {"rollover_after": 50, "queue_retry_seconds": None})

    assert (config.rollover_after, config.queue_retry_seconds) == (50, 3)
    assert config.checkpoint_retention_days == DeployConfig().checkpoint_retention_days


def test_a_prop_and_a_context_key_half_a_channel_each_are_named_as_given() -> None:
    # The signing secret given in cdk.json, the bot token forgotten in the app.
    app = App(context={"ratchet:slackSigningSecretArn": SIGNING})
    with pytest.raises(ValueError, match=r"^context ratchet:slackBotTokenSecretArn and "):
        DeployConfig.from_context(app, {"email_sender": "approvals@example.com"})
    with pytest.raises(ValueError, match=r"^RatchetAgents ses_identity_arn needs email_sender$"):
        DeployConfig.from_context(App(), {"ses_identity_arn": SES})
