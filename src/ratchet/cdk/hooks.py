"""What the webhook route needs: the key every hook id and secret derives from.

A Secrets Manager secret of its own, not the approval link key: the hooks function (public,
called by anyone on the internet) can sign no approval link, and the approvals function can
make no webhook secret. Readable by exactly the functions that derive ids and secrets
(`READS_HOOK_KEY`).
"""

from __future__ import annotations

from typing import cast

from aws_cdk import aws_kms as kms
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from ratchet.cdk import contract
from ratchet.cdk.functions import Functions
from ratchet.cdk.nag import acknowledge

HOOK_KEY_CHARS = 64
"""Alphanumeric: ~380 bits, far beyond what HMAC-SHA256 can use."""

READS_HOOK_KEY = ("hooks", "api")
"""The hooks function checks each delivery's signature with the hook's derived secret; the api
function opens a run's hook (`POST /runs/{id}/hooks/{name}`), whose answer holds its secret."""


class Webhooks(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: Functions,
        key: kms.IKey | None = None,
    ) -> None:
        """`key`: the deployment's own key, which the hook key's secret is then encrypted with."""
        super().__init__(scope, construct_id)
        self.hook_key = secretsmanager.Secret(
            self,
            "HookKey",
            description="Ratchet: webhook ids and signing secrets derive from it (HMAC-SHA256)",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=HOOK_KEY_CHARS, exclude_punctuation=True
            ),
        )
        if key is not None:
            # By the secret's own property rather than `encryption_key`: with that, `grant_read`
            # would write the readers into a created key's policy and grant nothing on an
            # imported key; the stack grants each reader itself (`StoreKey.grant_secret`).
            cast(
                secretsmanager.CfnSecret, self.hook_key.node.default_child
            ).kms_key_id = key.key_arn
        acknowledge(
            self.hook_key,
            "AwsSolutions-SMG4",
            (
                "Rotating the hook key changes every webhook's id and secret, so every sender "
                "(GitHub, Stripe, CI) would have to be configured anew: it is rotated by hand "
                "when needed. It never leaves Secrets Manager and the hooks and api functions, "
                "and a secret derived from it is shown only to whoever opens the hook (an "
                "IAM-signed request)."
            ),
        )
        for name in READS_HOOK_KEY:
            functions[name].add_environment(contract.HOOK_KEY_SECRET_ARN, self.hook_key.secret_arn)
            self.hook_key.grant_read(functions[name])
