"""The engine's guarantees, each checked at the exact point that protects it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest
from pydantic import BaseModel

from ratchet.adapters.s3_blobs import S3BlobStore
from ratchet.adapters.scripted import ScriptedModel
from ratchet.engine import Binding, Engine, Outcome, StepBudget, StepOutcome, take_steps
from ratchet.engine.fold import replay
from ratchet.errors import (
    InjectedFault,
    ModelOutputInvalid,
    ModelUnavailable,
    NotCancellable,
    NotRetryable,
    NotWaiting,
    StaleVersion,
    StepAttemptFailed,
    ToolFailed,
)
from ratchet.faults import FaultPlan
from ratchet.ports import BlobStore, ModelRequest, StepView
from ratchet.state import (
    MAX_ATTEMPTS,
    RECENT_STEPS,
    Decision,
    Done,
    PersonDecided,
    RunState,
    RunStatus,
    ToolCall,
)
from ratchet.tools import Agent, Tool, ToolContext
from tests.dynamodb_support import REGION, DynamoHarness, moto_tables
from tests.support import LOG, Harness, StubModel, fake_agent


def test_a_clean_run_commits_one_checkpoint_per_step_and_replays_to_its_head(tmp_path):
    harness = Harness(tmp_path, StubModel(total=12))
    harness.start()

    final = harness.run_until_stopped()

    assert final.status is RunStatus.DONE
    assert final.step == 12
    checkpoints = harness.store.list_checkpoints("run")
    assert [c.event.kind for c in checkpoints] == ["created"] + ["step"] * 12 + ["finished"]
    assert replay(checkpoints) == final
    assert all(c.worker_id == "worker-1" and c.size > 0 for c in checkpoints)


def test_the_state_stays_bounded_while_the_history_keeps_every_step(tmp_path):
    harness = Harness(tmp_path, StubModel(total=40))
    harness.start()

    final = harness.run_until_stopped()

    assert [m.step for m in final.messages] == list(range(36, 41))
    assert len(final.tool_results) == RECENT_STEPS
    digest = final.digest["write_row"]
    assert (digest.calls, digest.first_step, digest.last_step) == (35, 1, 35)
    assert digest.last_arguments is None  # no longer kept: the window and the summary are
    steps = [c.step for c in harness.store.list_checkpoints("run") if c.event.kind == "step"]
    assert steps == list(range(1, 41))


def test_the_attempt_is_counted_durably_before_the_model_is_called(tmp_path):
    harness = Harness(tmp_path, StubModel(total=3), faults=FaultPlan.parse("raise:before_model@1"))
    harness.start()

    with pytest.raises(InjectedFault):
        harness.engine.advance("run")

    head = harness.restart().engine.load("run")
    assert (head.step, head.attempts) == (0, 1)


def test_a_step_that_keeps_killing_its_process_fails_the_run_on_the_third_strike(tmp_path):
    model = StubModel(total=5)
    harness = Harness(tmp_path, model, faults=FaultPlan.parse("raise:after_tool@2"))
    harness.start()
    harness.engine.advance("run")
    for _ in range(MAX_ATTEMPTS):
        with pytest.raises(InjectedFault):
            harness.engine.advance("run")

    # A fresh worker does not try a fourth time: it marks the run failed.
    outcome = harness.restart().engine.advance("run")

    assert outcome.outcome is Outcome.FAILED
    head = harness.engine.load("run")
    assert head.status is RunStatus.FAILED
    assert head.step == 1, "the run keeps its last checkpoint"
    assert head.error == "step 2 failed 3 times; last error: the worker died during the step"
    assert harness.table.received.count("run/step-2") == 3
    assert harness.table.row_count == 2
    assert harness.engine.advance("run").outcome is Outcome.FAILED


@dataclass
class ScriptedFailures:
    """A model that answers with the given decisions or exceptions, in order."""

    answers: list[Decision | Exception]
    calls: int = 0

    def decide(self, request: ModelRequest) -> Decision:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, Exception):
            raise answer
        return answer


def _engine_with(harness: Harness, model: object) -> Engine:
    binding = Binding(fake_agent(harness.table), model)  # type: ignore[arg-type]
    return Engine(
        store=harness.store,
        ledger=harness.ledger,
        blobs=harness.blobs,
        bind=lambda state: binding,
        worker_id="worker-1",
        logger=LOG,
    )


@pytest.mark.parametrize(
    ("answer", "error_type", "message"),
    [
        (ToolCall(name="rm_rf", arguments={}), ModelOutputInvalid, "unknown tool 'rm_rf'"),
        (ToolCall(name="write_row", arguments={"n": "x"}), ModelOutputInvalid, "invalid arguments"),
        (ToolCall(name="write_row", arguments={}), ModelOutputInvalid, "n: Field required"),
        (ModelOutputInvalid("neither a tool call nor DONE"), ModelOutputInvalid, "neither"),
        (ModelUnavailable("rate limited (429)"), ModelUnavailable, "429"),
    ],
)
def test_bad_model_answers_are_failed_attempts_and_the_third_fails_the_run(
    tmp_path, answer, error_type, message
):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    engine = _engine_with(harness, ScriptedFailures([answer]))

    for attempt in (1, 2):
        with pytest.raises(error_type, match=message):
            engine.advance("run")
        head = engine.load("run")
        assert (head.status, head.attempts, head.step) == (RunStatus.RUNNING, attempt, 0)
        assert message in (head.error or "")
    outcome = engine.advance("run")

    assert outcome.outcome is Outcome.FAILED
    head = engine.load("run")
    assert head.error is not None
    assert head.error.startswith("step 1 failed 3 times; last error:")
    assert message in head.error
    assert harness.table.row_count == 0
    assert harness.ledger.get("run/step-1") is None, "an invalid decision is never recorded"


def test_a_failed_attempt_is_retried_and_the_run_recovers(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    good = ToolCall(name="write_row", arguments={"n": 1})
    model = ScriptedFailures([ModelUnavailable("overloaded"), good, ModelOutputInvalid("x")])
    engine = _engine_with(harness, model)

    with pytest.raises(ModelUnavailable):
        engine.advance("run")
    assert engine.advance("run").outcome is Outcome.CONTINUE

    head = engine.load("run")
    assert (head.step, head.attempts, head.error) == (1, 0, None)


def test_a_tool_that_raises_is_a_failed_attempt(tmp_path):
    harness = Harness(tmp_path, StubModel(total=2))
    harness.start()
    harness.table.db.execute("DROP TABLE rows")

    with pytest.raises(ToolFailed, match="write_row raised OperationalError"):
        harness.engine.advance("run")
    assert harness.engine.load("run").attempts == 1


def test_a_retried_step_reuses_the_recorded_decision(tmp_path):
    model = StubModel(total=3)
    harness = Harness(tmp_path, model, faults=FaultPlan.parse("raise:after_decision@1"))
    harness.start()
    with pytest.raises(InjectedFault):
        harness.engine.advance("run")
    assert harness.ledger.get("run/step-1") is not None

    harness.restart().run_until_stopped()

    assert model.calls == [1, 2, 3, 4]


def test_waiting_survives_restarts_and_resumes_only_on_a_decision(tmp_path):
    harness = Harness(tmp_path, StubModel(total=4, ask_at=2))
    harness.start()
    waiting = harness.run_until_stopped()
    assert waiting.status is RunStatus.WAITING
    assert waiting.waiting is not None
    assert waiting.waiting.request.prompt == "ok 2?"

    for worker in ("worker-2", "worker-3"):
        outcome = harness.restart(worker_id=worker).engine.advance("run")
        assert outcome.outcome is Outcome.WAITING
        assert harness.engine.load("run").version == waiting.version, "a waiting run is left alone"

    resumed = harness.engine.decide_waiting(
        "run", PersonDecided(approved=True, by="dana", comment="go")
    )
    assert resumed.status is RunStatus.RUNNING
    assert resumed.last_result == "Approved by dana: go"
    assert resumed.tool_results[-1].text == "Approved by dana: go"
    final = harness.run_until_stopped()
    assert final.status is RunStatus.DONE
    assert harness.table.keys() == ["run/step-1", "run/step-3", "run/step-4"]
    with pytest.raises(NotWaiting):
        harness.engine.decide_waiting("run", PersonDecided(approved=True, by="dana"))


def test_a_rejection_becomes_the_step_result(tmp_path):
    harness = Harness(tmp_path, StubModel(total=3, ask_at=1))
    harness.start()
    harness.run_until_stopped()

    state = harness.engine.decide_waiting(
        "run", PersonDecided(approved=False, by="sam", comment="not today")
    )

    assert state.last_result == "Rejected by sam: not today"
    assert replay(harness.store.list_checkpoints("run")) == state


def test_the_step_cap_stops_the_run_with_a_reason_not_as_done(tmp_path):
    harness = Harness(tmp_path, StubModel(total=100))
    harness.start(max_steps=3)

    final = harness.run_until_stopped()

    # The goal was never reported done: the run says it stopped, and why
    assert (final.status, final.step) == (RunStatus.STOPPED, 3)
    assert final.summary is not None
    assert "step cap of 3" in final.summary


def _until_stopped(harness: Harness) -> RunState:
    """Advance the run until it stops, taking failed attempts as a worker does."""
    for _ in range(50):
        with contextlib.suppress(StepAttemptFailed):
            if harness.engine.advance("run").outcome is not Outcome.CONTINUE:
                return harness.engine.load("run")
    raise AssertionError("the run did not stop")


def test_a_failed_run_retried_finishes_without_applying_an_applied_key_again(tmp_path):
    harness = Harness(tmp_path, StubModel(total=3))
    harness.start()
    harness.engine.advance("run")  # step 1 applies its key
    working = harness.table.apply

    def broken(args, ctx):
        raise RuntimeError("disk full")

    harness.table.apply = broken  # type: ignore[method-assign]
    harness.engine = harness._engine()  # the agent's tool binds the table's method
    failed = _until_stopped(harness)
    assert failed.status is RunStatus.FAILED
    assert "step 2 failed 3 times" in (failed.error or "")

    harness.table.apply = working  # type: ignore[method-assign]
    harness.engine = harness._engine()
    retried = harness.engine.retry("run", by="dana")
    assert (retried.status, retried.attempts, retried.error) == (RunStatus.RUNNING, 0, None)
    final = _until_stopped(harness)

    assert final.status is RunStatus.DONE
    assert harness.table.keys() == [f"run/step-{n}" for n in range(1, 4)]
    with pytest.raises(NotRetryable):
        harness.engine.retry("run", by="dana")


def test_a_cancelled_run_keeps_its_checkpoints_and_takes_no_more_steps(tmp_path):
    harness = Harness(tmp_path, StubModel(total=10))
    harness.start()
    harness.engine.advance("run")
    before = harness.store.list_checkpoints("run")

    cancelled = harness.engine.cancel("run", by="dana", reason="wrong table")

    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.summary == "Cancelled by dana: wrong table"
    assert harness.engine.advance("run").step == cancelled.step
    assert harness.store.list_checkpoints("run")[: len(before)] == before
    with pytest.raises(NotCancellable):
        harness.engine.cancel("run", by="dana")


def test_large_tool_output_goes_to_a_blob_and_the_state_keeps_a_preview(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    big = "x" * 50_000
    harness.table.apply = lambda args, ctx: big  # type: ignore[method-assign]
    harness.engine = harness._engine()

    harness.engine.advance("run")

    head = harness.engine.load("run")
    output = head.tool_results[-1]
    assert output.blob is not None
    assert len(output.text) < 1000
    assert harness.blobs.get(output.blob).decode() == big
    assert max(c.size for c in harness.store.list_checkpoints("run")) < 4096


def test_a_slow_worker_that_lost_the_run_is_rejected_and_applies_nothing(tmp_path):
    # Given worker B, which reads the run and counts its attempt, then stalls in the model call
    # while worker A (whose view is fresh) takes the same step and commits it
    from ratchet.adapters.sqlite.database import SqliteDatabase
    from ratchet.adapters.sqlite.ledger import SqliteLedger
    from ratchet.adapters.sqlite.store import SqliteCheckpointStore

    harness = Harness(tmp_path, StubModel(total=2))
    harness.start()
    fast = harness.engine
    in_model, proceed = threading.Event(), threading.Event()
    slow_result: list[BaseException | StepOutcome] = []

    @dataclass
    class StallingModel:
        inner: StubModel = field(default_factory=lambda: StubModel(total=2))

        def decide(self, request: ModelRequest) -> Decision:
            in_model.set()
            assert proceed.wait(timeout=30), "the test never let the slow model go on"
            return self.inner.decide(request)

    def slow_worker() -> None:
        slow_db = SqliteDatabase(tmp_path / "ratchet.db")
        binding = Binding(fake_agent(harness.table), StallingModel())
        slow = Engine(
            store=SqliteCheckpointStore(slow_db),
            ledger=SqliteLedger(slow_db),
            blobs=harness.blobs,
            bind=lambda state: binding,
            worker_id="slow",
            logger=LOG,
        )
        try:
            slow_result.append(slow.advance("run"))
        except BaseException as error:
            slow_result.append(error)

    thread = threading.Thread(target=slow_worker)
    thread.start()
    assert in_model.wait(timeout=30)
    raced = fast.advance("run")

    # When B comes back and tries to go on
    proceed.set()
    thread.join(timeout=30)

    # Then B was rejected, A's step stands, B wrote nothing, and step 1 was applied once
    assert len(slow_result) == 1
    assert isinstance(slow_result[0], StaleVersion)
    head = fast.load("run")
    assert raced.outcome is Outcome.CONTINUE
    assert head.step == 1
    assert {c.worker_id for c in harness.store.list_checkpoints("run")[1:]} == {"worker-1"}
    assert harness.table.row_count == 1


def test_a_worker_that_read_an_old_version_cannot_even_start_an_attempt(tmp_path):
    harness = Harness(tmp_path, StubModel(total=3))
    harness.start()
    stale_view = harness.engine.load("run")
    harness.engine.advance("run")

    with pytest.raises(StaleVersion):
        harness.store.begin_attempt("run", stale_view.version)
    assert harness.engine.load("run").attempts == 0


def test_four_workers_on_one_store_apply_every_step_exactly_once(tmp_path):
    from ratchet.adapters.sqlite.database import SqliteDatabase
    from ratchet.adapters.sqlite.leases import SqliteLeases
    from ratchet.worker import Worker

    total = 30
    harness = Harness(tmp_path, StubModel(total=total))
    for n in range(3):
        harness.start(f"run-{n}")
    errors: list[BaseException] = []

    def work(name: str) -> None:
        db = SqliteDatabase(tmp_path / "ratchet.db")
        replica = Harness.__new__(Harness)
        replica.root, replica.model, replica.faults, replica.worker_id = (
            tmp_path,
            StubModel(total=total),
            FaultPlan(),
            name,
        )
        replica.table, replica.db = harness.table.__class__(tmp_path / "app.db"), db
        try:
            Worker(replica._engine(), SqliteLeases(db), LOG, lease_seconds=60).run(until_idle=True)
        except BaseException as error:  # pragma: no cover - surfaced by the assertion
            errors.append(error)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors
    expected = sorted(f"run-{n}/step-{s}" for n in range(3) for s in range(1, total + 1))
    assert sorted(harness.table.keys()) == expected
    for n in range(3):
        assert harness.engine.load(f"run-{n}").status is RunStatus.DONE
        checkpoints = harness.store.list_checkpoints(f"run-{n}")
        steps = [c.step for c in checkpoints if c.event.kind == "step"]
        assert steps == list(range(1, total + 1)), "exactly one commit per step"


def test_an_agent_that_cannot_be_set_up_fails_attempts_with_the_reason(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()

    def broken(state: object) -> Binding:
        raise ConnectionError("app database unreachable")

    engine = Engine(
        store=harness.store,
        ledger=harness.ledger,
        blobs=harness.blobs,
        bind=broken,
        worker_id="w",
        logger=LOG,
    )
    for _ in range(2):
        with pytest.raises(StepAttemptFailed, match="app database unreachable"):
            engine.advance("run")

    assert engine.advance("run").outcome is Outcome.FAILED
    error = engine.load("run").error
    assert error is not None
    assert "ConnectionError: app database unreachable" in error


def test_each_step_counts_its_own_attempt_as_it_begins_and_its_commit_counts_none(tmp_path):
    harness = Harness(tmp_path, StubModel(total=5))
    created = harness.start()

    harness.engine.advance("run")
    after_one = harness.engine.load("run")
    harness.engine.advance("run")
    after_two = harness.engine.load("run")

    # Each step: its attempt counted (a version), then its commit (another); the commit leaves
    # the next step's attempt uncounted until that step begins.
    assert (after_one.step, after_one.attempts, after_one.version) == (1, 0, created.version + 2)
    assert (after_two.step, after_two.attempts, after_two.version) == (2, 0, after_one.version + 2)
    assert replay(harness.store.list_checkpoints("run")) == after_two


@pytest.mark.parametrize(("failures", "status"), [(2, RunStatus.DONE), (3, RunStatus.FAILED)])
def test_a_process_that_died_between_two_steps_left_no_strike_on_the_next(
    tmp_path, failures: int, status: RunStatus
):
    # Given steps taken in one go (as a step Lambda takes them) by a process that dies right
    # after step 1's commit, before step 2 begins
    harness = Harness(tmp_path, StubModel(total=3), faults=FaultPlan.parse("raise:after_commit@1"))
    harness.start()
    with pytest.raises(InjectedFault):
        take_steps(harness.engine, "run", StepBudget(max_steps=10, seconds_left=lambda: 900.0))
    assert (harness.engine.load("run").step, harness.engine.load("run").attempts) == (1, 0)

    # When step 2 then dies in its tool, in one fresh process after another
    for life in range(failures):
        harness.restart(faults=FaultPlan.parse("raise:after_tool@2"), worker_id=f"dies-{life}")
        with pytest.raises(InjectedFault):
            harness.engine.advance("run")
    final = harness.restart().run_until_stopped()

    # Then only its third death fails the run: the death before it began was no strike
    assert final.status is status
    assert harness.table.received.count("run/step-2") == failures + (status is RunStatus.DONE)
    if status is RunStatus.FAILED:
        assert (final.step, final.attempts) == (1, MAX_ATTEMPTS)
        assert final.error == "step 2 failed 3 times; last error: the worker died during the step"
    else:
        steps = [c.event for c in harness.store.list_checkpoints("run") if c.event.kind == "step"]
        assert [(e.step, e.attempt) for e in steps] == [(1, 1), (2, 3), (3, 1)]


def test_a_worker_still_fails_a_run_on_the_third_strike(tmp_path):
    from ratchet.adapters.sqlite.leases import SqliteLeases
    from ratchet.worker import Worker

    harness = Harness(tmp_path, StubModel(total=5), faults=FaultPlan.parse("raise:after_tool@3"))
    harness.start()

    Worker(harness.engine, SqliteLeases(harness.db), LOG, sleep=lambda _: None).run(until_idle=True)

    head = harness.engine.load("run")
    assert (head.status, head.step) == (RunStatus.FAILED, 2)
    assert head.error == "step 3 failed 3 times; last error: the worker died during the step"
    assert harness.table.received.count("run/step-3") == 3


def test_a_supervisor_can_fail_a_run_which_keeps_its_last_checkpoint(tmp_path):
    harness = Harness(tmp_path, StubModel(total=5))
    harness.start()
    harness.engine.advance("run")

    failed = harness.engine.fail("run", "Step Functions gave up: Lambda.ServiceException")
    again = harness.engine.fail("run", "a second supervisor")

    assert (failed.status, failed.step) == (RunStatus.FAILED, 1)
    assert failed.error == "Step Functions gave up: Lambda.ServiceException"
    assert again == failed
    assert harness.engine.advance("run").outcome is Outcome.FAILED


class Bulk(BaseModel):
    step: int
    payload: str


@pytest.fixture(params=["sqlite", "dynamodb"])
def any_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """The engine harness on SQLite with file blobs, or on DynamoDB with S3 blobs (moto)."""
    if request.param == "sqlite":
        yield Harness(tmp_path, StubModel(total=1))
        return
    with moto_tables():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket="blobs")

        class WithS3(DynamoHarness):
            @property
            def blobs(self) -> BlobStore:
                return S3BlobStore(s3, "blobs")

        yield WithS3(tmp_path, StubModel(total=1))


def test_an_agent_passing_80_kb_of_arguments_every_step_finishes_with_a_bounded_head(
    any_backend,
):
    # Given an agent whose every call carries 80 KB of arguments, over 20 steps
    harness = any_backend
    harness.start(max_steps=30)
    received: list[Bulk] = []

    def load(args: Bulk, ctx: ToolContext) -> str:
        received.append(args)
        return f"loaded {len(args.payload):,} characters"

    def policy(view: StepView) -> Decision:
        if view.step > 20:
            return Done(summary="loaded 20 payloads")
        return ToolCall(name="load", arguments={"step": view.step, "payload": _payload(view.step)})

    agent = Agent(name="bulk", tools=[Tool("load", "Load a payload.", Bulk, load)])
    engine = harness.engine_for(agent, ScriptedModel(policy))

    # When it runs to the end
    final = _run(engine)

    # Then it finishes, the tool got its full arguments every time, and nothing it wrote grew
    # with the arguments: the head, each record and each ledger entry keep a preview by reference
    assert (final.status, final.step, final.error) == (RunStatus.DONE, 20, None)
    assert [(a.step, a.payload) for a in received] == [(n, _payload(n)) for n in range(1, 21)]
    assert len(final.model_dump_json()) < 4_096
    assert max(c.size for c in harness.store.list_checkpoints("run")) < 12_288
    assert final.messages[-1].arguments == {"step": 20, "payload": "[80,002 bytes, by reference]"}
    assert final.messages[-1].blob is not None
    entry = harness.ledger.get("run/step-20")
    assert entry is not None
    assert len(json.dumps(entry.decision)) < 1_000
    blob = final.messages[-1].blob
    assert json.loads(harness.blobs.get(blob)) == {"step": 20, "payload": _payload(20)}
    assert replay(harness.store.list_checkpoints("run")) == final


def _payload(step: int) -> str:
    return f"{step:03d}" + "x" * (80_000 - 3)


def _run(engine: Engine) -> RunState:
    for _ in range(100):
        if engine.advance("run").outcome is not Outcome.CONTINUE:
            return engine.load("run")
    raise AssertionError("the run did not stop")


def test_a_large_done_summary_is_kept_by_reference(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    summary = "s" * 50_000
    binding = Binding(fake_agent(harness.table), ScriptedModel(lambda view: Done(summary=summary)))
    engine = Engine(
        store=harness.store,
        ledger=harness.ledger,
        blobs=harness.blobs,
        bind=lambda state: binding,
        worker_id="w",
        logger=LOG,
    )

    assert engine.advance("run").outcome is Outcome.DONE

    kept = engine.load("run").summary or ""
    assert len(kept) < 1_000
    assert kept.endswith(
        "… [50,000 bytes in blob " + hashlib.sha256(summary.encode()).hexdigest()[:12] + "]"
    )
