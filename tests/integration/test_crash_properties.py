"""Random crash schedules, property-tested: whatever kills and raises hit a migration run, at
whatever points and steps, several per run, the run ends with the effects of a run that never
crashed, or, when one step is struck three times, fails keeping its last checkpoint with every
effect so far applied once.

A schedule is a list of faults. Each process ("life") of the run gets the faults not fired yet;
the first one reached fires and ends that life, and a fresh one takes over. A `raise` ends the
life the way an exception ends a worker's loop: its `finally` closes the store. A `kill` ends it
as SIGKILL would: nothing more runs in it.

The expected outcome is computed from the schedule alone (`expected_outcome`), by walking the
step protocol documented in `ratchet.engine.step`: which points each attempt reaches, which
attempts count, and when the third strike ends the run.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratchet.engine import Engine, Outcome
from ratchet.engine.fold import replay
from ratchet.errors import InjectedFault
from ratchet.faults import Fault, FaultAction, FaultPlan, FaultPoint
from ratchet.ports import CheckpointStore, IdempotencyLedger, LedgerStatus
from ratchet.runtime.aws import AwsRuntime
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.scenarios import migration
from ratchet.scenarios.migration_data import BATCH_SIZE
from ratchet.state import (
    MAX_ATTEMPTS,
    PersonDecided,
    RunOptions,
    RunState,
    RunStatus,
    idempotency_key,
)
from ratchet.tools import RunContext
from tests.dynamodb_support import SETTINGS, moto_tables, new_client

LOG = logging.getLogger("ratchet.tests.crash_properties")
SQLITE_SCHEDULES = 200
DYNAMODB_SCHEDULES = 25
MAX_FAULTS = 6
MAX_ADVANCES_PER_LIFE = 60
CRASHES = (FaultAction.RAISE, FaultAction.KILL)
"""The actions that end a life (a `stop` holds a process still, and it goes on after)."""


# --- the run's shape ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where each step of the scripted migration falls for `batches` batches."""

    batches: int

    @property
    def ask(self) -> int:
        return self.batches + 2

    @property
    def drop(self) -> int:
        return self.ask + 1

    @property
    def email(self) -> int:
        return self.ask + 2

    @property
    def done(self) -> int:
        """The step that reports DONE: it calls no tool."""
        return self.ask + 3

    @property
    def copies(self) -> range:
        return range(2, self.batches + 2)

    @property
    def side_effects(self) -> frozenset[int]:
        return frozenset({*self.copies, self.drop, self.email})


# --- the oracle --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    status: RunStatus
    step: int
    """The head's step at the end: the last step committed."""
    deliveries: dict[int, int]
    """Side-effect step -> how many times its tool was called."""
    fired: int


def _points(step: int, layout: Layout, decided: bool) -> Iterator[FaultPoint]:
    """The points one attempt at `step` passes before its commit, in order."""
    if not decided:  # a decision recorded under the step's key is reused: no model call
        yield FaultPoint.BEFORE_MODEL
        yield FaultPoint.AFTER_MODEL
    yield FaultPoint.AFTER_DECISION
    if step != layout.done:
        yield FaultPoint.AFTER_TOOL
    yield FaultPoint.BEFORE_COMMIT


def expected_outcome(schedule: list[Fault], layout: Layout) -> Expected:
    pending = list(schedule)
    deliveries: Counter[int] = Counter()
    decided: set[int] = set()
    attempts = 0
    fired = 0

    def fire(point: FaultPoint, step: int) -> Fault | None:
        for fault in pending:
            if fault.point is point and fault.step == step:
                pending.remove(fault)
                return fault
        return None

    step = 1
    while step <= layout.done:
        # Every attempt checks the strikes and is counted durably as it begins.
        if attempts >= MAX_ATTEMPTS:
            return Expected(RunStatus.FAILED, step - 1, dict(deliveries), fired)
        attempts += 1
        crashed = None
        for point in _points(step, layout, step in decided):
            if point is FaultPoint.AFTER_DECISION:
                decided.add(step)
            if point is FaultPoint.AFTER_TOOL and step in layout.side_effects:
                deliveries[step] += 1
            crashed = fire(point, step)
            if crashed:
                break
        if crashed:
            fired += 1
            continue
        # The commit leaves the next step's attempt uncounted: a crash right after it is no
        # strike on a step that never began.
        attempts = 0
        if fire(FaultPoint.AFTER_COMMIT, step):
            fired += 1
        step += 1
    return Expected(RunStatus.DONE, layout.done - 1, dict(deliveries), fired)


# --- driving a run through its lives -----------------------------------------------------------


@dataclass(frozen=True)
class LifePlan(FaultPlan):
    """The faults of the schedule not fired yet. The first one reached fires, always as an
    exception (a kill is simulated by what the driver does next), and is remembered."""

    fired: list[Fault] = field(default_factory=list)

    def hit(self, point: FaultPoint, step: int) -> None:
        for fault in self.faults:
            if fault.point is point and fault.step == step:
                self.fired.append(fault)
                raise InjectedFault(f"injected fault {fault}")


class Runtime(Protocol):
    @property
    def store(self) -> CheckpointStore: ...

    @property
    def ledger(self) -> IdempotencyLedger: ...

    def engine(self, *, worker_id: str, logger: Any, faults: FaultPlan = ...) -> Engine: ...

    def context(self, run_id: str, options: RunOptions) -> RunContext: ...

    def close(self) -> None: ...


OpenRuntime = Callable[[], Runtime]


def start(open_runtime: OpenRuntime, run_id: str, layout: Layout) -> None:
    runtime = open_runtime()
    options = RunOptions(params={"batches": layout.batches})
    assert migration.agent.prepare is not None
    migration.agent.prepare(runtime.context(run_id, options))
    state = RunState(
        run_id=run_id,
        agent="migration",
        goal=migration.agent.goal_for(options.params),
        options=options,
    )
    assert runtime.engine(worker_id="starter", logger=LOG).start(state)
    runtime.close()


def drive(open_runtime: OpenRuntime, run_id: str, schedule: list[Fault]) -> int:
    """Run lives until one ends without a fault; approve whenever the run asks. Returns how
    many faults fired."""
    pending = list(schedule)
    dead: list[Runtime] = []
    try:
        for life in range(len(schedule) + 1):
            plan = LifePlan(tuple(pending))
            runtime = open_runtime()
            engine = runtime.engine(worker_id=f"life-{life}", logger=LOG, faults=plan)
            if not _live(engine, run_id):
                runtime.close()
                return len(schedule) - len(pending)
            fault = plan.fired[-1]
            pending.remove(fault)
            if fault.action is FaultAction.RAISE:
                runtime.close()
            else:
                dead.append(runtime)  # killed: it releases nothing, closes nothing
        raise AssertionError(f"the run outlived its schedule: {schedule}")
    finally:
        for runtime in dead:  # the OS reclaims a dead process's files
            runtime.close()


def _live(engine: Engine, run_id: str) -> bool:
    """Advance as a worker does until the run stops; True if a fault ended this life first."""
    for _ in range(MAX_ADVANCES_PER_LIFE):
        try:
            outcome = engine.advance(run_id)
        except InjectedFault:
            return True
        if outcome.outcome is Outcome.WAITING:
            engine.decide_waiting(run_id, PersonDecided(approved=True, by="tester"))
        elif outcome.outcome is not Outcome.CONTINUE:
            return False
    raise AssertionError(f"run {run_id} did not stop")


# --- what a run leaves behind ------------------------------------------------------------------


def effects(open_runtime: OpenRuntime, run_id: str) -> dict[str, Any]:
    runtime = open_runtime()
    try:
        head = runtime.store.load_head(run_id)
        assert head is not None
        checkpoints = runtime.store.list_checkpoints(run_id)
        assert replay(checkpoints) == head, "the head is not the fold of its checkpoints"
        assert migration.agent.verify is not None
        report = migration.agent.verify(runtime.context(run_id, head.options), head)
        entries = [runtime.ledger.get(idempotency_key(run_id, s)) for s in range(head.step + 2)]
        ledger = {entry.step: entry.status for entry in entries if entry is not None}
    finally:
        runtime.close()
    calls = [
        (c.step, c.event.call.name, c.event.call.arguments)
        for c in checkpoints
        if c.event.kind == "step"
    ]
    return {"head": head, "report": report, "calls": calls, "ledger": ledger}


def assert_outcome(
    found: dict[str, Any], expected: Expected, clean: dict[str, Any], layout: Layout
) -> None:
    head: RunState = found["head"]
    report = found["report"]
    assert (head.status, head.step) == (expected.status, expected.step)
    # Every step committed was decided once and completed with its commit.
    committed = range(1, head.step + 1)
    assert all(found["ledger"].get(s) is LedgerStatus.COMPLETED for s in committed)
    applied = [s for s in layout.side_effects if expected.deliveries.get(s)]
    copied = [s for s in layout.copies if s in applied]
    assert report["duplicate_rows"] == 0
    assert report["target_rows"] == len(copied) * BATCH_SIZE
    assert report["emails_sent"] == (1 if layout.email in applied else 0)
    assert report["legacy_dropped"] is (layout.drop in applied)
    assert report["keys_applied"] == len(applied)
    assert report["keys_delivered"] == sum(expected.deliveries.values())
    assert found["calls"] == [c for c in clean["calls"] if c[0] <= head.step]
    if expected.status is RunStatus.DONE:
        assert found["ledger"].get(layout.done) is LedgerStatus.COMPLETED
        assert head.summary == clean["head"].summary
        redelivered = ("keys_delivered",)
        assert _without(report, redelivered) == _without(clean["report"], redelivered)
    else:
        assert f"step {head.step + 1}" in (head.error or "")


def _without(report: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in keys}


# --- schedules ---------------------------------------------------------------------------------


@st.composite
def schedules(draw: st.DrawFn) -> tuple[Layout, list[Fault]]:
    """Faults anywhere in the run (and one step past it), clustered on one "hot" step often
    enough that three strikes on a step, and faults that are never reached, both happen."""
    layout = Layout(draw(st.integers(min_value=4, max_value=6)))
    hot = draw(st.integers(min_value=1, max_value=layout.done))
    step = st.one_of(st.just(hot), st.integers(min_value=1, max_value=layout.done + 1))
    fault = st.builds(Fault, st.sampled_from(CRASHES), st.sampled_from(FaultPoint), step)
    return layout, draw(st.lists(fault, min_size=1, max_size=MAX_FAULTS))


@dataclass
class Tally:
    schedules: int = 0
    faults_fired: int = 0
    outcomes: Counter[RunStatus] = field(default_factory=Counter)
    kinds: set[tuple[FaultAction, FaultPoint]] = field(default_factory=set)

    def add(self, schedule: list[Fault], expected: Expected, fired: int) -> None:
        self.schedules += 1
        self.faults_fired += fired
        self.outcomes[expected.status] += 1
        self.kinds |= {(f.action, f.point) for f in schedule}

    def check(self, at_least: int, backend: str, *, every_kind: bool = True) -> str:
        figure = (
            f"{backend}: {self.schedules} crash schedules, {self.faults_fired} faults fired, "
            f"{self.outcomes[RunStatus.DONE]} runs done, "
            f"{self.outcomes[RunStatus.FAILED]} failed on a third strike"
        )
        print(figure)
        assert self.schedules >= at_least, figure
        if every_kind:  # the schedules reached both endings and every action at every point
            assert set(self.outcomes) == {RunStatus.DONE, RunStatus.FAILED}, figure
            assert len(self.kinds) == len(CRASHES) * len(FaultPoint), figure
        return figure


def run_schedules(
    *, examples: int, runtime_in: Callable[[Path], OpenRuntime], root: Path, tally: Tally
) -> None:
    clean: dict[Layout, dict[str, Any]] = {}

    def outcome_of(layout: Layout, schedule: list[Fault]) -> tuple[dict[str, Any], int]:
        folder = Path(tempfile.mkdtemp(dir=root))
        try:
            open_runtime = runtime_in(folder)
            run_id = f"run-{folder.name}"
            start(open_runtime, run_id, layout)
            fired = drive(open_runtime, run_id, schedule)
            return effects(open_runtime, run_id), fired
        finally:
            shutil.rmtree(folder)

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(schedules())
    def check(case: tuple[Layout, list[Fault]]) -> None:
        layout, schedule = case
        if layout not in clean:
            clean[layout], _ = outcome_of(layout, [])
            assert_outcome(clean[layout], expected_outcome([], layout), clean[layout], layout)
            assert clean[layout]["report"]["ok"] is True
        expected = expected_outcome(schedule, layout)
        found, fired = outcome_of(layout, schedule)
        assert fired == expected.fired
        assert_outcome(found, expected, clean[layout], layout)
        tally.add(schedule, expected, fired)

    check()


# --- the properties ----------------------------------------------------------------------------


def test_the_oracle_knows_the_three_strikes_and_the_reused_decision():
    layout = Layout(4)
    copy = layout.copies[0]
    thrice = [Fault(FaultAction.KILL, FaultPoint.AFTER_TOOL, copy)] * 3
    assert expected_outcome(thrice, layout) == Expected(RunStatus.FAILED, copy - 1, {copy: 3}, 3)
    # DONE calls no tool, a step past the end is never taken, a failed run takes no more.
    unreached = [
        Fault(FaultAction.RAISE, FaultPoint.AFTER_TOOL, layout.done),
        Fault(FaultAction.KILL, FaultPoint.BEFORE_MODEL, layout.done + 1),
    ]
    assert expected_outcome(unreached, layout).fired == 0
    assert expected_outcome([*thrice, unreached[0]], layout).fired == 3
    # A worker killed right after its commit leaves no strike on the next step, which began in
    # no process: that step fails the run at its third failure, not its second.
    strikes = [Fault(FaultAction.RAISE, FaultPoint.BEFORE_COMMIT, copy + 1)] * 2
    for action in FaultAction:
        after_commit = [Fault(action, FaultPoint.AFTER_COMMIT, copy)]
        assert expected_outcome(after_commit + strikes, layout).status is RunStatus.DONE
        third = after_commit + strikes + strikes[:1]
        assert expected_outcome(third, layout).status is RunStatus.FAILED


def _sqlite_runtime(folder: Path) -> OpenRuntime:
    settings = LocalSettings(store=f"sqlite:///{folder / 'ratchet.db'}")
    return lambda: LocalRuntime.open(settings)


def test_random_crash_schedules_on_sqlite_end_with_the_effects_of_no_crash(
    tmp_path: Path, record_property: Callable[[str, object], None]
):
    tally = Tally()

    run_schedules(examples=SQLITE_SCHEDULES, runtime_in=_sqlite_runtime, root=tmp_path, tally=tally)

    record_property("figure", tally.check(SQLITE_SCHEDULES, "sqlite"))


@contextmanager
def _moto() -> Iterator[Callable[[Path], OpenRuntime]]:
    with moto_tables():
        # Every life gets a client of its own, as a fresh Lambda container would.
        yield lambda folder: lambda: AwsRuntime(SETTINGS, new_client())


def test_random_crash_schedules_on_dynamodb_end_with_the_effects_of_no_crash(
    tmp_path: Path, record_property: Callable[[str, object], None]
):
    tally = Tally()

    with _moto() as runtime_in:
        run_schedules(
            examples=DYNAMODB_SCHEDULES, runtime_in=runtime_in, root=tmp_path, tally=tally
        )

    record_property("figure", tally.check(DYNAMODB_SCHEDULES, "dynamodb", every_kind=False))
