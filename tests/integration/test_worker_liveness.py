"""The local worker stays live: slow steps keep their lease, a lost lease is given up, a stopped
worker gives back what it holds, unreadable runs are skipped, transient failures back off, and
worker ids and lease lengths are checked. In-process, with a clock the tests move by hand; the
CLI's side in subprocesses at the end."""

from __future__ import annotations

import json
import logging
import math
import random
import re
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from ratchet.adapters.file_blobs import FileBlobStore
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.leases import SqliteLeases, WorkerIdInUse
from ratchet.adapters.sqlite.ledger import SqliteLedger
from ratchet.adapters.sqlite.store import SqliteCheckpointStore
from ratchet.backoff import DEFAULT_BACKOFF
from ratchet.engine import Binding, Engine
from ratchet.errors import (
    AbandonedCallRunning,
    InvalidInput,
    ModelOutputInvalid,
    StepAttemptFailed,
    StoreBusy,
)
from ratchet.ports import ModelRequest
from ratchet.state import AttemptFailed, Decision, RunOptions, RunState, RunStatus, ToolCall
from ratchet.tools import Agent, Tool, ToolContext
from ratchet.worker import Worker
from tests.integration.test_leases import FakeClock
from tests.processes import Cli
from tests.support import FakeTable, StubModel, WriteRow

LEASE = 60.0
"""Lease length on the fake clock. The heartbeat beats in real time, every HEARTBEAT."""
HEARTBEAT = 0.005
PATIENCE = 10.0
"""How long (real seconds) a test waits for something that takes milliseconds when it works."""


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.002)


class Records(logging.Handler):
    """A worker's log, with an event per message the test waits on."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.seen: dict[str, threading.Event] = {}
        self.on: dict[str, Callable[[], None]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.event(record.getMessage()).set()
        if action := self.on.get(record.getMessage()):
            action()

    def event(self, message: str) -> threading.Event:
        return self.seen.setdefault(message, threading.Event())

    def messages(self, message: str) -> list[logging.LogRecord]:
        return [r for r in self.records if r.getMessage() == message]


def _logger(records: Records) -> logging.Logger:
    logger = logging.getLogger(f"ratchet.tests.liveness.{id(records)}")
    logger.handlers = [records]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger


class Store:
    """One SQLite store and the fake app table its runs write to."""

    def __init__(self, root: Path, clock: FakeClock) -> None:
        self.root, self.clock = root, clock
        self.table = FakeTable(root / "app.db")
        self.db = self.open()
        self.leases = SqliteLeases(self.db, clock=clock)
        self.store = SqliteCheckpointStore(self.db)

    def open(self) -> SqliteDatabase:
        return SqliteDatabase(self.root / "ratchet.db")

    def start(self, run_id: str = "run") -> None:
        state = RunState(run_id=run_id, agent="fake", goal="write rows", options=RunOptions())
        assert self.engine("starter").start(state)

    def engine(
        self,
        worker_id: str,
        *,
        model: Any = None,
        during_tool: Callable[[ToolContext], None] = lambda ctx: None,
        db: SqliteDatabase | None = None,
        table: FakeTable | None = None,
        **options: Any,
    ) -> Engine:
        """An engine on `db` (a connection of this thread; the store's by default) whose one
        tool calls `during_tool` before writing its row to `table`; `options` go to `Engine`."""
        table = table or self.table

        def write_row(args: WriteRow, ctx: ToolContext) -> str:
            during_tool(ctx)
            return table.apply(args, ctx)

        agent = Agent(
            name="fake", tools=[Tool("write_row", "Write row n.", WriteRow, write_row, True)]
        )
        binding = Binding(agent, model or StubModel(total=3))
        db = db or self.db
        return Engine(
            store=SqliteCheckpointStore(db),
            ledger=SqliteLedger(db),
            blobs=FileBlobStore(self.root / "blobs"),
            bind=lambda state: binding,
            worker_id=worker_id,
            logger=logging.getLogger("ratchet.tests.liveness.engine"),
            **options,
        )

    def worker(
        self,
        worker_id: str,
        records: Records,
        *,
        model: Any = None,
        during_tool: Callable[[ToolContext], None] = lambda ctx: None,
        in_thread: bool = False,
        **options: Any,
    ) -> Worker:
        """A worker with the store's connection, or with connections of its own made by the
        calling thread (`in_thread`: a sqlite3 connection serves the thread that made it)."""
        db = self.open() if in_thread else self.db
        table = FakeTable(self.root / "app.db") if in_thread else self.table
        engine = self.engine(worker_id, model=model, during_tool=during_tool, db=db, table=table)
        return self.worker_on(engine, records, db=db, **options)

    def worker_on(
        self, engine: Engine, records: Records, *, db: SqliteDatabase | None = None, **options: Any
    ) -> Worker:
        """A worker driving `engine`, with its leases on `db` (the store's by default)."""
        options = {"lease_seconds": LEASE, "heartbeat_seconds": HEARTBEAT, **options}
        return Worker(
            engine, SqliteLeases(db or self.db, clock=self.clock), _logger(records), **options
        )

    def events(self, run_id: str = "run") -> list[Any]:
        return [c.event for c in self.store.list_checkpoints(run_id)]

    def head(self, run_id: str = "run") -> RunState:
        state = self.store.load_head(run_id)
        assert state is not None
        return state


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path, clock) -> Store:
    return Store(tmp_path, clock)


# --- leases that cover the step -----------------------------------------------------------------


def _lease_ends_by(leases: SqliteLeases, at: float) -> bool:
    held = leases.holder("run")
    return held is not None and held[1] >= at


def test_a_step_of_two_and_a_half_leases_keeps_its_lease_and_counts_no_strike(store, clock):
    # Given a tool at step 2 that takes 2.5 leases (on the fake clock), and another worker
    # trying to take the run every half lease meanwhile
    store.start()
    taken_by_rival: list[str | None] = []

    def slow(ctx: ToolContext) -> None:
        if ctx.step != 2:
            return
        rival = SqliteLeases(store.open(), clock=clock)  # on the thread the tool runs on
        for _ in range(5):
            clock.advance(LEASE / 2)
            # The heartbeat renews from the new time: the lease now ends a full lease away.
            wait_for(partial(_lease_ends_by, rival, clock.now + LEASE), "the heartbeat to renew")
            taken_by_rival.append(rival.claim("rival", LEASE))

    records = Records()
    worker = store.worker("w1", records, during_tool=slow)

    # When the worker runs the run to its end
    worker.run(until_idle=True)

    # Then the other worker never got it, the tool ran once, and no attempt failed
    assert taken_by_rival == [None] * 5
    assert store.head().status is RunStatus.DONE
    assert store.table.received.count("run/step-2") == 1
    events = store.events()
    assert [e.kind for e in events] == ["created", "step", "step", "step", "finished"]
    assert [e.attempt for e in events if e.kind == "step"] == [1, 1, 1]
    assert not records.messages("lease lost")


def test_a_worker_that_loses_its_lease_mid_step_gives_the_run_up_after_that_step(store, clock):
    # Given a worker whose lease another worker takes over while step 2's tool runs
    store.start()
    records = Records()

    def taken_over(ctx: ToolContext) -> None:
        if ctx.step == 2:
            rival = store.open()  # on the thread the tool runs on
            rival.connection.execute(
                "UPDATE leases SET owner = 'rival', expires_at = ? WHERE run_id = 'run'",
                (clock.now + 10 * LEASE,),
            )
            rival.close()
            assert records.event("lease lost").wait(PATIENCE), "the heartbeat noticed"

    worker = store.worker("w1", records, during_tool=taken_over)
    records.on["run given up: lease lost"] = worker.stop.set

    # When it works the run
    worker.run(until_idle=True)

    # Then it committed the step it was in (the version check let it: nobody moved the run),
    # took back the attempt it had counted for step 3, took no further step and left the
    # rival's lease alone
    head = store.head()
    assert (head.status, head.step, head.attempts) == (RunStatus.RUNNING, 2, 0)
    assert store.leases.holder("run") == ("rival", clock.now + 10 * LEASE)
    assert len(records.messages("run given up: lease lost")) == 1


def test_a_worker_stopped_mid_step_finishes_it_then_gives_back_the_lease(store, clock):
    # Given a worker asked to stop while step 2's tool runs
    store.start()
    stop = threading.Event()

    def stop_at_step_two(ctx: ToolContext) -> None:
        if ctx.step == 2:
            stop.set()

    worker = store.worker("w1", Records(), during_tool=stop_at_step_two, stop=stop)

    # When it stops
    worker.run(until_idle=True)

    # Then step 2 is committed, no attempt of step 3 is counted (a worker that never began
    # step 3 must not leave a strike on it), and nothing is held
    head = store.head()
    assert (head.status, head.step, head.attempts) == (RunStatus.RUNNING, 2, 0)
    assert store.leases.holder("run") is None
    assert store.db.connection.execute("SELECT count(*) FROM workers").fetchone() == (0,)
    # And the next worker takes step 3 as its first attempt
    store.worker("w2", Records()).run(until_idle=True)
    third = [e for e in store.events() if e.kind == "step"][2]
    assert (third.step, third.attempt) == (3, 1)


def test_a_worker_whose_run_strikes_out_beside_an_abandoned_call_stops_holding_the_run(
    store, clock
):
    # Given a run whose first tool call overruns its deadline and then runs on
    store.start()
    go = threading.Event()
    calls: list[str] = []

    def hang(args: WriteRow, ctx: ToolContext) -> str:
        calls.append(ctx.idempotency_key)
        assert go.wait(timeout=60), "the test never let the call end"
        return "written late"

    agent = Agent(
        name="hangs",
        tools=[Tool("write_row", "Hang.", WriteRow, hang, True)],
        step_timeout_seconds=0.5,
    )
    binding = Binding(agent, StubModel(total=3))
    engine = Engine(
        store=store.store,
        ledger=SqliteLedger(store.db),
        blobs=FileBlobStore(store.root / "blobs"),
        bind=lambda state: binding,
        worker_id="w1",
        logger=logging.getLogger("ratchet.tests.liveness.engine"),
        abandoned_grace_seconds=0,
    )
    records = Records()
    worker = store.worker_on(engine, records, sleep=lambda seconds: None)

    try:
        # When its worker's attempts time out, the later two waiting for that call
        with pytest.raises(AbandonedCallRunning):
            worker.run(until_idle=True)

        # Then the worker stopped without failing the run or letting go of its lease, and
        # the tool ran once
        head = store.head()
        assert (head.status, head.attempts) == (RunStatus.RUNNING, 3)
        holder = store.leases.holder("run")
        assert holder is not None
        assert holder[0] == "w1"
        assert len(records.messages("worker stops: a call it abandoned still runs")) == 1
        assert calls == ["run/step-1"]
    finally:
        go.set()
    # And once that process is gone (the call with it) and the lease lapsed, the next worker
    # fails the run with the cause
    wait_for(lambda: not engine.abandoned_call_running("run"), "the abandoned call to end")
    clock.advance(LEASE + 1)
    store.worker("w2", Records(), sleep=lambda seconds: None).run(until_idle=True)
    head = store.head()
    assert head.status is RunStatus.FAILED
    assert "timed out after 0.5 s (waiting for the call an earlier attempt" in (head.error or "")
    assert calls == ["run/step-1"]


# --- worker ids ---------------------------------------------------------------------------------


def test_a_second_live_worker_with_the_same_id_is_refused_before_it_claims_anything(store, clock):
    # Given worker "dup" busy in step 1 of a run
    store.start()
    in_step, finish_step = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def busy(ctx: ToolContext) -> None:
        in_step.set()
        assert finish_step.wait(PATIENCE)

    def first_worker() -> None:
        try:
            worker = store.worker("dup", Records(), during_tool=busy, in_thread=True)
            worker.run(until_idle=True)
        except BaseException as error:  # pragma: no cover - surfaced by the assertion
            errors.append(error)

    thread = threading.Thread(target=first_worker)
    thread.start()
    try:
        assert in_step.wait(PATIENCE)
        # When another worker starts with the same id
        model = StubModel(total=3)
        second = store.worker("dup", Records(), model=model)
        # Then it is refused, and never asked the model anything
        with pytest.raises(WorkerIdInUse, match="worker id 'dup' is in use by a live worker"):
            second.run(until_idle=True)
        assert model.calls == []
    finally:
        finish_step.set()
        thread.join(PATIENCE)
    assert not errors
    # And once the first has stopped, its id is free again
    store.worker("dup", Records()).run(until_idle=True)
    assert store.head().status is RunStatus.DONE


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease_seconds": math.inf}, "lease seconds must be a number from 0.1 to 3600"),
        ({"lease_seconds": math.nan}, "lease seconds must be a number from 0.1 to 3600"),
        ({"lease_seconds": 0.01}, "lease seconds must be a number from 0.1 to 3600"),
        ({"lease_seconds": 7200.0}, "lease seconds must be a number from 0.1 to 3600"),
        ({"heartbeat_seconds": 0.0}, "heartbeat seconds must be above 0"),
        ({"heartbeat_seconds": LEASE}, "at most half the lease"),
        ({"heartbeat_seconds": math.nan}, "heartbeat seconds"),
        ({"poll_seconds": math.inf}, "poll seconds"),
    ],
)
def test_a_worker_refuses_timings_it_cannot_keep(store, options, message):
    with pytest.raises(InvalidInput, match=re.escape(message)):
        store.worker("w", Records(), **options)


@pytest.mark.parametrize("worker_id", ["", "a\udcff", "tab\there", "x" * 201])
def test_a_worker_refuses_an_id_that_is_not_printable_text(store, worker_id):
    with pytest.raises(InvalidInput, match="worker id"):
        store.worker(worker_id, Records())


# --- runs it cannot read ------------------------------------------------------------------------


def _tamper(db: sqlite3.Connection | Any, run_id: str, change: Callable[[str], str]) -> None:
    (state,) = db.execute("SELECT state FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    db.execute("UPDATE runs SET state = ? WHERE run_id = ?", (change(state), run_id))


def _newer_schema(state: str) -> str:
    return json.dumps({**json.loads(state), "schema_version": 99})


def test_runs_a_worker_cannot_read_are_skipped_once_and_do_not_starve_the_others(store, clock):
    # Given a run with a tampered head, one whose head is not UTF-8 and one written by a newer
    # Ratchet, all older than a normal run (so they come first in the claim order)
    for run_id in ("tampered", "undecodable", "newer", "normal"):
        store.start(run_id)
    _tamper(store.db.connection, "tampered", lambda state: "not json {")
    store.db.connection.execute(
        "UPDATE runs SET state = cast(x'7b22ff7d' as text) WHERE run_id = 'undecodable'"
    )
    _tamper(store.db.connection, "newer", _newer_schema)
    records = Records()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            worker = store.worker(
                "w1", records, model=StubModel(total=2), in_thread=True, poll_seconds=0.01
            )
            worker.run(until_idle=True)
        except BaseException as error:  # pragma: no cover - surfaced by the assertion
            errors.append(error)

    # When a worker works until idle
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(30)

    # Then it finished the normal run and ended, logging each unreadable run once
    assert not thread.is_alive(), "worker --until-idle never ended"
    assert not errors
    assert store.head("normal").status is RunStatus.DONE
    skipped = records.messages("run skipped: its state cannot be read")
    assert sorted(r.run_id for r in skipped) == ["newer", "tampered", "undecodable"]  # type: ignore[attr-defined]
    assert "schema 99" in next(r.error for r in skipped if r.run_id == "newer")  # type: ignore[attr-defined]
    assert "column 'state' holds text that is not UTF-8" in next(
        r.error  # type: ignore[attr-defined]
        for r in skipped
        if r.run_id == "undecodable"  # type: ignore[attr-defined]
    )
    assert not records.messages("step crashed")
    # And it left them as they were, to a Ratchet that can read them
    rows = dict(store.db.connection.execute("SELECT run_id, attempts FROM runs").fetchall())
    assert (rows["tampered"], rows["undecodable"], rows["newer"]) == (0, 0, 0)
    assert store.leases.holder("tampered") is None


# --- backing off --------------------------------------------------------------------------------


class BriefOutage(StepAttemptFailed):
    transient = True


class Answers:
    """A model answering with the given decisions or raising the given errors, in order."""

    def __init__(self, *answers: Decision | Exception) -> None:
        self.answers = list(answers)

    def decide(self, request: ModelRequest) -> Decision:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _done_after(*failures: Decision | Exception) -> Answers:
    from ratchet.state import Done

    return Answers(*failures, Done(summary="done"))


SEED = 7
FROZEN = datetime(2030, 1, 1, tzinfo=UTC)
"""The engine's and the worker's time in the backoff tests below: every pause is a whole
recorded delay."""


def _backing_off_worker(store: Store, model: Answers, pauses: list[float]) -> Worker:
    engine = store.engine("w", model=model, rng=random.Random(SEED), clock=lambda: FROZEN)
    return store.worker_on(engine, Records(), sleep=pauses.append, clock=lambda: FROZEN)


def _delays(*attempts: int) -> list[float]:
    """The engine's delays after these failed attempts, drawn in order from the seeded source
    (as recorded: to the microsecond)."""
    rng = random.Random(SEED)
    return [round(DEFAULT_BACKOFF.delay(a, rng), 6) for a in attempts]


@pytest.mark.parametrize(
    "failure",
    [BriefOutage("disk full for a moment"), ModelOutputInvalid("no tool call")],
    ids=["transient", "other"],
)
def test_failed_attempts_are_retried_after_the_backoff_recorded_in_the_head(store, failure):
    store.start()
    pauses: list[float] = []
    worker = _backing_off_worker(store, _done_after(failure, failure), pauses)

    worker.run(until_idle=True)

    recorded = [e.not_before for e in store.events() if isinstance(e, AttemptFailed)]
    assert pauses == [(t - FROZEN).total_seconds() for t in recorded if t is not None]
    assert pauses == pytest.approx(_delays(1, 2), abs=1e-6)
    assert store.head().status is RunStatus.DONE


def test_the_backoff_starts_again_after_a_step_that_succeeds(store):
    store.start()
    pauses: list[float] = []
    write = ToolCall(name="write_row", arguments={"n": 1})
    model = _done_after(BriefOutage("one"), BriefOutage("two"), write, BriefOutage("three"))
    worker = _backing_off_worker(store, model, pauses)

    worker.run(until_idle=True)

    assert pauses == pytest.approx(_delays(1, 2, 1), abs=1e-6)


class BusyOnce(SqliteLeases):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refusals = 2

    def claim(self, *args: Any, **kwargs: Any) -> str | None:
        if self.refusals:
            self.refusals -= 1
            raise StoreBusy("the store is busy")
        return super().claim(*args, **kwargs)


def test_a_busy_store_is_waited_out_with_the_same_backoff(store, clock):
    store.start()
    pauses: list[float] = []
    worker = Worker(
        store.engine("w"),
        BusyOnce(store.db, clock=clock),
        _logger(Records()),
        lease_seconds=LEASE,
        heartbeat_seconds=HEARTBEAT,
        sleep=pauses.append,
    )

    worker.run(until_idle=True)

    assert pauses == [0.5, 1.0]
    assert store.head().status is RunStatus.DONE


# --- the CLI's side -----------------------------------------------------------------------------


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_the_cli_refuses_a_second_live_worker_with_the_same_id(tmp_path):
    cli = Cli(tmp_path)
    cli.ok("start", "--goal", "file a note", "--run-id", "note")
    live = cli.spawn_worker("dup", until_idle=False, lease=5)
    try:
        db = sqlite3.connect(tmp_path / "ratchet.db")
        wait_for(
            lambda: (
                db.execute("SELECT 1 FROM sqlite_master WHERE name = 'workers'").fetchone()
                is not None
                and db.execute("SELECT 1 FROM workers WHERE worker_id = 'dup'").fetchone()
                is not None
            ),
            "the first worker to register",
        )

        second = cli.run("worker", "--until-idle", "--worker-id", "dup")

        assert second.returncode == 2
        assert _one_line(second.stderr).startswith(
            "ratchet: worker id 'dup' is in use by a live worker"
        )
    finally:
        live.send_signal(signal.SIGTERM)
        assert live.wait(timeout=30) == 0
    # The id of a worker that stopped is free at once
    cli.ok("worker", "--until-idle", "--worker-id", "dup")


@pytest.mark.parametrize("lease", ["nan", "inf", "1e309"])
def test_the_cli_refuses_a_lease_it_cannot_keep_and_writes_nothing(tmp_path, lease):
    cli = Cli(tmp_path)

    refused = cli.run("worker", "--until-idle", "--lease-seconds", lease)

    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr
    assert "--lease-seconds" in refused.stderr
    assert not (tmp_path / "ratchet.db").exists()


def test_the_cli_worker_skips_an_unreadable_run_and_ends(tmp_path):
    cli = Cli(tmp_path)
    for run_id in ("tampered", "normal"):
        cli.ok("start", "--goal", "file a note", "--run-id", run_id)
    db = sqlite3.connect(tmp_path / "ratchet.db", isolation_level=None)
    _tamper(db, "tampered", lambda state: "not json {")
    db.close()

    worked = cli.run("worker", "--until-idle", "--worker-id", "w", timeout=60)

    assert worked.returncode == 0, worked.stderr
    lines = [json.loads(line) for line in worked.stderr.splitlines()]
    skipped = [r for r in lines if r.get("message") == "run skipped: its state cannot be read"]
    assert [r["run_id"] for r in skipped] == ["tampered"]
    assert cli.head("normal").status is RunStatus.DONE


def test_ratchet_worker_stopping_beside_an_abandoned_call_says_so_and_exits_1(monkeypatch, capsys):
    # Nothing the user typed was wrong: not the exit 2 of bad input
    from ratchet.cli import app as cli

    def stops(*args: Any, **kwargs: Any) -> None:
        raise AbandonedCallRunning("run", 4, 30.0)

    monkeypatch.setattr(cli, "app", stops)

    with pytest.raises(SystemExit) as ended:
        cli.main(["worker", "--until-idle"])

    assert ended.value.code == 1
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1
    assert said[0].startswith("ratchet: run run: a call of step 4 abandoned at its deadline")
