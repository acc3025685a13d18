"""The approval channels' wiring: who may read which secret, who may send email and as whom,
who may answer a parked execution. Each is granted to exactly the functions that use it."""

from __future__ import annotations

from typing import Any

import pytest

from ratchet.cdk.stack import ANSWERS_EXECUTIONS
from tests.infra.queries import as_list, environment, function_names, statements_of_function
from tests.infra.synth import (
    ANTHROPIC_SECRET,
    EMAIL_SENDER,
    SLACK_BOT_TOKEN_SECRET,
    SLACK_SIGNING_SECRET,
    Synthesized,
    template_only_context,
)

TASK_RESPONSE = {"states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat"}
LINK_KEY = "link key"
HOOK_KEY = "hook key"


def _own_secret_id(synth: Synthesized, construct: str) -> str:
    (secret_id,) = [
        s for s in synth.of_type("AWS::SecretsManager::Secret") if s.startswith(construct)
    ]
    return secret_id


def _link_key_id(synth: Synthesized) -> str:
    return _own_secret_id(synth, "Approvals")


def _named(synth: Synthesized, secret: Any) -> str:
    """A secret's ARN, or `LINK_KEY` / `HOOK_KEY` for the stack's own."""
    own = {
        LINK_KEY: {"Ref": _link_key_id(synth)},
        HOOK_KEY: {"Ref": _own_secret_id(synth, "Webhooks")},
    }
    return next((name for name, ref in own.items() if secret == ref), secret)


def _secrets_read(synth: Synthesized, name: str) -> set[str]:
    """The secrets the function may read: ARNs, or `LINK_KEY` / `HOOK_KEY` for the stack's
    own."""
    read: set[str] = set()
    for statement in statements_of_function(synth, name):
        actions = as_list(statement["Action"])
        if not any(a.startswith("secretsmanager:") for a in actions):
            continue
        assert set(actions) == {"secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"}
        for resource in as_list(statement["Resource"]):
            read.add(_named(synth, resource))
    return read


def _ses_statements(synth: Synthesized, name: str) -> list[dict[str, Any]]:
    return [
        s
        for s in statements_of_function(synth, name)
        if any(a.startswith("ses:") for a in as_list(s["Action"]))
    ]


def test_the_stack_synthesizes_with_no_optional_context(synthesized: Synthesized) -> None:
    assert not [key for key in template_only_context() if key.startswith("ratchet:")]
    # Everything a person needs to answer is there already; the channels are configuration.
    assert "approvals" in function_names(synthesized)
    assert synthesized.of_type("AWS::SecretsManager::Secret")
    assert synthesized.template.to_json()["Outputs"]["SlackInteractivityUrl"]


def test_the_stack_makes_a_random_link_key(synthesized: Synthesized) -> None:
    secret = synthesized.resources[_link_key_id(synthesized)]["Properties"]
    generated = secret["GenerateSecretString"]

    # Only the functions use it, as HMAC key bytes: long, and no character that a shell or
    # an encoding could mangle.
    assert generated["PasswordLength"] >= 32
    assert generated["ExcludePunctuation"] is True
    assert "SecretString" not in secret, "a key in the template is a key in the repository"
    outputs = synthesized.template.to_json()["Outputs"]
    assert outputs["LinkKeySecretArn"]["Value"] == {"Ref": _link_key_id(synthesized)}


@pytest.mark.parametrize("which", ["bare", "configured"])
def test_each_function_reads_exactly_the_secrets_it_uses(
    synthesized: Synthesized, configured: Synthesized, which: str
) -> None:
    synth = synthesized if which == "bare" else configured
    expected: dict[str, set[str]] = {
        # The api function opens a run's hook (POST /runs/{id}/hooks/{name}), secret included.
        "api": {LINK_KEY, HOOK_KEY},
        "notify": {LINK_KEY},
        "approvals": {LINK_KEY},
        # The hooks function derives each hook's secret; it never holds the link key.
        "hooks": {HOOK_KEY},
    }
    if which == "configured":
        expected["step"] = {ANTHROPIC_SECRET}
        expected["api"] = {LINK_KEY, HOOK_KEY, ANTHROPIC_SECRET}
        # The bot token posts messages; the approvals function updates them through Slack's
        # response_url, which needs no token. The signing secret only checks Slack's requests.
        expected["notify"] = {LINK_KEY, SLACK_BOT_TOKEN_SECRET}
        expected["approvals"] = {LINK_KEY, SLACK_SIGNING_SECRET}

    for name in function_names(synth):
        assert _secrets_read(synth, name) == expected.get(name, set()), name


@pytest.mark.parametrize("which", ["bare", "configured"])
def test_a_function_is_told_the_arn_of_each_secret_it_may_read_and_no_other(
    synthesized: Synthesized, configured: Synthesized, which: str
) -> None:
    synth = synthesized if which == "bare" else configured
    for name in function_names(synth):
        told = {
            _named(synth, value)
            for key, value in environment(synth, name).items()
            if key.endswith("_SECRET_ARN")
        }
        assert told == _secrets_read(synth, name), name


def test_without_a_sender_no_function_may_send_email(synthesized: Synthesized) -> None:
    for name in function_names(synthesized):
        assert _ses_statements(synthesized, name) == [], name
        assert "RATCHET_EMAIL_SENDER" not in environment(synthesized, name)


def test_with_a_sender_only_notify_may_send_and_only_as_that_sender(
    configured: Synthesized,
) -> None:
    for name in function_names(configured) - {"notify"}:
        assert _ses_statements(configured, name) == [], name
    (statement,) = _ses_statements(configured, "notify")

    assert as_list(statement["Action"]) == ["ses:SendEmail"]
    identities = [r["Fn::Join"][1][-1] for r in as_list(statement["Resource"])]
    # SES authorizes the send against the address's identity or its domain's, whichever the
    # deployer verified; no other identity, and never `*`.
    domain = EMAIL_SENDER.split("@")[1]
    assert identities == [f":identity/{EMAIL_SENDER}", f":identity/{domain}"]
    assert environment(configured, "notify")["RATCHET_EMAIL_SENDER"] == EMAIL_SENDER


@pytest.mark.parametrize("which", ["bare", "configured"])
def test_only_the_approval_page_and_the_api_answer_parked_executions(
    synthesized: Synthesized, configured: Synthesized, which: str
) -> None:
    synth = synthesized if which == "bare" else configured
    (machine,) = synth.of_type("AWS::StepFunctions::StateMachine")
    answering: set[str] = set()
    # open_wait answers only its own event wait's task, the hooks function the task of the
    # wait a delivery settled, the step and mark_failed a parent's whose child they ended,
    # with SendTaskSuccess alone (tests/infra/test_iam.py).
    for name in function_names(synth) - {"open_wait", "hooks", "step", "mark_failed"}:
        for statement in statements_of_function(synth, name):
            actions = set(as_list(statement["Action"]))
            if not actions & TASK_RESPONSE:
                continue
            assert actions & TASK_RESPONSE == TASK_RESPONSE
            assert statement["Resource"] == {"Ref": machine}, "this state machine only"
            answering.add(name)

    # The sweep answers what a dead waker left: a decision, a settled wait.
    assert answering == set(ANSWERS_EXECUTIONS) == {"approvals", "api", "sweep"}


def test_no_other_principal_may_answer_executions(synthesized: Synthesized) -> None:
    functions = {
        f["Properties"]["Role"]["Fn::GetAtt"][0]
        for f in synthesized.of_type("AWS::Lambda::Function").values()
    }
    for policy in synthesized.of_type("AWS::IAM::Policy").values():
        roles = {r["Ref"] for r in policy["Properties"]["Roles"]}
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if set(as_list(statement["Action"])) & TASK_RESPONSE:
                assert roles <= functions


def test_a_custom_public_url_is_where_links_and_slack_point(configured: Synthesized) -> None:
    outputs = configured.template.to_json()["Outputs"]
    assert outputs["ApprovalsUrl"]["Value"] == "https://approvals.example.com/approvals/"
    assert (
        outputs["SlackInteractivityUrl"]["Value"]
        == "https://approvals.example.com/slack/interactions"
    )
