"""Events and wakes through the deployed runs API (moto): the same routes and client as
`ratchet serve`, over the DynamoDB mailbox: a run's event is queued (202) or delivered (200)
once per id, and a refusal is a JSON 4xx naming the field that writes nothing."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from ratchet.state import RunOptions, RunState, RunStatus
from tests.integration.aws.harness import AGENTS, Stack
from tests.integration.aws.test_api import call
from tests.waits_agent import AGENT, agent

LOG = logging.getLogger("ratchet.tests.aws_api_waits")
PASSED = {"conclusion": "success"}


@pytest.fixture
def waits(stack: Stack) -> Stack:
    stack.configure(agents=json.dumps({**AGENTS, "waits": AGENT}))
    return stack


def _runtime() -> Any:
    from ratchet.handlers import _wiring

    return _wiring.runtime()


def _start(run_id: str, *, park: bool) -> None:
    """A run of the waits agent, created in the tables (no execution works it here); with
    `park`, its first step taken in process, so it waits for `ci-finished`."""
    runtime = _runtime()
    engine = runtime.engine(worker_id="test", logger=LOG)
    state = RunState(run_id=run_id, agent=AGENT, goal=agent.goal, options=RunOptions())
    assert engine.start(state)
    if park:
        engine.advance(run_id)
        assert runtime.store.load_head(run_id).status is RunStatus.WAITING


def _items(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    return stack.items()


def test_an_event_is_queued_then_delivered_once_through_the_deployed_api(waits: Stack):
    _start("early", park=False)
    _start("parked", park=True)

    queued = call("POST", "/runs/early/events/ci-finished", {"data": PASSED, "event_id": "q1"})
    delivered = call("POST", "/runs/parked/events/ci-finished", {"data": PASSED, "event_id": "d1"})
    again = call("POST", "/runs/parked/events/ci-finished", {"data": PASSED, "event_id": "d1"})

    assert (queued[0], queued[1]["status"]) == (202, "queued")
    assert (delivered[0], delivered[1]["status"], delivered[1]["step"]) == (200, "delivered", 1)
    assert (again[0], again[1]) == (200, {**delivered[1], "duplicate": True})
    head = waits.head("parked")
    assert (head.status, head.last_result) == (
        RunStatus.RUNNING,
        'Event \'ci-finished\': {"conclusion": "success"}',
    )
    status, run = call("GET", "/runs/parked")
    assert (status, run["wait"]) == (200, None)


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/runs/nope/events/ci-finished", {"data": PASSED}, 404, "run_id"),
        ("/runs/parked/events/deploy", {"data": PASSED}, 404, "name"),
        (
            "/runs/parked/events/ci-finished",
            {"data": {"conclusion": "maybe"}},
            422,
            "data.conclusion",
        ),
        ("/runs/parked/events/ci-finished", {"event_id": "no spaces"}, 400, "event_id"),
        ("/runs/parked/wake", None, 409, "run_id"),
    ],
)
def test_a_refused_event_or_wake_names_the_field_and_writes_nothing(
    waits: Stack, path: str, body: Any, status: int, field: str
):
    _start("parked", park=True)
    before = _items(waits)

    answered, answer = call("POST", path, body)

    assert answered == status, answer
    assert [p["field"] for p in answer["problems"]] == [field]
    assert "maybe" not in json.dumps(answer)
    assert _items(waits) == before
