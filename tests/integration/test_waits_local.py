"""Waits on the world on the local runtime: a real SQLite store, real workers in this process,
and the event desk every sender uses. Each order of arrival ends with the run done, the
payload in the waiting step's result exactly once, and the mailbox empty."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from ratchet.engine import Engine
from ratchet.errors import (
    EventNotAwaited,
    InvalidInput,
    MailboxFull,
    NotSleeping,
    NotWaiting,
    PayloadTooLarge,
    RunEnded,
    RunNotFound,
)
from ratchet.housekeeping import BLOB_GRACE, collect_garbage
from ratchet.runtime import runtime_for
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import (
    INLINE_BYTES,
    RunOptions,
    RunState,
    RunStatus,
    StepCompleted,
    TimerWait,
    WaitSettled,
    utcnow,
)
from ratchet.tools import Agent, Tool, ToolCall, sleep_until, wait_for_event
from ratchet.tools import sleep as sleep_for
from ratchet.waiting.desk import EventDesk, EventInvalid
from ratchet.waits import MAX_MAILBOX_EVENTS
from ratchet.worker import Worker
from tests.waits_agent import AGENT, OPEN_AGENT, TWO_EVENTS_AGENT, agent

LOG = logging.getLogger("ratchet.tests.waits")
PASSED = {"conclusion": "success", "url": "https://ci.example/1"}


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


class Local:
    """A store, the runtime on it, a clock the tests move, and the waits agent (`agent`;
    another harness may name its own)."""

    agent = agent
    agent_ref = AGENT

    def __init__(self, root: Path, url: str | None = None) -> None:
        self.url = url or f"sqlite:///{root}/s.db"
        runtime = runtime_for(LocalSettings(store=self.url), create=True)
        assert isinstance(runtime, LocalRuntime)  # or its Postgres subclass
        self.runtime = runtime
        self.clock = Clock(utcnow())

    @property
    def engine(self) -> Engine:
        return self.runtime.engine(worker_id="worker", logger=LOG)

    def desk(self, runtime: LocalRuntime | None = None) -> EventDesk:
        runtime = runtime or self.runtime
        desk = runtime.event_desk(runtime.engine(worker_id="sender", logger=LOG))
        desk.clock = self.clock
        return desk

    def start(self, run_id: str = "run-1", **params: object) -> str:
        return self.start_of(self.agent_ref, run_id, **params)

    def start_of(self, agent: str, run_id: str = "run-1", **params: object) -> str:
        """Start a run of the agent `agent` names, with this harness's agent's goal."""
        options = RunOptions(model="scripted", params=params)
        state = RunState(run_id=run_id, agent=agent, goal=self.agent.goal, options=options)
        assert self.engine.start(state)
        return run_id

    def work(self, run_id: str) -> None:
        engine = self.engine
        Worker(
            engine,
            self.runtime.leases,
            LOG,
            clock=self.clock,
            settle_waits=self.runtime.wait_settler(engine),
        ).run(until_idle=True, run_id=run_id)

    def head(self, run_id: str) -> RunState:
        state = self.runtime.store.load_head(run_id)
        assert state is not None
        return state

    def results_of(self, run_id: str) -> list[WaitSettled]:
        return [
            c.event
            for c in self.runtime.store.list_checkpoints(run_id)
            if isinstance(c.event, WaitSettled)
        ]

    def pending(self, run_id: str) -> list[str]:
        return [e.event_id for e in self.runtime.mailbox.of_run(run_id) if e.is_pending]

    def tables(self) -> dict[str, list[tuple[object, ...]]]:
        db = self.runtime.db.connection
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: sorted(db.execute(f'SELECT * FROM "{n}"').fetchall(), key=repr) for n in names}


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    served = Local(tmp_path)
    yield served
    served.runtime.close()


def assert_done_with_event_once(local: Local, run_id: str) -> None:
    head = local.head(run_id)
    assert head.status is RunStatus.DONE, head
    settled = local.results_of(run_id)
    assert [s.how for s in settled] == ["event"]
    assert settled[0].payload == PASSED
    assert '"conclusion": "success"' in (head.summary or "")
    assert local.pending(run_id) == []


# --- the three orders of arrival ----------------------------------------------------------------


def test_an_event_sent_before_the_wait_is_kept_and_taken_by_it(local):
    run_id = local.start()
    sent = local.desk().send(run_id, "ci-finished", PASSED, event_id="d-1", source="cli")
    assert sent.status == "queued"
    assert not sent.duplicate
    local.work(run_id)
    assert_done_with_event_once(local, run_id)
    assert local.runtime.mailbox.get(run_id, "d-1").consumed_step == 1


def test_an_event_sent_during_the_wait_settles_it(local):
    run_id = local.start()
    local.work(run_id)
    head = local.head(run_id)
    assert head.status is RunStatus.WAITING
    assert head.waiting is not None
    assert head.waiting.kind == "event"
    assert head.waiting.due is not None
    sent = local.desk().send(run_id, "ci-finished", PASSED, event_id="d-1")
    assert sent.answer() == {
        "run_id": run_id,
        "name": "ci-finished",
        "event_id": "d-1",
        "status": "delivered",
        "step": 1,
        "duplicate": False,
        "refused": None,
    }
    assert local.head(run_id).status is RunStatus.RUNNING
    local.work(run_id)
    assert_done_with_event_once(local, run_id)


def test_an_event_after_the_timeout_is_kept_and_the_run_went_on_without_it(local):
    run_id = local.start()
    local.work(run_id)
    local.clock.now = utcnow() + timedelta(hours=2, seconds=1)
    local.work(run_id)
    head = local.head(run_id)
    assert head.status is RunStatus.DONE
    assert [s.how for s in local.results_of(run_id)] == ["timeout"]
    assert "No 'ci-finished' event within 2 h." in (head.summary or "")
    with pytest.raises(RunEnded, match="done: it takes no more events"):
        local.desk().send(run_id, "ci-finished", PASSED, event_id="late")
    assert local.pending(run_id) == []


# --- exactly once -------------------------------------------------------------------------------


def test_the_same_event_sent_twenty_times_at_once_is_delivered_once(local, tmp_path):
    run_id = local.start()
    local.work(run_id)
    answers: list[dict[str, object]] = []
    barrier = threading.Barrier(20)

    def send() -> None:
        runtime = LocalRuntime.open(LocalSettings(store=local.url))
        try:
            desk = local.desk(runtime)
            barrier.wait()
            answers.append(desk.send(run_id, "ci-finished", PASSED, event_id="same").answer())
        finally:
            runtime.close()

    threads = [threading.Thread(target=send) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 20
    duplicates = sum(bool(a["duplicate"]) for a in answers)
    print(
        f"one event id sent {len(answers)} times at once: {len(local.results_of(run_id))} "
        f"delivered, {duplicates} answered as duplicates"
    )
    assert sum(not a["duplicate"] for a in answers) == 1
    assert {a["event_id"] for a in answers} == {"same"}
    assert len(local.results_of(run_id)) == 1
    local.work(run_id)
    assert_done_with_event_once(local, run_id)


def test_two_events_for_one_wait_the_first_wins_and_the_second_stays(local):
    run_id = local.start()
    local.work(run_id)
    first = local.desk().send(run_id, "ci-finished", PASSED, event_id="a")
    second = local.desk().send(run_id, "ci-finished", {"conclusion": "failure"}, event_id="b")
    assert (first.status, second.status) == ("delivered", "queued")
    # The second stays in the mailbox, for the next wait of its name (this run has none).
    assert local.pending(run_id) == ["b"]
    local.work(run_id)
    head = local.head(run_id)
    assert head.status is RunStatus.DONE
    assert [(s.how, s.event_id) for s in local.results_of(run_id)] == [("event", "a")]
    assert local.pending(run_id) == ["b"]


def test_an_event_racing_the_timeout_has_one_outcome(local):
    run_id = local.start()
    local.work(run_id)
    local.clock.now = utcnow() + timedelta(hours=3)
    desk = local.desk()
    results: list[object] = []
    go = threading.Barrier(2)

    def timeout() -> None:
        runtime = LocalRuntime.open(LocalSettings(store=local.url))
        try:
            engine = runtime.engine(worker_id="sweeper", logger=LOG)
            go.wait()
            results.append(runtime.wait_settler(engine)(local.clock.now))
        finally:
            runtime.close()

    sweeper = threading.Thread(target=timeout)
    sweeper.start()
    go.wait()
    sent = desk.send(run_id, "ci-finished", PASSED, event_id="racer")
    sweeper.join()
    settled = local.results_of(run_id)
    assert len(settled) == 1
    if settled[0].how == "event":
        assert sent.status == "delivered"
    else:
        assert settled[0].how == "timeout"
        assert sent.status == "queued"
        assert local.pending(run_id) == ["racer"]


# --- timers -------------------------------------------------------------------------------------


def test_a_sleeping_run_is_not_picked_up_before_it_is_due_and_once_after(local):
    run_id = local.start(nap=True)
    local.work(run_id)
    local.desk().send(run_id, "ci-finished", PASSED, event_id="d-1")
    local.work(run_id)
    head = local.head(run_id)
    assert head.status is RunStatus.WAITING
    assert head.waiting is not None
    assert head.waiting.kind == "timer"
    due = head.waiting.due
    assert due is not None
    local.clock.now = due - timedelta(milliseconds=1)
    local.work(run_id)
    assert local.head(run_id).version == head.version  # not a write
    local.clock.now = due
    local.work(run_id)
    done = local.head(run_id)
    assert done.status is RunStatus.DONE
    assert [s.how for s in local.results_of(run_id)] == ["event", "due"]
    steps = [c.event for c in local.runtime.store.list_checkpoints(run_id)]
    assert sum(isinstance(e, StepCompleted) and e.call.name == "nap" for e in steps) == 1


def test_a_sleeping_run_can_be_woken_early_and_only_a_sleeping_one(local):
    run_id = local.start(nap=True)
    local.work(run_id)
    with pytest.raises(NotSleeping, match="waits for an event, not a time"):
        local.desk().wake(run_id, by="dana")
    local.desk().send(run_id, "ci-finished", PASSED, event_id="d-1")
    local.work(run_id)
    woken = local.desk().wake(run_id, by="dana")
    assert woken.status is RunStatus.RUNNING
    assert woken.last_result is not None
    assert woken.last_result.startswith("Woken early by dana")
    with pytest.raises(NotSleeping):
        local.desk().wake(run_id, by="dana")
    local.work(run_id)
    assert local.head(run_id).status is RunStatus.DONE


# --- the mailbox's rooms ------------------------------------------------------------------------

FLOOD = 10_000


def test_a_flood_of_made_up_names_leaves_room_for_the_event_the_run_waits_for(local):
    """An agent that declares no events keeps an event of any name: 10,000 names its run never
    waits for fill the room they share in its mailbox, and the event it waits for is still
    taken and delivered."""
    run_id = local.start_of(OPEN_AGENT)
    local.work(run_id)
    assert local.head(run_id).status is RunStatus.WAITING
    desk = local.desk()
    kept = 0
    for n in range(FLOOD):
        try:
            desk.send(run_id, f"junk-{n}", {"n": n}, event_id=f"junk-{n}")
            kept += 1
        except MailboxFull:
            pass

    sent = desk.send(run_id, "ci-finished", PASSED, event_id="d-1")

    print(
        f"\n{FLOOD:,} made-up names: {kept} kept, {FLOOD - kept:,} refused; "
        f"ci-finished: {sent.status}"
    )
    assert kept == MAX_MAILBOX_EVENTS
    assert sent.status == "delivered"
    local.work(run_id)
    head = local.head(run_id)
    assert head.status is RunStatus.DONE
    assert [(s.how, s.event_id) for s in local.results_of(run_id)] == [("event", "d-1")]


def test_a_flood_of_one_declared_name_leaves_room_for_another_sent_early(local):
    run_id = local.start_of(TWO_EVENTS_AGENT)
    desk = local.desk()
    for n in range(MAX_MAILBOX_EVENTS):
        desk.send(run_id, "deploy-done", {"n": n}, event_id=f"deploy-{n}")
    with pytest.raises(MailboxFull):
        desk.send(run_id, "deploy-done", {"n": "one more"}, event_id="deploy-one-more")

    # Before the run waits for it: kept in a room of its own, and taken by the wait.
    assert desk.send(run_id, "ci-finished", PASSED, event_id="d-1").status == "queued"
    local.work(run_id)
    assert [(s.how, s.event_id) for s in local.results_of(run_id)] == [("event", "d-1")]
    assert local.head(run_id).status is RunStatus.DONE


# --- refusals change nothing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_id", "name", "data", "event_id", "error", "message"),
    [
        ("nope", "ci-finished", PASSED, None, RunNotFound, "no run with id 'nope'"),
        ("run-1", "bad name!", PASSED, None, InvalidInput, "name: an event name"),
        ("run-1", "ci-finished", PASSED, "", InvalidInput, "event_id: an event id"),
        ("run-1", "ci-finished", {"x": float("nan")}, None, InvalidInput, "data: the payload"),
        ("run-1", "ci-finished", "x" * 300_000, None, PayloadTooLarge, "over the 262,144"),
        ("run-1", "deploy-done", PASSED, None, EventNotAwaited, "waits for no event named"),
        ("run-1", "ci-finished", {"conclusion": "maybe"}, None, EventInvalid, "data.conclusion"),
    ],
)
def test_a_refused_event_changes_nothing(local, run_id, name, data, event_id, error, message):
    local.start()
    local.work("run-1")
    before = local.tables()
    with pytest.raises(error, match=message):
        local.desk().send(run_id, name, data, event_id=event_id)
    assert local.tables() == before


def test_a_wait_is_settled_only_by_what_it_waits_for(local):
    from ratchet.state import PersonDecided
    from ratchet.waits import timer_due

    run_id = local.start()
    local.work(run_id)
    head = local.head(run_id)
    with pytest.raises(NotWaiting, match="waiting for an event"):
        local.engine.decide_waiting(head, PersonDecided(approved=True, by="dana"), step=1)
    with pytest.raises(NotWaiting, match="waiting for an event"):
        local.engine.decide_waiting(head, timer_due(TimerWait(seconds=2), 1, utcnow()), step=1)
    assert local.head(run_id).version == head.version


def test_the_history_says_what_each_wait_was_and_how_it_settled(local):
    from ratchet.summary import described

    run_id = local.start(nap=True)
    local.work(run_id)
    local.desk().send(run_id, "ci-finished", PASSED, event_id="d-1")
    local.work(run_id)
    local.desk().wake(run_id, by="dana")
    said = [
        described(json.loads(c.event.model_dump_json(exclude_none=True)))["explanation"]
        for c in local.runtime.store.list_checkpoints(run_id)
    ]
    assert said[:2] == ["created", "step committed; waits for the event 'ci-finished'"]
    assert "event 'ci-finished' arrived (d-1)" in said
    assert any(s.startswith("step committed; sleeps until 20") for s in said)
    assert said[-1] == "woken early by dana"


BAD_WAITS = {
    "negative sleep": lambda: sleep_for(-1),
    "ten-year sleep": lambda: sleep_for(10 * 365 * 86400),
    "naive time": lambda: sleep_until(datetime(2030, 1, 1)),
    "bad event name": lambda: wait_for_event("ci finished"),
    "zero timeout": lambda: wait_for_event("ci", timeout=0),
}


class Case(BaseModel):
    case: str


bad_wait_agent = Agent(
    name="bad-wait",
    tools=[Tool("bad", "Ask for a bad wait.", Case, lambda args, ctx: BAD_WAITS[args.case]())],
    policy=lambda view: ToolCall(name="bad", arguments={"case": view.params["case"]}),
    default_params={"case": ""},
)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("negative sleep", "a sleep must be from 1 second to a year (31,536,000 s), not -1"),
        ("ten-year sleep", "a sleep must be from 1 second to a year"),
        ("naive time", "sleep_until needs a timezone-aware"),
        ("bad event name", "an event name is 1-64 letters"),
        ("zero timeout", "timeout must be from 1 second"),
    ],
)
def test_a_wait_no_retry_can_make_valid_fails_the_run_at_once(local, case, message):
    options = RunOptions(model="scripted", params={"case": case})
    agent_ref = f"{__name__}:bad_wait_agent"
    assert local.engine.start(RunState(run_id="b", agent=agent_ref, goal="x", options=options))
    local.work("b")
    head = local.head("b")
    assert head.status is RunStatus.FAILED
    assert head.attempts == 1  # at once, not after three strikes
    assert message in (head.error or "")


# --- housekeeping -------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def local_on(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Local]:
    """`local` on a SQLite store, or on a Postgres one (whose blobs are rows, not files)."""
    if request.param == "sqlite":
        served = Local(tmp_path)
        yield served
        served.runtime.close()
        return
    monkeypatch.chdir(tmp_path)  # where a Postgres store's processes keep their files
    postgres = request.getfixturevalue("postgres")
    name = postgres.fresh_database()
    served = Local(tmp_path, postgres.url(name))
    yield served
    served.runtime.close()
    postgres.drop_database(name)


def _age_every_blob(local: Local, by: timedelta) -> list[str]:
    """Every blob of the store as if last put `by` ago: their addresses."""
    if local.url.startswith("postgresql"):
        with local.runtime.db.write() as tx:
            tx.execute("UPDATE blobs SET touched_at = touched_at - %s", (by,))
            return [str(address) for (address,) in tx.execute("SELECT address FROM blobs")]
    paths = list(Path(f"{local.runtime.root}.blobs").glob("*/*"))
    then = time.time() - by.total_seconds()
    for path in paths:
        os.utime(path, (then, then))
    return [path.name for path in paths]


def test_gc_keeps_the_blob_of_an_event_still_in_the_mailbox(local_on):
    # Given an event too large to keep inline, sent before the run waits (so only the
    # mailbox references its blob), and the blob older than gc's grace period
    local = local_on
    big = {"conclusion": "success", "url": "https://ci.example/" + "x" * (2 * INLINE_BYTES)}
    run_id = local.start()
    assert local.desk().send(run_id, "ci-finished", big, event_id="big").status == "queued"
    assert len(_age_every_blob(local, 2 * BLOB_GRACE)) == 1

    # When gc runs
    report = collect_garbage(
        local.runtime.housekeeping,
        older_than=timedelta(days=1),
        now=utcnow(),
        dry_run=False,
    )

    # Then the blob stays, and the wait that takes the event reads its payload from it
    assert (report.blobs_deleted, report.blobs_kept) == (0, 1)
    local.work(run_id)
    assert local.head(run_id).status is RunStatus.DONE
    [settled] = local.results_of(run_id)
    assert settled.blob is not None
    assert json.loads(local.runtime.blobs.get(settled.blob)) == big


def test_a_webhook_delivery_kept_early_is_not_taken_by_a_wait_without_webhooks(local):
    run_id = local.start(webhook=False)
    desk = local.desk()
    desk.send(run_id, "ci-finished", PASSED, event_id="hooked", source="webhook")
    local.work(run_id)
    head = local.head(run_id)
    assert head.status is RunStatus.WAITING  # not settled by the webhook's delivery
    refused = local.runtime.mailbox.get(run_id, "hooked")
    assert refused is not None
    assert refused.refused == "the wait takes no webhook deliveries (webhook=False)"
    assert desk.send(run_id, "ci-finished", PASSED, event_id="api").status == "delivered"
