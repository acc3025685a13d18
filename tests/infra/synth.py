"""Synthesizing the stack for tests, the way `cdk synth` does but without bundling.

Template-only tests skip Lambda bundling (CDK's `aws:cdk:bundling-stacks` context): the code
asset then points at `lambdas/` as it is. `test_cli_synth.py` bundles for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
class SynthesizedTemplate:
    """A synthesized template, however it was made (a user's app writes it to its cdk.out)."""

    template: Template
    resources: Mapping[str, Any]

    def of_type(self, resource_type: str) -> dict[str, Any]:
        return {k: v for k, v in self.resources.items() if v["Type"] == resource_type}

    @classmethod
    def read(cls, path: Path) -> SynthesizedTemplate:
        document = json.loads(path.read_text(encoding="utf-8"))
        return cls(Template.from_json(document), document["Resources"])


@dataclass(frozen=True)
class Synthesized(SynthesizedTemplate):
    """The repository's stack, synthesized in this process: its constructs can be inspected."""

    stack: RatchetStack


def synthesize(asl_path: Path = ASL, context: Mapping[str, Any] | None = None) -> Synthesized:
    app = App(context=template_only_context(**(context or {})))
    stack = RatchetStack(app, "Ratchet", asl_path=asl_path)
    template = Template.from_stack(stack)
    return Synthesized(template=template, resources=template.to_json()["Resources"], stack=stack)


USER_APP = """\
from pathlib import Path
import aws_cdk as cdk
from ratchet.cdk import RatchetAgents, add_checks

app = cdk.App()
stack = cdk.Stack(app, "MyAgents")
agents = RatchetAgents(stack, "Ratchet", project=Path(__file__).parent, rollover_after=50)
add_checks(app)
app.synth()
"""
"""docs/cdk-construct.md's app, as a user's project holds it, with one prop given."""
USER_PROJECT = """\
[project]
name = "greeter"
version = "0.1.0"
requires-python = ">=3.11"

[tool.ratchet]
agents = { greeter = "greeter.agent:greeter" }
source = "src"
"""
USER_AGENT = """\
from pydantic import BaseModel

from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, tool


class Greeting(BaseModel):
    name: str


@tool(side_effect=True)
def greet(args: Greeting, ctx: ToolContext) -> str:
    \"\"\"Greet someone, once per key.\"\"\"
    return f"hello {args.name} ({ctx.idempotency_key})"


def scripted(view: StepView) -> ToolCall | Done:
    if not view.messages:
        return ToolCall(name="greet", arguments={"name": "ada"})
    return Done(summary="greeted ada")


greeter = Agent(name="greeter", goal="Greet ada.", tools=[greet], policy=scripted)
"""
USER_CONTEXT = {"ratchet:rolloverAfter": "7", "ratchet:checkpointRetentionDays": "9"}
"""Context keys the user's deploy passes (`cdk synth -c ...`): the app's prop overrides the
first, the second applies."""


@dataclass(frozen=True)
class UserApp:
    folder: Path
    done: subprocess.CompletedProcess[str]
    out: Path

    @property
    def synthesized(self) -> SynthesizedTemplate:
        assert self.done.returncode == 0, self.done.stdout + self.done.stderr
        return SynthesizedTemplate.read(self.out / "MyAgents.template.json")

    @property
    def validation_report(self) -> dict[str, Any]:
        report: dict[str, Any] = json.loads((self.out / "validation-report.json").read_text())
        return report


def synthesize_user_app(folder: Path) -> UserApp:
    """A project of a user's own, outside this repository: a `[tool.ratchet]` pyproject.toml,
    its package, and a CDK app that uses the construct. The app runs as `cdk synth` runs it,
    with a plain interpreter in the project's folder that finds Ratchet's package and nothing
    else of this repository (not `cdk/`, not `tests/`), the context in `CDK_CONTEXT_JSON`,
    bundling skipped (`tests/infra/test_installed_bundle.py` bundles from a built wheel)."""
    (folder / "src" / "greeter").mkdir(parents=True)
    (folder / "src" / "greeter" / "__init__.py").write_text("")
    (folder / "src" / "greeter" / "agent.py").write_text(USER_AGENT)
    (folder / "pyproject.toml").write_text(USER_PROJECT)
    (folder / "app.py").write_text(USER_APP)
    out = folder / "cdk.out"
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AWS_", "CDK_", "RATCHET_")) and key != "PYTHONPATH"
    }
    environment |= {
        "PYTHONPATH": str(REPO_ROOT / "src"),
        "CDK_OUTDIR": str(out),
        "CDK_CONTEXT_JSON": json.dumps({"aws:cdk:bundling-stacks": [], **USER_CONTEXT}),
    }
    done = subprocess.run(
        [sys.executable, "app.py"],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return UserApp(folder, done, out)
