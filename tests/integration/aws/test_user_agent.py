"""A user's agent on the deployed shape (moto, the state machine executing): the example
project's refund agent, registered by name as the stack registers it (from the project's
`[tool.ratchet]`), started through the runs API with an input, and run to done; above the
approval limit, through a person's approval from the emailed link."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ratchet.agents import load_agent
from ratchet.cdk.project import Project
from ratchet.handlers import _wiring
from ratchet.state import RunStatus
from tests.integration.aws.harness import AGENTS, APPROVER, Stack

EXAMPLE = Project.load(Path(__file__).resolve().parents[3] / "examples" / "billing_agent")


@pytest.fixture
def billing(stack: Stack) -> Stack:
    """The stack with the example deployed as `make deploy RATCHET_PROJECT=...` deploys it:
    its source folder importable (the bundle's top level), its agents in RATCHET_AGENTS."""
    for folder in EXAMPLE.source:
        stack.monkeypatch.syspath_prepend(str(folder))
    stack.configure(agents=json.dumps({**AGENTS, **EXAMPLE.agents}))
    return stack


def _refunds(stack: Stack, run_id: str) -> dict[str, Any]:
    state = stack.head(run_id)
    agent = load_agent(state.agent)
    assert agent.verify is not None
    return agent.verify(_wiring.runtime().context(run_id, state.options), state)


def test_a_small_refund_runs_to_done_and_is_applied_once(billing: Stack):
    status, started = billing.post_run(
        {
            "agent": "billing",
            "run_id": "refund-small",
            "input": {"order_id": "A-1001", "amount": 42.5},
        }
    )
    assert (status, started["created"]) == (201, True), started

    assert billing.finished(started["execution_name"])["status"] == "SUCCEEDED"
    final = billing.head("refund-small")
    assert final.status is RunStatus.DONE
    assert final.agent == EXAMPLE.agents["billing"]
    assert final.options.params == {"order_id": "A-1001", "amount": "42.50"}
    assert final.summary == "Refunded $42.50 on order A-1001."
    checks = _refunds(billing, "refund-small")
    assert checks["ok"], checks["problems"]
    assert checks["refunds"] == [
        {"order_id": "A-1001", "amount": "42.50", "key": "refund-small/step-2"}
    ]


def test_a_large_refund_waits_for_a_person_and_is_applied_after_the_approval(billing: Stack):
    _, started = billing.post_run(
        {"agent": "billing", "run_id": "refund-big", "input": {"order_id": "A-2002", "amount": 250}}
    )
    billing.parked("refund-big")
    assert _refunds(billing, "refund-big")["refunds"] == [], "refunded before the approval"
    page = billing.open(billing.link("refund-big"))
    assert "Refund $250.00 on order A-2002" in page.text

    decided = billing.submit(page.form_action, "approve", "customer is right")

    assert decided.status == 200
    assert billing.finished(started["execution_name"])["status"] == "SUCCEEDED"
    assert billing.head("refund-big").status is RunStatus.DONE
    assert billing.decisions("refund-big") == [(True, APPROVER, "customer is right")]
    assert _refunds(billing, "refund-big")["refunds"] == [
        {"order_id": "A-2002", "amount": "250.00", "key": "refund-big/step-3"}
    ]


def test_a_rejected_refund_is_never_applied(billing: Stack):
    _, started = billing.post_run(
        {"agent": "billing", "run_id": "refund-no", "input": {"order_id": "A-3003", "amount": 900}}
    )
    billing.parked("refund-no")
    page = billing.open(billing.link("refund-no"))

    billing.submit(page.form_action, "reject", "not without a receipt")

    assert billing.finished(started["execution_name"])["status"] == "SUCCEEDED"
    assert "the refund was rejected" in (billing.head("refund-no").summary or "")
    assert _refunds(billing, "refund-no")["refunds"] == []


def test_a_bad_input_is_refused_naming_the_field_and_starts_nothing(billing: Stack):
    status, answer = billing.post_run(
        {"agent": "billing", "run_id": "refund-bad", "input": {"order_id": "A-4004", "amount": -1}}
    )

    assert status == 400
    assert [p["field"] for p in answer["problems"]] == ["input.amount"]
    assert billing.executions() == []
