"""At-most-once tools on a local store: a crash at every point of a step that calls one (the
process dies there: an injected fault, unrecorded) never calls it twice. Where the call may
have run (its start was recorded, no outcome was), the retry does not call it: the run parks
and asks a person whether it ran; "it ran" goes on with what they said, "it did not" makes the
call again, once, at the next step (no model call). Every crash point ends with the wire sent
exactly once and the run done: no run stranded."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ratchet.client import Client
from ratchet.engine import Outcome
from ratchet.errors import InjectedFault
from ratchet.faults import FaultPlan, FaultPoint
from ratchet.ports import LedgerStatus
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions, RunState, RunStatus
from tests.at_most_once_agent import AGENT, agent, wires

LOG = logging.getLogger("ratchet.tests.at_most_once")
POINTS = [
    FaultPoint.BEFORE_MODEL,
    FaultPoint.AFTER_MODEL,
    FaultPoint.AFTER_DECISION,
    FaultPoint.AFTER_CALL_STARTED,
    FaultPoint.AFTER_TOOL,
    FaultPoint.BEFORE_COMMIT,
    FaultPoint.AFTER_COMMIT,
]
MAY_HAVE_RUN = {FaultPoint.AFTER_CALL_STARTED, FaultPoint.AFTER_TOOL, FaultPoint.BEFORE_COMMIT}
"""Where the call's start is recorded and its outcome is not: the retry must ask."""


def _runtime(root: Path) -> LocalRuntime:
    return LocalRuntime.open(LocalSettings(store=f"sqlite:///{root / 'ratchet.db'}"))


def _start(root: Path) -> Path:
    bank = root / "bank.log"
    runtime = _runtime(root)
    options = RunOptions(params={**agent.default_params, "bank": str(bank)})
    state = RunState(run_id="pay", agent=AGENT, goal="Pay ACME", options=options)
    assert runtime.engine(worker_id="starter", logger=LOG).start(state)
    runtime.close()
    return bank


def _advance_until_stopped(root: Path, faults: FaultPlan) -> Outcome | None:
    """Advance until the run stops (its outcome) or the fault fires (None)."""
    runtime = _runtime(root)
    engine = runtime.engine(worker_id="worker", logger=LOG, faults=faults)
    try:
        for _ in range(20):
            try:
                outcome = engine.advance("pay")
            except InjectedFault:
                return None
            if outcome.outcome is not Outcome.CONTINUE:
                return outcome.outcome
        raise AssertionError("the run did not stop")
    finally:
        runtime.close()


def _answer(root: Path, *, ran: bool) -> None:
    runtime = _runtime(root)
    try:
        client = Client(runtime, worker_id="dana", logger=LOG)
        client.approve("pay", by="dana", answer={"ran": ran, "result": "ref 42" if ran else ""})
    finally:
        runtime.close()


@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_any_point_of_the_call_sends_the_wire_once_and_strands_no_run(tmp_path, point):
    bank = _start(tmp_path)

    assert _advance_until_stopped(tmp_path, FaultPlan.parse(f"raise:{point}@1")) is None
    stopped = _advance_until_stopped(tmp_path, FaultPlan())
    asked = stopped is Outcome.WAITING
    if asked:
        # The person checks the bank, as the question asks them to, and says what they saw.
        _answer(tmp_path, ran=len(wires(bank)) == 1)
        stopped = _advance_until_stopped(tmp_path, FaultPlan())

    assert asked is (point in MAY_HAVE_RUN)
    assert stopped is Outcome.DONE
    assert len(wires(bank)) == 1


def test_the_question_names_the_tool_the_step_and_the_arguments(tmp_path):
    _start(tmp_path)
    _advance_until_stopped(tmp_path, FaultPlan.parse("raise:after_call_started@1"))
    assert _advance_until_stopped(tmp_path, FaultPlan()) is Outcome.WAITING

    runtime = _runtime(tmp_path)
    try:
        head = runtime.store.load_head("pay")
        assert head is not None
        assert head.waiting is not None
        request = head.waiting.request
        entry = runtime.ledger.get("pay/step-1")
    finally:
        runtime.close()
    assert (
        request.prompt
        == "send_wire may or may not have run at step 1 with these arguments: did it?"
    )
    assert request.details == {
        "tool": "send_wire",
        "step": 1,
        "arguments": '{"amount": 120, "to": "ACME"}',
        "idempotency_key": "pay/step-1",
    }
    assert entry is not None
    assert entry.status is LedgerStatus.COMPLETED  # the asking step's commit completed it
    assert head.last_result is not None
    assert head.last_result.startswith("send_wire may or may not have run at step 1")


def test_it_did_not_run_makes_the_same_call_once_without_asking_the_model(tmp_path):
    bank = _start(tmp_path)
    _advance_until_stopped(tmp_path, FaultPlan.parse("raise:after_call_started@1"))
    _advance_until_stopped(tmp_path, FaultPlan())

    _answer(tmp_path, ran=False)
    assert _advance_until_stopped(tmp_path, FaultPlan()) is Outcome.DONE

    runtime = _runtime(tmp_path)
    try:
        steps = [c.event for c in runtime.store.list_checkpoints("pay") if c.event.kind == "step"]
        head = runtime.store.load_head("pay")
    finally:
        runtime.close()
    assert [line.split()[:3] for line in wires(bank)] == [["pay", "2", "120"]]
    first, again = steps
    assert again.call == first.call  # the same call, under step 2's key
    assert again.usage is None  # no model was asked
    assert head is not None
    assert head.status is RunStatus.DONE
    assert head.summary == "wired 120 to ACME"


def test_it_ran_goes_on_with_what_the_person_said(tmp_path):
    bank = _start(tmp_path)
    _advance_until_stopped(tmp_path, FaultPlan.parse("raise:before_commit@1"))
    _advance_until_stopped(tmp_path, FaultPlan())

    _answer(tmp_path, ran=True)
    assert _advance_until_stopped(tmp_path, FaultPlan()) is Outcome.DONE

    runtime = _runtime(tmp_path)
    try:
        head = runtime.store.load_head("pay")
    finally:
        runtime.close()
    assert len(wires(bank)) == 1
    assert head is not None
    assert head.summary == "dana says send_wire ran: ref 42"
