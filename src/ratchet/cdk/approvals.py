"""What the approval channels need: the link-signing key, Slack's secrets, the SES identity.

Each secret is readable by exactly the functions that use it, and email may be sent only as
the configured sender. Who answers executions (`grant_task_response`) is wired in the stack,
next to the state machine.
"""

from __future__ import annotations

from typing import cast

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from ratchet.cdk import contract
from ratchet.cdk.config import DeployConfig
from ratchet.cdk.functions import Functions
from ratchet.cdk.nag import acknowledge

LINK_KEY_CHARS = 64
"""Alphanumeric: ~380 bits, far beyond what HMAC-SHA256 can use."""

BUILDS_LINKS = ("notify", "approvals", "api")
"""Notify signs links; the approvals function checks them; the API decides through the same
desk, which needs both to be built (tests/infra checks each gets exactly what it reads)."""
READS_SLACK_BOT_TOKEN = ("notify",)
"""Posts the request to Slack. The approvals function replaces the message through the
interaction's `response_url`, which needs no token."""
READS_SLACK_SIGNING_SECRET = ("approvals",)
SENDS_EMAIL = ("notify",)


class ApprovalChannels(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeployConfig,
        functions: Functions,
        public_url: str,
        key: kms.IKey | None = None,
    ) -> None:
        """`key`: the deployment's own key, which the link key's secret is then encrypted with."""
        super().__init__(scope, construct_id)
        self.link_key = secretsmanager.Secret(
            self,
            "LinkKey",
            description="Ratchet: signs approval links (HMAC-SHA256)",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=LINK_KEY_CHARS, exclude_punctuation=True
            ),
        )
        if key is not None:
            # By the secret's own property rather than `encryption_key`: with that, `grant_read`
            # would write the readers into a created key's policy and grant nothing on an
            # imported key; the stack grants each reader itself (`StoreKey.grant_secret`).
            cast(
                secretsmanager.CfnSecret, self.link_key.node.default_child
            ).kms_key_id = key.key_arn
        acknowledge(
            self.link_key,
            "AwsSolutions-SMG4",
            (
                "Rotating the link key invalidates every approval link already sent (a pending "
                "request may wait for days), so it is rotated by hand when needed: "
                "docs/deploy.md says how. It never leaves Secrets Manager and the functions "
                "that build or check links, and links also expire on their own."
            ),
        )
        for name in BUILDS_LINKS:
            functions[name].add_environment(contract.PUBLIC_URL, public_url)
            functions[name].add_environment(contract.LINK_KEY_SECRET_ARN, self.link_key.secret_arn)
            self.link_key.grant_read(functions[name])

        if config.slack_bot_token_secret_arn and config.slack_signing_secret_arn:
            self._share(
                "SlackBotToken",
                config.slack_bot_token_secret_arn,
                contract.SLACK_BOT_TOKEN_SECRET_ARN,
                READS_SLACK_BOT_TOKEN,
                functions,
            )
            self._share(
                "SlackSigningSecret",
                config.slack_signing_secret_arn,
                contract.SLACK_SIGNING_SECRET_ARN,
                READS_SLACK_SIGNING_SECRET,
                functions,
            )
        if config.notify_slack_channel:
            functions["notify"].add_environment(
                contract.NOTIFY_SLACK_CHANNEL, config.notify_slack_channel
            )

        if config.email_sender:
            identities = config.ses_identity_arn or sender_identities(self, config.email_sender)
            for name in SENDS_EMAIL:
                functions[name].add_environment(contract.EMAIL_SENDER, config.email_sender)
                functions[name].add_to_role_policy(
                    iam.PolicyStatement(actions=["ses:SendEmail"], resources=list(identities))
                )
        if config.notify_emails:
            functions["notify"].add_environment(
                contract.NOTIFY_EMAILS, ",".join(config.notify_emails)
            )

    def _share(
        self,
        construct_id: str,
        arn: str,
        variable: str,
        readers: tuple[str, ...],
        functions: Functions,
    ) -> None:
        secret = secretsmanager.Secret.from_secret_complete_arn(self, construct_id, arn)
        for name in readers:
            functions[name].add_environment(variable, secret.secret_arn)
            secret.grant_read(functions[name])


def sender_identities(scope: Construct, sender: str) -> tuple[str, str]:
    """The SES identities SES may authorize a send from `sender` against: the address itself
    or its domain, whichever of the two the deployer verified."""
    domain = sender.rsplit("@", 1)[1]
    stack = Stack.of(scope)
    return (
        stack.format_arn(service="ses", resource="identity", resource_name=sender),
        stack.format_arn(service="ses", resource="identity", resource_name=domain),
    )
