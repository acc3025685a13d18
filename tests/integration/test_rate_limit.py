"""The model-call rate limit shared by every run on a store (`requests_per_minute`): a step over
it is queued, writing nothing and using no attempt, and goes on in the next minute; a worker
waits that minute out holding the run, and every run finishes. On AWS the queued step's Wait
lasts until the next minute, spread out."""

from __future__ import annotations

import logging
import random
from pathlib import Path

from ratchet.adapters.sqlite.rate import SqliteRateLimit
from ratchet.engine import Engine, Outcome, StepBudget, StepOutcome, take_steps
from ratchet.handlers.payloads import StepRequest, StepResult
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions, RunState, RunStatus
from ratchet.worker import Worker
from tests.bounded_agent import AGENT, in_flight

LOG = logging.getLogger("ratchet.tests.rate_limit")
MINUTE = 28_000_000 * 60


class Clock:
    def __init__(self) -> None:
        self.now = MINUTE + 30.0

    def __call__(self) -> float:
        return self.now


def _engine(runtime: LocalRuntime, clock: Clock, per_minute: int) -> Engine:
    return Engine(
        store=runtime.store,
        ledger=runtime.ledger,
        blobs=runtime.blobs,
        bind=runtime.bind,
        worker_id="test",
        logger=LOG,
        rate=SqliteRateLimit(runtime.db, clock=clock),
        requests_per_minute=per_minute,
    )


def _start(runtime: LocalRuntime, log: Path, count: int) -> list[str]:
    engine = runtime.engine(worker_id="starter", logger=LOG)
    run_ids = [f"r-{n}" for n in range(count)]
    for run_id in run_ids:
        options = RunOptions(params={"log": str(log), "steps": 1, "hold": 0})
        assert engine.start(RunState(run_id=run_id, agent=AGENT, goal="Work", options=options))
    return run_ids


def test_a_step_over_the_minutes_calls_is_queued_writing_nothing(tmp_path):
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db"))
    clock = Clock()
    try:
        run_ids = _start(runtime, tmp_path / "steps.log", 3)
        engine = _engine(runtime, clock, per_minute=2)
        taken = [engine.advance(run_id) for run_id in run_ids]
        held = runtime.store.load_head("r-2")

        assert [t.outcome for t in taken] == [Outcome.CONTINUE, Outcome.CONTINUE, Outcome.QUEUED]
        assert taken[2].retry_after == 30.0
        assert taken[2].bytes_written == 0
        assert held is not None
        assert (held.version, held.attempts, held.step) == (1, 0, 0)
        clock.now = MINUTE + 60
        assert engine.advance("r-2").outcome is Outcome.CONTINUE
    finally:
        runtime.close()


def test_a_worker_waits_for_the_next_minute_and_every_run_finishes(tmp_path):
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db"))
    clock = Clock()
    waited: list[float] = []

    def sleep(seconds: float) -> None:  # the worker's pause, on the test's clock
        waited.append(seconds)
        clock.now += seconds

    try:
        run_ids = _start(runtime, tmp_path / "steps.log", 4)
        Worker(_engine(runtime, clock, per_minute=3), runtime.leases, LOG, sleep=sleep).run(
            until_idle=True
        )
        heads = [runtime.store.load_head(run_id) for run_id in run_ids]
    finally:
        runtime.close()

    assert [h.status for h in heads if h] == [RunStatus.DONE] * 4
    assert all(h.attempts <= 1 for h in heads if h)  # waiting used no attempt
    _, started = in_flight(tmp_path / "steps.log")
    assert started == dict.fromkeys(run_ids, 1)
    # 8 steps (a tool step and a done step a run), 3 a minute: two waits for a new minute.
    assert len([s for s in waited if s >= 1]) == 2


def test_on_aws_a_queued_steps_wait_lasts_until_the_next_minute():
    state = RunState(run_id="r", agent=AGENT, goal="Work")
    request = StepRequest(run_id="r", generation=0, iteration=0)
    result = StepResult.after(
        request,
        StepOutcome.queued(state, retry_after=47.5),
        rollover_after=1000,
        queue_retry_seconds=10,
        rng=random.Random(7),
    )
    assert result.outcome == "queued"
    assert result.retry_in is not None
    assert 48 <= result.retry_in <= 57


def test_steps_taken_in_one_go_then_queued_leave_no_attempt_counted_for_the_queued_step(
    tmp_path,
):
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db"))
    clock = Clock()
    try:
        options = RunOptions(params={"log": str(tmp_path / "steps.log"), "steps": 5, "hold": 0})
        state = RunState(run_id="r", agent=AGENT, goal="Work", options=options)
        assert runtime.engine(worker_id="starter", logger=LOG).start(state)
        engine = _engine(runtime, clock, per_minute=2)
        budget = StepBudget(max_steps=10, seconds_left=lambda: 900.0)

        last = take_steps(engine, "r", budget)

        # Two steps in the minute; the rate limit then queued the third before it began, so
        # none of its attempts is counted: its attempt is its first when it goes.
        assert (last.outcome, budget.taken) == (Outcome.QUEUED, 3)
        held = runtime.store.load_head("r")
        assert held is not None
        assert (held.step, held.attempts) == (2, 0)
    finally:
        runtime.close()
