"""Between failed attempts a run backs off: the engine records in the head when the next
attempt may start (`not_before`, exponential with full jitter, as the state machine's Retry),
the local worker waits until then holding its lease, and the next attempt's model is told why
the previous one failed. Time and chance are injected: no test depends on the wall clock."""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from ratchet.adapters.scripted import ScriptedModel
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.leases import SqliteLeases
from ratchet.adapters.sqlite.ledger import SqliteLedger
from ratchet.adapters.sqlite.store import SqliteCheckpointStore
from ratchet.backoff import DEFAULT_BACKOFF, Backoff
from ratchet.engine import Binding, Engine, Outcome
from ratchet.errors import ModelUnavailable, StepAttemptFailed, ToolFailed
from ratchet.ports import Model, ModelRequest, StepView
from ratchet.state import MAX_ATTEMPTS, AttemptFailed, Decision, Done, RunStatus, ToolCall
from ratchet.tools import Agent, Tool, ToolContext
from ratchet.worker import Worker
from tests.support import LOG, Harness, StubModel

ASL = Path(__file__).parents[2] / "statemachine" / "agent_run.asl.json"
SEED = 11
"""With this seed the two draws happen to grow, as their ceilings do (asserted below)."""
PATIENCE = 10.0
"""Real seconds a test waits for something that takes milliseconds when it works."""


class Clock:
    """The engine's and the worker's time; only the worker's `sleep` moves it."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)
        self.sleeps: list[float] = []

    def __call__(self) -> datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += timedelta(seconds=seconds)


class Echo(BaseModel):
    text: str = ""


def echo_once(view: StepView) -> Decision:
    if view.step == 1:
        return ToolCall(name="echo", arguments={"text": "hi"})
    return Done(summary="done")


class FlakyModel:
    """Raises `failures` in order, then answers as `echo_once`; notes when (on the clock) it
    was called and what it was told about the previous attempt."""

    def __init__(self, clock: Clock, *failures: Exception) -> None:
        self.clock = clock
        self.failures = list(failures)
        self.called_at: list[datetime] = []
        self.told: list[str | None] = []

    def decide(self, request: ModelRequest) -> Decision:
        self.called_at.append(self.clock())
        self.told.append(request.view.previous_failure)
        if self.failures:
            raise self.failures.pop(0)
        return echo_once(request.view)


def engine_for(
    harness: Harness,
    model: Model,
    clock: Callable[[], datetime],
    *,
    tool: Callable[[Echo, ToolContext], str] = lambda args, ctx: args.text,
    backoff: Backoff = DEFAULT_BACKOFF,
    seed: int = SEED,
    db: SqliteDatabase | None = None,
) -> Engine:
    """An engine on the harness's store (through `db`, a connection of the calling thread, if
    given) whose one tool is `tool`, backing off by `backoff` with a source seeded by `seed`."""
    agent = Agent(name="echo", tools=[Tool("echo", "Echo the text.", Echo, tool)])
    binding = Binding(agent, model)
    db = db or harness.db
    return Engine(
        store=SqliteCheckpointStore(db),
        ledger=SqliteLedger(db),
        blobs=harness.blobs,
        bind=lambda state: binding,
        worker_id="w",
        logger=LOG,
        backoff=backoff,
        rng=random.Random(seed),
        clock=clock,
    )


def delays(*attempts: int, backoff: Backoff = DEFAULT_BACKOFF, seed: int = SEED) -> list[float]:
    """What the engine draws after these failed attempts, in order, from the seeded source."""
    rng = random.Random(seed)
    return [backoff.delay(attempt, rng) for attempt in attempts]


def recorded(harness: Harness) -> list[AttemptFailed]:
    return [
        c.event for c in harness.store.list_checkpoints("run") if isinstance(c.event, AttemptFailed)
    ]


def waited(failure: AttemptFailed, since: datetime) -> float:
    assert failure.not_before is not None
    return (failure.not_before - since).total_seconds()


@pytest.fixture
def harness(tmp_path) -> Harness:
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    return harness


# --- the backoff ---------------------------------------------------------------------------


def test_the_default_backoff_is_the_state_machines_for_a_failed_attempt():
    definition = json.loads(ASL.read_text())
    (retry,) = [
        r
        for r in definition["States"]["Step"]["Retry"]
        if StepAttemptFailed.__name__ in r["ErrorEquals"]
    ]
    assert retry["IntervalSeconds"] == DEFAULT_BACKOFF.first_seconds
    assert retry["BackoffRate"] == DEFAULT_BACKOFF.factor
    assert retry["JitterStrategy"] == "FULL"
    assert retry.get("MaxDelaySeconds", DEFAULT_BACKOFF.max_seconds) >= DEFAULT_BACKOFF.ceiling(
        retry["MaxAttempts"]
    )
    assert retry["MaxAttempts"] == MAX_ATTEMPTS - 1


def test_the_delay_is_drawn_under_a_ceiling_that_grows_by_the_factor_up_to_the_cap():
    backoff = Backoff(first_seconds=1.0, factor=2.0, max_seconds=6.0)

    assert [backoff.ceiling(n) for n in (1, 2, 3, 4, 5, 10_000)] == [1, 2, 4, 6, 6, 6]
    rng = random.Random(SEED)
    for attempt in range(1, 6):
        draws = [backoff.delay(attempt, rng) for _ in range(200)]
        assert all(0 <= d <= backoff.ceiling(attempt) for d in draws)
        assert max(draws) > backoff.ceiling(attempt) / 2  # full jitter, not a fixed wait


@pytest.mark.parametrize(
    "figures",
    [(-1.0, 2.0, 60.0), (1.0, 0.5, 60.0), (10.0, 2.0, 5.0), (1.0, float("inf"), 60.0)],
)
def test_a_backoff_that_makes_no_sense_is_refused(figures):
    with pytest.raises(ValueError, match="backoff"):
        Backoff(*figures)


# --- the engine records it -----------------------------------------------------------------


def test_a_transient_tool_error_is_retried_with_growing_recorded_delays(harness):
    # Given a tool whose connection drops twice, at a time that stands still
    clock = Clock()
    drops = [ConnectionResetError("reset by peer"), ConnectionResetError("reset again")]

    def echo(args: Echo, ctx: ToolContext) -> str:
        if drops:
            raise drops.pop(0)
        return args.text

    engine = engine_for(harness, ScriptedModel(echo_once), clock, tool=echo)

    # When the step is tried three times, straight after each other (the engine refuses no
    # early attempt: on AWS the state machine's own Retry decides when it comes)
    raised: list[StepAttemptFailed] = []
    for _ in range(2):
        with pytest.raises(ToolFailed) as failure:
            engine.advance("run")
        assert failure.value.transient
        raised.append(failure.value)
        assert engine.load("run").not_before == failure.value.not_before
    assert engine.advance("run").outcome is Outcome.CONTINUE

    # Then each failed attempt recorded a not_before the seeded backoff put after it
    failures = recorded(harness)
    assert [f.attempt for f in failures] == [1, 2]
    waits = [waited(f, clock.now) for f in failures]
    assert waits == pytest.approx(delays(1, 2), abs=1e-6)
    assert 0 < waits[0] < waits[1] <= DEFAULT_BACKOFF.ceiling(2)
    assert [e.not_before for e in raised] == [f.not_before for f in failures]
    # And the step that succeeded cleared it
    assert engine.load("run").not_before is None


def test_the_third_failed_attempt_fails_the_run_with_no_wait_left(harness):
    clock = Clock()
    model = FlakyModel(clock, *(ModelUnavailable(f"529 overloaded ({n})") for n in (1, 2, 3)))
    engine = engine_for(harness, model, clock)

    for _ in range(MAX_ATTEMPTS - 1):
        with pytest.raises(ModelUnavailable):
            engine.advance("run")
    assert engine.advance("run").outcome is Outcome.FAILED

    head = engine.load("run")
    assert (head.status, head.not_before) == (RunStatus.FAILED, None)
    assert (head.error or "").endswith("last error: 529 overloaded (3)")


# --- the worker waits for it ---------------------------------------------------------------


def worker_for(harness: Harness, engine: Engine, clock: Clock, **options: Any) -> Worker:
    return Worker(engine, SqliteLeases(harness.db), LOG, clock=clock, sleep=clock.sleep, **options)


def test_the_worker_waits_until_not_before_before_each_next_attempt(harness):
    # Given a model that is overloaded twice
    clock = Clock()
    start = clock.now
    model = FlakyModel(clock, ModelUnavailable("529 overloaded"), ModelUnavailable("529 again"))
    engine = engine_for(harness, model, clock)

    # When a worker works the run
    worker_for(harness, engine, clock).run(until_idle=True)

    # Then it slept exactly until each recorded not_before, and only then tried again
    first, second = recorded(harness)
    assert clock.sleeps == pytest.approx(delays(1, 2), abs=1e-6)
    assert model.called_at[:3] == [start, first.not_before, second.not_before]
    assert harness.engine.load("run").status is RunStatus.DONE


def test_a_worker_that_claims_a_backing_off_run_waits_out_the_rest(harness):
    # Given a run whose last worker recorded a failed attempt, then died while backing off
    clock = Clock()
    model = FlakyModel(clock, ModelUnavailable("529 overloaded"))
    engine = engine_for(harness, model, clock)
    with pytest.raises(ModelUnavailable):
        engine.advance("run")
    (failure,) = recorded(harness)
    assert failure.not_before is not None
    clock.now += (failure.not_before - clock.now) / 4

    # When another worker claims it
    worker_for(harness, engine_for(harness, model, clock), clock).run(until_idle=True)

    # Then it waits out the remaining three quarters before the next attempt
    assert clock.sleeps == pytest.approx([0.75 * delays(1)[0]], abs=1e-6)
    assert model.called_at[1] == failure.not_before
    assert harness.engine.load("run").status is RunStatus.DONE


class Seen(logging.Handler):
    """Sets an event when a message is logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: dict[str, threading.Event] = {}

    def event(self, message: str) -> threading.Event:
        return self.events.setdefault(message, threading.Event())

    def emit(self, record: logging.LogRecord) -> None:
        self.event(record.getMessage()).set()


def test_a_backing_off_worker_keeps_its_lease_and_a_stop_cuts_the_wait_short(harness):
    # Given a worker on the real clock whose backoff after a failed attempt is minutes long
    seen = Seen()
    logger = logging.getLogger(f"ratchet.tests.backoff.{id(seen)}")
    logger.handlers, logger.propagate = [seen], False
    logger.setLevel(logging.DEBUG)
    hour = Backoff(first_seconds=3600.0, factor=1.0, max_seconds=3600.0)
    assert delays(1, backoff=hour)[0] > 60
    model = FlakyModel(Clock(), ModelUnavailable("529 overloaded"))
    stop = threading.Event()

    def work() -> None:
        db = SqliteDatabase(harness.root / "ratchet.db")  # a connection serves its own thread
        try:
            engine = engine_for(harness, model, lambda: datetime.now(UTC), backoff=hour, db=db)
            Worker(engine, SqliteLeases(db), logger, stop=stop).run(until_idle=True)
        finally:
            db.close()

    thread = threading.Thread(target=work)

    # When it backs off
    thread.start()
    assert seen.event("backing off before the next attempt").wait(PATIENCE)

    # Then no other worker can take the run meanwhile
    rival = SqliteLeases(harness.db)
    assert rival.claim("rival", 30.0) is None

    # And a stop ends the wait at once: the run is left as recorded, and its lease given back
    stop.set()
    thread.join(PATIENCE)
    assert not thread.is_alive()
    assert len(model.called_at) == 1
    head = harness.engine.load("run")
    assert (head.status, head.attempts) == (RunStatus.RUNNING, 1)
    assert rival.claim("rival", 30.0) == "run"


# --- the next attempt is told why --------------------------------------------------------


def test_the_next_attempt_is_told_why_the_previous_one_failed(harness):
    clock = Clock()
    model = FlakyModel(clock, ModelUnavailable("529 overloaded"))
    engine = engine_for(harness, model, clock)

    with pytest.raises(ModelUnavailable):
        engine.advance("run")
    assert engine.advance("run").outcome is Outcome.CONTINUE
    assert engine.advance("run").outcome is Outcome.DONE

    # Step 1's first attempt is told nothing, its second why the first failed; step 2, nothing
    assert model.told == [None, "529 overloaded", None]
