"""A step's decision between the ledger and the commit: recorded under the step's key before
the tool runs, and not yet part of any checkpoint. Two guarantees hold it there:

- `ratchet gc` keeps the blob that holds the decision's arguments, however old, so a run that
  crashed after deciding resumes with the arguments it decided;
- of two engines that decide the same step differently, the one that records second stops
  (`StaleVersion`) and never calls its tool with its own decision.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from ratchet.adapters.sqlite.housekeeping import SqliteHousekeeping
from ratchet.engine import Binding, Engine, Outcome, StepOutcome
from ratchet.errors import InjectedFault, StaleVersion
from ratchet.faults import FaultPlan
from ratchet.housekeeping import BLOB_GRACE, collect_garbage
from ratchet.ports import LedgerStatus, ModelRequest
from ratchet.state import (
    INLINE_BYTES,
    Decision,
    Done,
    RunStatus,
    StepCompleted,
    ToolCall,
    utcnow,
)
from ratchet.tools import Agent, Tool, ToolContext
from tests.dynamodb_support import DynamoHarness, moto_tables
from tests.support import LOG, Harness, StubModel

PATIENCE = 30.0


class Note(BaseModel):
    text: str


@dataclass
class Notes:
    """A side-effecting tool that keeps every call it gets: (idempotency key, arguments)."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    def write(self, args: Note, ctx: ToolContext) -> str:
        self.calls.append((ctx.idempotency_key, args.text))
        return f"noted {len(args.text)} characters"

    def agent(self) -> Agent:
        return Agent(
            name="fake",
            tools=[Tool("write_note", "Write a note.", Note, self.write, side_effect=True)],
        )


@dataclass
class Writer:
    """Writes `text` at step 1, then reports done; `during` runs inside its step-1 call."""

    text: str
    during: Callable[[], None] = lambda: None
    calls: int = 0

    def decide(self, request: ModelRequest) -> Decision:
        if request.view.step > 1:
            return Done(summary="noted")
        self.calls += 1
        self.during()
        return ToolCall(name="write_note", arguments={"text": self.text})


def _run_until_stopped(advance: Callable[[], StepOutcome]) -> None:
    for _ in range(10):
        if advance().outcome is not Outcome.CONTINUE:
            return
    raise AssertionError("the run did not stop within 10 steps")


# --- gc keeps the blob of a decision no commit references yet ---------------------------------


def test_gc_keeps_the_blob_of_a_decision_recorded_before_a_crash_and_the_run_resumes(tmp_path):
    # Given a run whose step-1 decision has arguments over the inline budget (so they went to
    # a blob), and a crash after the decision was recorded, before the step's commit
    text = "a long note " * (INLINE_BYTES // 6)
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    notes, model = Notes(), Writer(text)
    crashing = harness.engine_for(
        notes.agent(), model, faults=FaultPlan.parse("raise:after_decision@1")
    )
    with pytest.raises(InjectedFault):
        crashing.advance("run")
    entry = harness.ledger.get("run/step-1")
    assert entry is not None
    assert entry.status is LedgerStatus.IN_PROGRESS
    blobs = list((tmp_path / "blobs").glob("*/*"))
    assert len(blobs) == 1, "the arguments are kept by reference"
    assert blobs[0].name in str(entry.decision)
    assert harness.engine.load("run").step == 0, "no commit references the blob"
    # ... and the blob older than gc's grace period
    then = time.time() - 2 * BLOB_GRACE.total_seconds()
    os.utime(blobs[0], (then, then))

    # When gc runs
    report = collect_garbage(
        SqliteHousekeeping(harness.db, blob_root=tmp_path / "blobs"),
        older_than=timedelta(days=1),
        now=utcnow(),
        dry_run=False,
    )

    # Then it kept the blob, and the run resumes without asking its model again and finishes
    # with the arguments it decided, applied once
    assert (report.blobs_deleted, report.blobs_kept) == (0, 1)
    assert blobs[0].exists()
    harness.restart()
    resumed = harness.engine_for(notes.agent(), model)
    _run_until_stopped(lambda: resumed.advance("run"))
    head = resumed.load("run")
    assert head.status is RunStatus.DONE
    assert notes.calls == [("run/step-1", text)]
    assert model.calls == 1
    [first] = [
        c.event for c in harness.store.list_checkpoints("run") if isinstance(c.event, StepCompleted)
    ]
    assert first.call.blob is not None
    assert first.call.blob.sha256 == blobs[0].name
    assert first.attempt == 2


# --- the loser of an idempotency conflict never acts on its own decision ----------------------

MakeHarness = Callable[[], Harness]


@pytest.fixture(params=["sqlite", "dynamodb"])
def make_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeHarness]:
    """Each call: another process's view of one store (its own connection or client)."""
    if request.param == "sqlite":
        yield lambda: Harness(tmp_path, StubModel(total=1))
        return
    with moto_tables():
        yield lambda: DynamoHarness(tmp_path, StubModel(total=1))


def _on_a_thread(
    advance: Callable[[], StepOutcome],
) -> tuple[threading.Thread, list[BaseException | StepOutcome]]:
    """`advance` started on a thread of its own, and the list its outcome (or what it raised)
    lands in once it ends."""
    ended: list[BaseException | StepOutcome] = []

    def run() -> None:
        try:
            ended.append(advance())
        except BaseException as error:
            ended.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, ended


def test_the_engine_that_records_its_decision_second_stops_and_never_acts_on_it(make_harness):
    # Given engine B, whose model would write "B", deciding step 1 while engine A, whose model
    # would write "A", decides the same step, records its decision and commits first
    first = make_harness()
    first.start()
    notes = Notes()
    in_model, go_on = threading.Event(), threading.Event()

    def stall() -> None:
        in_model.set()
        assert go_on.wait(PATIENCE), "the test never let B's model answer"

    b_model = Writer("B", during=stall)

    def engine_b() -> StepOutcome:
        second = make_harness()  # made on this thread: SQLite connections stay on theirs
        engine: Engine = second.engine_for(notes.agent(), b_model)
        return engine.advance("run")

    thread, b_result = _on_a_thread(engine_b)
    try:
        assert in_model.wait(PATIENCE), "B reached its model call"
        engine_a = first.engine_for(notes.agent(), Writer("A"))
        assert engine_a.advance("run").outcome is Outcome.CONTINUE
    finally:
        # When B's model answers, with a decision other than the one recorded
        go_on.set()
        thread.join(PATIENCE)

    # Then B stopped as stale, its tool call never happened, and A's decision stands
    assert b_model.calls == 1
    assert len(b_result) == 1
    assert isinstance(b_result[0], StaleVersion), b_result[0]
    assert notes.calls == [("run/step-1", "A")]
    entry = first.ledger.get("run/step-1")
    assert entry is not None
    # The commit moved A's decision into the step's record: the ledger keeps its hash only.
    assert (entry.status, entry.decision) == (LedgerStatus.COMPLETED, None)
    head = first.engine.load("run")
    assert (head.step, head.status) == (1, RunStatus.RUNNING)
    [record] = [c for c in first.store.list_checkpoints("run") if c.step == 1]
    assert isinstance(record.event, StepCompleted)
    assert record.event.call.arguments == {"text": "A"}


def test_the_engine_that_finds_its_step_committed_stops_before_its_model_and_tool(make_harness):
    # Given engine B setting up its agent for step 1 (its attempt counted) while engine A
    # takes step 1 and commits it: the key completed, its decision now only in the record
    first = make_harness()
    first.start()
    notes = Notes()
    b_model = Writer("B")
    in_setup, go_on = threading.Event(), threading.Event()

    def engine_b() -> StepOutcome:
        second = make_harness()  # made on this thread: SQLite connections stay on theirs
        binding = Binding(notes.agent(), b_model)

        def stalled_bind(state: object) -> Binding:
            in_setup.set()
            assert go_on.wait(PATIENCE), "the test never let B set up"
            return binding

        engine = Engine(
            store=second.store,
            ledger=second.ledger,
            blobs=second.blobs,
            bind=stalled_bind,
            worker_id="b",
            logger=LOG,
        )
        return engine.advance("run")

    thread, b_result = _on_a_thread(engine_b)
    try:
        assert in_setup.wait(PATIENCE), "B reached its agent's set-up"
        engine_a = first.engine_for(notes.agent(), Writer("A"))
        assert engine_a.advance("run").outcome is Outcome.CONTINUE
    finally:
        # When B goes on, and reads the step's key
        go_on.set()
        thread.join(PATIENCE)

    # Then B stopped as stale without asking its model or calling its tool again: the tool
    # ran once, with A's decision
    assert len(b_result) == 1
    assert isinstance(b_result[0], StaleVersion), b_result[0]
    assert b_model.calls == 0
    assert notes.calls == [("run/step-1", "A")]
    assert first.engine.load("run").step == 1
