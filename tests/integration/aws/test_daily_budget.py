"""An agent's daily budget on AWS, with the state machine executing on moto and the step
Lambda's engine: runs of the daily agent ($0.03 a day) on a model of the deployment's own that
reports usage hold each step's bound on the agent's DynamoDB counter for the day; one finds
the day's budget spent and waits for the next UTC day in the state machine's Wait state
(`Sleep`), invoking nothing, until a person raises the day's budget through the client, which
wakes it. The counter is what the model billed. It also counts the DynamoDB requests a step
makes with the daily budget and without (the same agent, bounded by nothing)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import botocore.client
import pytest

from ratchet.client import Client
from ratchet.engine.spending import MICROS, day_of
from ratchet.handlers import _wiring
from ratchet.pricing import PRICES_VARIABLE
from ratchet.state import RunStatus, TimerWait, utcnow
from tests.budget_support import METERED, METERED_PRICES, metered
from tests.integration.aws.harness import AGENTS, MODELS, Stack, wait_until

DAY_BUDGET = 0.03


@contextmanager
def dynamodb_requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Every DynamoDB request any client makes meanwhile, by operation."""
    seen: Counter[str] = Counter()
    original = botocore.client.BaseClient._make_api_call  # type: ignore[attr-defined]

    def counted(self: Any, operation: str, params: dict[str, Any]) -> Any:
        if self.meta.service_model.service_name == "dynamodb":
            seen[operation] += 1
        return original(self, operation, params)

    with monkeypatch.context() as patched:
        patched.setattr(botocore.client.BaseClient, "_make_api_call", counted)
        yield seen


def _done(stack: Stack, run_id: str) -> bool:
    return stack.head(run_id).status is RunStatus.STOPPED


def _waits_for_the_day(stack: Stack, run_id: str) -> bool:
    head = stack.head(run_id)
    wait = head.waiting.request if head.waiting else None
    return isinstance(wait, TimerWait) and wait.day_budget_of == "daily"


def test_a_run_on_the_state_machine_waits_for_the_day_and_goes_on_once_raised(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(PRICES_VARIABLE, json.dumps(METERED_PRICES))
    stack.configure(
        agents=json.dumps(
            {
                **AGENTS,
                "daily": "tests.budget_agent:daily",
                "unbounded": "tests.budget_agent:unbounded",
            }
        ),
        models=json.dumps({**MODELS, "metered": METERED}),
    )
    metered.billed.clear()
    day = day_of(utcnow())

    # Given a run bounded by nothing, and one of the daily agent, each of 5 steps
    steps = 5
    costs: dict[str, Counter[str]] = {}
    for agent in ("unbounded", "daily"):
        with dynamodb_requests(monkeypatch) as seen:
            status, started = stack.post_run(
                {"agent": agent, "model": "metered", "run_id": f"aws-{agent}", "max_steps": steps}
            )
            assert status == 201, started
            # Waited for by its execution (Step Functions): a read of the head would count.
            assert stack.finished(started["execution_name"], timeout=120)["status"] == "SUCCEEDED"
        costs[agent] = seen
        assert _done(stack, f"aws-{agent}")
    counter = _wiring.runtime().daily_spend
    # the daily run's calls counted (the unbounded run's first, never)
    assert counter.spent("daily", day) == pytest.approx(
        sum(metered.billed[steps:]) * MICROS, abs=steps
    )

    # When another run of the daily agent finds the day's budget spent
    status, started = stack.post_run(
        {"agent": "daily", "model": "metered", "run_id": "aws-day", "max_steps": 100}
    )
    assert status == 201, started
    wait_until(lambda: _waits_for_the_day(stack, "aws-day"), timeout=120, what="the run to wait")
    head = stack.head("aws-day")
    assert head.waiting is not None
    wait = head.waiting.request
    assert isinstance(wait, TimerWait)
    tomorrow = (utcnow() + timedelta(days=1)).date()
    assert wait.until is not None
    assert wait.until.date() == tomorrow
    # Then it waits in the state machine, and the counter is what was billed, within budget
    execution = str(started["execution_name"])
    wait_until(
        lambda: "Sleep" in [e.get("name") for e in _entered_states(stack, execution)],
        timeout=60,
        what="the execution to sleep",
    )
    spent = counter.spent("daily", day)
    billed_daily = sum(metered.billed[steps:])
    assert spent <= DAY_BUDGET * MICROS
    assert spent == pytest.approx(billed_daily * MICROS, abs=len(metered.billed))
    calls = len(metered.billed)

    # When a person raises the day's budget by $0.02, the run is woken and goes on
    raised = Client(_wiring.runtime()).raise_day_budget("daily", 0.02, by="dana")
    assert raised.woken == ["aws-day"]
    wait_until(
        lambda: len(metered.billed) > calls and _waits_for_the_day(stack, "aws-day"),
        timeout=120,
        what="the run to go on and wait again",
    )
    assert counter.spent("daily", day) <= (DAY_BUDGET + 0.02) * MICROS

    per_step = {
        agent: {op: round(n / steps, 1) for op, n in sorted(seen.items())}
        for agent, seen in costs.items()
    }
    print(
        f"\non AWS: day's counter ${counter.spent('daily', day) / MICROS:.6f} of "
        f"${DAY_BUDGET + 0.02}; {wait.prompt}; DynamoDB requests a step (5 steps, "
        f"one execution): without a budget {per_step['unbounded']}, with a daily budget "
        f"{per_step['daily']}"
    )


def _entered_states(stack: Stack, execution: str) -> list[dict[str, Any]]:
    return [
        e.get("stateEnteredEventDetails", {})
        for e in stack.history(execution)
        if "stateEnteredEventDetails" in e
    ]
