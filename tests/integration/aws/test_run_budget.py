"""A run's budget on AWS, with the state machine executing on moto and the step Lambda's
engine: a run of the budget agent on a model of the deployment's own that reports usage stops
calling it at its $0.05 budget and parks for a person (the same request, email and page as any
approval), who raises it through the emailed link's page; it goes on and parks again at the new
bound, and what the model billed never passes the budget."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest

from ratchet.pricing import PRICES_VARIABLE
from ratchet.state import ApprovalRequest, RunStatus
from ratchet.waits import ApprovalStatus
from tests.budget_support import METERED, METERED_PRICES, metered
from tests.integration.aws.harness import AGENTS, MODELS, Stack, wait_until


def parked_at(stack: Stack, run_id: str, usd: float) -> ApprovalRequest:
    wait_until(
        lambda: (
            sum(a.status is ApprovalStatus.PENDING for a in stack.approvals(run_id)) == 1
            and stack.head(run_id).status is RunStatus.WAITING
        ),
        timeout=120,
        what=f"{run_id} to park for its budget",
    )
    head = stack.head(run_id)
    assert head.waiting is not None
    request = head.waiting.request
    assert isinstance(request, ApprovalRequest)
    assert request.raises_budget
    assert request.details["budget_usd"] == usd
    assert head.budget is not None
    assert head.budget.spent_usd == pytest.approx(metered.billed_usd, abs=1e-6)
    assert metered.billed_usd <= usd
    return request


def test_a_run_on_the_state_machine_parks_at_its_budget_and_goes_on_once_raised(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(PRICES_VARIABLE, json.dumps(METERED_PRICES))
    stack.configure(
        agents=json.dumps({**AGENTS, "budgeted": "tests.budget_agent:agent"}),
        models=json.dumps({**MODELS, "metered": METERED}),
    )
    metered.billed.clear()
    status, started = stack.post_run(
        {"agent": "budgeted", "model": "metered", "budget_usd": 0.05, "run_id": "aws-budget"}
    )
    assert status == 201, started

    request = parked_at(stack, "aws-budget", 0.05)
    calls = len(metered.billed)
    print(
        f"\non AWS: parked after {calls} calls, billed ${metered.billed_usd:.6f}: {request.prompt}"
    )
    assert calls == stack.head("aws-budget").step > 3

    # A person raises it by $0.02 through the emailed link's page
    (email,) = stack.emails_about("aws-budget")
    form = urlencode({"decision": "approve", "answer.raise_usd": "0.02"})
    page = stack.request(
        "POST", email.link, form, {"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert page.status == 200, page.text

    wait_until(
        lambda: len(stack.emails_about("aws-budget")) == 2,
        timeout=120,
        what="the run to park again, asking again",
    )
    parked_at(stack, "aws-budget", 0.07)
    assert len(metered.billed) > calls
    assert metered.billed_usd <= 0.07
