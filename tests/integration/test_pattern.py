"""PATTERN.md's two required tests, literally: a stub LLM, a fake tool, a crash, a restart.

They run on every store and ledger backend: SQLite, and DynamoDB on moto.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ratchet.engine.decisions import result_digest
from ratchet.errors import InjectedFault
from ratchet.faults import FaultPlan
from ratchet.ports import LedgerStatus
from ratchet.state import RunStatus
from tests.dynamodb_support import DynamoHarness, moto_tables
from tests.support import Harness, StubModel

MakeHarness = Callable[[StubModel, FaultPlan], Harness]


@pytest.fixture(params=["sqlite", "dynamodb"])
def make_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeHarness]:
    if request.param == "sqlite":
        yield lambda model, faults: Harness(tmp_path, model, faults=faults)
        return
    with moto_tables():
        yield lambda model, faults: DynamoHarness(tmp_path, model, faults=faults)


def test_raise_after_step_2_checkpoint_resumes_from_step_3(make_harness):
    # Given a run whose process raises right after step 2's checkpoint
    model = StubModel(total=5)
    harness = make_harness(model, FaultPlan.parse("raise:after_commit@2"))
    harness.start("run")
    harness.engine.advance("run")
    with pytest.raises(InjectedFault):
        harness.engine.advance("run")

    # When a fresh process restarts the run with the same id
    assert harness.restart().engine.load("run").step == 2
    final = harness.run_until_stopped("run")

    # Then steps 1 and 2 reached the tool exactly once each, and the run went on from step 3
    assert harness.table.received.count("run/step-1") == 1
    assert harness.table.received.count("run/step-2") == 1
    assert harness.table.received == [f"run/step-{n}" for n in range(1, 6)]
    assert model.calls == [1, 2, 3, 4, 5, 6]
    assert final.status is RunStatus.DONE
    assert final.summary == "wrote 5 rows"
    resumed = [c for c in harness.store.list_checkpoints("run") if c.worker_id == "worker-2"]
    assert resumed[0].step == 3


def test_raise_after_step_3_tool_before_checkpoint_applies_once(make_harness):
    # Given a run whose process raises after step 3's tool call, before its checkpoint
    model = StubModel(total=5)
    harness = make_harness(model, FaultPlan.parse("raise:after_tool@3"))
    harness.start("run")
    harness.engine.advance("run")
    harness.engine.advance("run")
    with pytest.raises(InjectedFault):
        harness.engine.advance("run")
    rows_after_crash = harness.table.row_count
    assert harness.engine.load("run").step == 2
    in_flight = harness.ledger.get("run/step-3")
    assert in_flight is not None
    assert in_flight.status is LedgerStatus.IN_PROGRESS

    # When it restarts with the same run id
    final = harness.restart().run_until_stopped("run")

    # Then the tool received run/step-3 twice but applied it once, and the run completed
    assert harness.table.received.count("run/step-3") == 2
    assert rows_after_crash == 3
    assert harness.table.keys() == [f"run/step-{n}" for n in range(1, 6)]
    assert final.status is RunStatus.DONE
    # The retried step reused the recorded decision: the model was not paid twice for it.
    assert model.calls.count(3) == 1
    completed = harness.ledger.get("run/step-3")
    assert completed is not None
    # The ledger keeps the result's hash; the result itself is in the step record.
    assert (completed.status, completed.result) == (
        LedgerStatus.COMPLETED,
        result_digest("row 3 already written"),
    )
