"""What the read commands say of a wait (`ratchet.cli.readout`, `ratchet.summary`, which load
no pydantic) is what the models say: the kind `ratchet.state.wait_kind` gives and the prompt
each wait has, from a head as it is dumped and as a store keeps it (no field at its default,
`kind` among them)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ratchet import summary
from ratchet.cli import readout
from ratchet.client import Wait
from ratchet.state import (
    ApprovalRequest,
    ChildrenWait,
    EventWait,
    RunState,
    RunStatus,
    TimerWait,
    Waiting,
    wait_kind,
)
from ratchet.stored import head_json

AT = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
REQUESTS: list[ApprovalRequest | EventWait | TimerWait | ChildrenWait] = [
    ApprovalRequest(prompt="Drop the table?", details={"rows": 2}),
    EventWait(name="ci-finished", timeout_seconds=7200, expires_at=AT),
    EventWait(name="deploy.done"),
    TimerWait(seconds=60, until=AT),
    TimerWait(until=AT),
    TimerWait(until=AT, day_budget_of="support", day_budget_usd=5.0),
    TimerWait(until=AT, day_budget_of="support", day_budget_usd=0.03),
    ChildrenWait(children=["r1.step-3.0", "r1.step-3.1"]),
    ChildrenWait(children=["r1.step-3.0"], wait="first"),
]


def _head(request: ApprovalRequest | EventWait | TimerWait | ChildrenWait) -> RunState:
    return RunState(
        run_id="r1",
        agent="a",
        goal="g",
        status=RunStatus.WAITING,
        step=3,
        waiting=Waiting(step=3, request=request, since=AT),
    )


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_a_wait_reads_as_the_models_say_whether_dumped_or_stored(request_):
    state = _head(request_)
    dumped = state.model_dump(mode="json")["waiting"]
    stored = json.loads(head_json(state))["waiting"]
    model = Wait.of(state)
    assert model is not None

    for waiting in (dumped, stored):
        assert summary.wait_kind(waiting["request"]) == wait_kind(request_)
        said = readout.wait_of(waiting)
        assert said["kind"] == model.kind
        assert said["name"] == model.name
        assert said["prompt"] == request_.prompt == model.prompt
        assert said["until"] == (model.until.isoformat() if model.until else None)
        assert said["step"] == 3
        assert said.get("children") == model.children


def test_an_event_and_a_timer_say_how_to_settle_them():
    event = readout.wait_of(_head(REQUESTS[1]).model_dump(mode="json")["waiting"])
    endless = readout.wait_of(_head(REQUESTS[2]).model_dump(mode="json")["waiting"])
    timer = readout.wait_of(_head(REQUESTS[3]).model_dump(mode="json")["waiting"])

    assert readout.wait_hint("r1", event) == (
        "for the event 'ci-finished' (until 2026-12-02 10:00:00 UTC; send it: ratchet send "
        "r1 ci-finished --data JSON)"
    )
    assert readout.wait_hint("r1", endless).startswith("for the event 'deploy.done' (no timeout;")
    assert readout.wait_hint("r1", timer) == (
        "sleeping until 2026-12-02 10:00:00 UTC (wake it: ratchet wake r1)"
    )
    assert readout.wait_announcement("r1", timer).endswith("; a worker resumes it then")


def test_a_children_wait_names_its_children():
    both = readout.wait_of(_head(REQUESTS[7]).model_dump(mode="json")["waiting"])
    first = readout.wait_of(json.loads(head_json(_head(REQUESTS[8])))["waiting"])

    assert readout.wait_hint("r1", both) == (
        "waiting for 2 child runs to end: r1.step-3.0, r1.step-3.1"
    )
    assert readout.wait_announcement("r1", first) == (
        "r1 is waiting for the first of 1 child run to end: r1.step-3.0"
    )


def test_a_run_waiting_for_its_agents_daily_budget_says_so_and_how_to_raise_it():
    waiting = readout.wait_of(_head(REQUESTS[5]).model_dump(mode="json")["waiting"])

    assert waiting["prompt"] == (
        "agent support's daily budget of $5.00 is spent; resumes at 2026-12-02T10:00Z or "
        "when raised"
    )
    assert readout.wait_hint("r1", waiting) == (
        f"{waiting['prompt']} (ratchet budget raise support --usd N)"
    )
