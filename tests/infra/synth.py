"""Synthesizing the stack for tests, the way `cdk synth` does but without bundling.

Template-only tests skip Lambda bundling (CDK's `aws:cdk:bundling-stacks` context): the code
asset then points at `lambdas/` as it is. `test_cli_synth.py` bundles for real.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# jsii starts its Node process on the first CDK import and warns about Node 20 on stderr.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

from aws_cdk import App
from aws_cdk.assertions import Template

from ratchet.cdk.stack import RatchetStack

REPO_ROOT = Path(__file__).resolve().parents[2]
ASL = REPO_ROOT / "statemachine" / "agent_run.asl.json"
EXAMPLE_PROJECT = REPO_ROOT / "examples" / "billing_agent"
"""The README's refund agent: a project with a secret, an environment and a permission."""

ANTHROPIC_SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ratchet/anthropic-AbCdEf"
SLACK_BOT_TOKEN_SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:slack-bot-GhIjKl"
SLACK_SIGNING_SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:slack-sig-MnOpQr"
EMAIL_SENDER = "approvals@example.com"
CONFIGURED = {
    "ratchet:anthropicSecretArn": ANTHROPIC_SECRET,
    "ratchet:slackBotTokenSecretArn": SLACK_BOT_TOKEN_SECRET,
    "ratchet:slackSigningSecretArn": SLACK_SIGNING_SECRET,
    "ratchet:emailSender": EMAIL_SENDER,
    "ratchet:notifyEmails": "ops@example.com, lead@example.com",
    "ratchet:notifySlackChannel": "#approvals",
    "ratchet:agents": '{"billing": "my_pkg.agents:billing"}',
    "ratchet:publicUrl": "https://approvals.example.com/",
    "ratchet:prices": '{"claude-opus-9*": {"input": 20, "output": 100}}',
    "ratchet:maxConcurrent": '{"billing": 5}',
    "ratchet:requestsPerMinute": "50",
}
"""Every optional context key a deployer may give, as `cdk deploy -c` passes them (strings)."""


def cdk_json_context() -> dict[str, Any]:
    """The feature flags and settings `cdk synth` would use: the tests synthesize the same
    template the CLI does."""
    context: dict[str, Any] = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    return context


def template_only_context(**extra: Any) -> dict[str, Any]:
    """cdk.json's flags without a deployer's own `ratchet:` choices (which may live there for
    CI): each test says which configuration it synthesizes."""
    flags = {k: v for k, v in cdk_json_context().items() if not k.startswith("ratchet:")}
    return {**flags, "aws:cdk:bundling-stacks": [], **extra}


@dataclass(frozen=True)
class Synthesized:
    stack: RatchetStack
    template: Template
    resources: Mapping[str, Any]

    def of_type(self, resource_type: str) -> dict[str, Any]:
        return {k: v for k, v in self.resources.items() if v["Type"] == resource_type}


def synthesize(asl_path: Path = ASL, context: Mapping[str, Any] | None = None) -> Synthesized:
    app = App(context=template_only_context(**(context or {})))
    stack = RatchetStack(app, "Ratchet", asl_path=asl_path)
    template = Template.from_stack(stack)
    return Synthesized(stack, template, template.to_json()["Resources"])
