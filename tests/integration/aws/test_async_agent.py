"""An agent with async tools on the deployed shape (moto, the state machine executing): the
status example, registered as the stack registers it, run to done by the step function, its
tools and async resources on the container's one event loop, against a real HTTP server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet.cdk.project import Project
from ratchet.state import RunStatus
from tests.integration.aws.harness import AGENTS, Stack
from tests.status_service import StatusService, serving

EXAMPLE = Project.load(Path(__file__).resolve().parents[3] / "examples" / "status_agent")


@pytest.fixture
def status_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatusService]:
    with serving(monkeypatch) as service:
        yield service


@pytest.fixture
def status(stack: Stack) -> Stack:
    for folder in EXAMPLE.source:
        stack.monkeypatch.syspath_prepend(str(folder))
    stack.configure(agents=json.dumps({**AGENTS, **EXAMPLE.agents}))
    return stack


def test_the_async_example_runs_to_done_on_the_state_machine(
    status: Stack, status_service: StatusService
) -> None:
    code, started = status.post_run(
        {"agent": "status", "run_id": "oncall", "input": {"service": "payments"}}
    )
    assert (code, started["created"]) == (201, True), started

    assert status.finished(started["execution_name"])["status"] == "SUCCEEDED"
    final = status.head("oncall")
    assert final.status is RunStatus.DONE
    assert final.summary == "payments was down: Incident INC-1 is open for payments."
    assert status_service.posts == ["oncall/step-2"]
