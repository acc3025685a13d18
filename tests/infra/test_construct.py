"""The construct in a user's own CDK app (`ratchet.cdk.RatchetAgents`, docs/cdk-construct.md): a
project outside this repository synthesizes with the construct alone, its agent registered,
cdk-nag clean (tests/infra/test_iam.py holds least privilege for it too); its props win over
the context keys, which win over the defaults; a mistake in a prop names the prop."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from ratchet.cdk import RatchetAgents, RatchetStack
from ratchet.cdk.stack import OUTPUTS
from tests.infra.queries import environment, function_names
from tests.infra.synth import (
    USER_CONTEXT,
    Synthesized,
    SynthesizedTemplate,
    UserApp,
    template_only_context,
)

BOT = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ratchet/slack-bot-GhIjKl"


def test_a_users_app_synthesizes_with_the_construct_alone(user_app: UserApp) -> None:
    # Then the synth went through cdk-nag (add_checks): an open finding would have failed it
    assert user_app.done.returncode == 0, user_app.done.stdout + user_app.done.stderr
    failed = [
        (plugin["pluginName"], [v["ruleName"] for v in plugin["violations"]])
        for plugin in user_app.validation_report["pluginReports"]
        if plugin["conclusion"] != "success"
    ]
    assert failed == []


def test_it_builds_what_the_repositorys_stack_builds(
    user_app: UserApp, synthesized: Synthesized
) -> None:
    theirs = Counter(r["Type"] for r in user_app.synthesized.resources.values())
    ours = Counter(r["Type"] for r in synthesized.resources.values())

    assert theirs == ours
    outputs = user_app.synthesized.template.to_json()["Outputs"]
    assert set(OUTPUTS) <= set(outputs)  # by their own names, as the docs give them


def test_the_projects_agent_is_registered(user_app: UserApp) -> None:
    template = user_app.synthesized
    registered = {
        name: json.loads(environment(template, name)["RATCHET_AGENTS"])
        for name in function_names(template)
        if "RATCHET_AGENTS" in environment(template, name)
    }

    greeter = {"greeter": "greeter.agent:greeter"}
    assert registered == {"api": greeter, "step": greeter}


def test_a_prop_wins_over_its_context_key_which_wins_over_the_default(user_app: UserApp) -> None:
    step = environment(user_app.synthesized, "step")

    assert USER_CONTEXT["ratchet:rolloverAfter"] == "7"  # the app says rollover_after=50
    assert step["RATCHET_ROLLOVER_AFTER"] == "50"
    assert (
        step["RATCHET_CHECKPOINT_RETENTION_DAYS"] == USER_CONTEXT["ratchet:checkpointRetentionDays"]
    )
    assert step["RATCHET_APPROVAL_TIMEOUT_SECONDS"] == str(7 * 24 * 3600)


def _stack(**context: Any) -> Stack:
    return Stack(App(context=template_only_context(**context)), "MyAgents")


@pytest.fixture(scope="module")
def in_a_stack_of_ones_own() -> RatchetAgents:
    """The construct under an id of the user's choosing, in a plain stack."""
    return RatchetAgents(_stack(), "Ratchet", approval_timeout_seconds=600)


def test_cdk_nag_finds_nothing_open_under_any_construct_id(
    in_a_stack_of_ones_own: RatchetAgents,
) -> None:
    # Each acknowledgement sits on its construct, whatever path the construct has.
    report = AwsSolutionsChecks().validate_scope(Stack.of(in_a_stack_of_ones_own))
    assert [v.rule_name for v in report.violations] == []


def test_a_prop_reaches_the_functions(in_a_stack_of_ones_own: RatchetAgents) -> None:
    template = Template.from_stack(Stack.of(in_a_stack_of_ones_own))
    synthesized = SynthesizedTemplate(template, template.to_json()["Resources"])

    assert environment(synthesized, "step")["RATCHET_APPROVAL_TIMEOUT_SECONDS"] == "600"


def test_one_construct_per_stack(in_a_stack_of_ones_own: RatchetAgents) -> None:
    stack = Stack.of(in_a_stack_of_ones_own)
    with pytest.raises(ValueError, match="holds a RatchetAgents already: one per stack"):
        RatchetAgents(stack, "Again")


def test_an_unknown_prop_is_a_type_error_that_names_it() -> None:
    with pytest.raises(TypeError, match="RatchetAgents has no prop 'rolover_after'; its props"):
        RatchetAgents(_stack(), "Ratchet", rolover_after=50)


@pytest.mark.parametrize(
    ("props", "said"),
    [
        ({"rollover_after": 0}, "RatchetAgents rollover_after must be between 1 and 3000: 0"),
        (
            {"notify_emails": ["ops@example.com;lead@example.com"]},
            "RatchetAgents notify_emails must be email addresses: 'ops@example.com;lead@",
        ),
        (
            {"slack_bot_token_secret_arn": BOT},
            "RatchetAgents slack_bot_token_secret_arn and slack_signing_secret_arn go together",
        ),
        (
            {"notify_emails": ["ops@example.com"]},
            "RatchetAgents notify_emails needs email_sender to send from",
        ),
        ({"agents": {"bad name": "acme:agent"}}, "RatchetAgents agents: 'bad name'"),
        ({"project": "no/such/folder"}, "RatchetAgents project=no/such/folder: .*no such file"),
    ],
)
def test_a_bad_prop_fails_the_synth_naming_the_prop(props: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=f"^{said}"):
        RatchetAgents(_stack(), "Ratchet", **props)


def test_the_stack_passes_the_settings_to_its_construct_and_the_rest_to_stack() -> None:
    stack = RatchetStack(
        App(context=template_only_context()), "Ratchet", description="mine", rollover_after=12
    )

    template = Template.from_stack(stack)
    synthesized = SynthesizedTemplate(template, template.to_json()["Resources"])
    assert template.to_json()["Description"] == "mine"
    assert environment(synthesized, "step")["RATCHET_ROLLOVER_AFTER"] == "12"
