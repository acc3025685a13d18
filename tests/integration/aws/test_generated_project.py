"""The project `ratchet init` makes, on the deployed shape (moto, the state machine executing):
its agent registered as its own stack registers it (the `[tool.ratchet]` agents, the source
folder importable as the bundle's top level), started through the runs API, approved through
the emailed link, done; and the smoke test its workflow ends a deploy with (`ratchet doctor
--run`, as the workflow writes it) passing against that stack, through a local API Gateway."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import boto3
import pytest
import yaml  # type: ignore[import-untyped]

from ratchet import scaffold
from ratchet.agents import load_agent, project_agents
from ratchet.cli.app import main
from ratchet.handlers import _wiring, api
from ratchet.runtime.aws_settings import ENVIRONMENT
from ratchet.state import RunStatus
from tests.api_gateway import local_gateway
from tests.integration.aws.harness import (
    AGENTS,
    APP_TABLE,
    APPROVER,
    REGION,
    TABLES,
    FakeContext,
    Stack,
)

NAME = "smoke-agents"
"""A package name of its own: the generated package is imported into this process."""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / NAME
    names = scaffold.ProjectName.of(NAME, given=True)
    scaffold.write(scaffold.plan(folder, names, template="aws", version="0.1.0", force=False))
    return folder


@pytest.fixture
def generated(stack: Stack, project: Path) -> Stack:
    """The stack with the generated project deployed as its app.py deploys it."""
    registered = project_agents(project)
    for folder in registered.source:
        stack.monkeypatch.syspath_prepend(str(folder))
    stack.configure(agents=json.dumps({**AGENTS, **registered.agents}))
    return stack


def _payouts(stack: Stack, run_id: str) -> list[dict[str, str]]:
    state = stack.head(run_id)
    agent = load_agent(state.agent)
    assert agent.verify is not None
    checks = agent.verify(_wiring.runtime().context(run_id, state.options), state)
    assert checks["ok"], checks["problems"]
    payouts: list[dict[str, str]] = checks["payouts"]
    return payouts


def test_the_generated_agent_waits_for_the_approval_through_the_link_then_pays_once(
    generated: Stack,
):
    status, started = generated.post_run(
        {"agent": scaffold.AGENT, "run_id": "p-big", "input": {"recipient": "ada", "amount": 250}}
    )
    assert (status, started["created"]) == (201, True), started
    generated.parked("p-big")
    assert _payouts(generated, "p-big") == [], "paid before the approval"
    page = generated.open(generated.link("p-big"))
    assert "Pay $250.00 to ada." in page.text

    decided = generated.submit(page.form_action, "approve", "invoice checked")

    assert decided.status == 200
    assert generated.finished(started["execution_name"])["status"] == "SUCCEEDED"
    final = generated.head("p-big")
    assert (final.status, final.summary) == (RunStatus.DONE, "Paid $250.00 to ada.")
    assert final.agent == "smoke_agents.agent:agent"
    assert generated.decisions("p-big") == [(True, APPROVER, "invoice checked")]
    assert _payouts(generated, "p-big") == [
        {"recipient": "ada", "amount": "250.00", "key": "p-big/step-2"}
    ]


def test_the_generated_agent_pays_a_small_amount_without_asking(generated: Stack):
    _, started = generated.post_run(
        {"agent": scaffold.AGENT, "run_id": "p-small", "input": {"recipient": "ada", "amount": 5}}
    )

    assert generated.finished(started["execution_name"])["status"] == "SUCCEEDED"
    assert generated.head("p-small").status is RunStatus.DONE
    assert generated.emails() == []
    assert _payouts(generated, "p-small") == [
        {"recipient": "ada", "amount": "5.00", "key": "p-small/step-1"}
    ]


def _smoke_test_command(project: Path) -> list[str]:
    """The `ratchet doctor` command the generated workflow's last step runs, as words."""
    workflow = yaml.safe_load((project / ".github" / "workflows" / "deploy.yml").read_text())
    steps = workflow["jobs"]["deploy"]["steps"]
    (step,) = [s for s in steps if "ratchet doctor" in s.get("run", "")]
    script = step["run"]
    assert steps[-1] is step, "the smoke test ends the deploy"
    found = re.search(r"ratchet doctor .*", script.replace("\\\n", " "))
    assert found is not None
    return shlex.split(found.group(0))[1:]


def test_the_workflows_smoke_test_runs_the_agent_through_the_api_to_its_end(
    generated: Stack, project: Path, capfd: pytest.CaptureFixture[str]
):
    # Given the stack's functions as the stack configures them: notify knows the API's URL
    # and the link key (the state machine invokes it; the doctor reads its environment).
    words = _smoke_test_command(project)
    store = (
        f"dynamodb://{TABLES['checkpoints']}?ledger={TABLES['idempotency']}&app={APP_TABLE}"
        f"&region={REGION}&machine={generated.state_machine_arn}"
    )
    with local_gateway(api.handler, FakeContext("ratchet-api", "arn:ratchet-api")) as gateway:
        boto3.client("lambda", region_name=REGION).update_function_configuration(
            FunctionName="ratchet-notify",
            Environment={
                "Variables": {
                    ENVIRONMENT["public_url"]: gateway.url,
                    ENVIRONMENT["link_key_secret_arn"]: os.environ[
                        ENVIRONMENT["link_key_secret_arn"]
                    ],
                }
            },
        )
        capfd.readouterr()

        # When the workflow's command runs against it
        with pytest.raises(SystemExit) as ended:
            main([w.replace("$store", store) for w in words])

    said = capfd.readouterr().out.splitlines()
    lines = [line for line in said if not line.startswith("{")]  # the handlers' log lines
    assert ended.value.code == 0, lines
    run = [line for line in lines if line.startswith(("ok    run:", "FAIL  run:"))]
    assert len(run) == 1, lines
    assert re.fullmatch(
        r"ok    run: doctor-\d{8}T\d{6}Z-[0-9a-f]{6} started through the API, done at step 1 "
        r"in \d+\.\d s",
        run[0],
    ), run
    run_id = run[0].split()[2]
    assert generated.head(run_id).summary == "Paid $1.00 to smoke-test."
    methods = [method for method, _, _ in gateway.requests]
    assert methods == ["GET", "POST", *["GET"] * (len(methods) - 2)]
