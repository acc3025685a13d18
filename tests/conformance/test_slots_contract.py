"""The contract of `ratchet.ports.Slots`, the bound on a deployed agent's concurrent steps:
DynamoDB (on moto), its one backend (a local worker's lease is its run's slot instead). The
bound per key and the priority of waiting runs hold on both: DynamoDB's slots and the local
leases, on SQLite and on Postgres (a store's static part in clear and sealed)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ratchet.adapters.dynamodb.slots import DynamoDbSlots
from ratchet.adapters.payload_keys import KeyringCodec
from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.postgres.leases import PostgresLeases
from ratchet.adapters.postgres.store import PostgresCheckpointStore
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.leases import SqliteLeases
from ratchet.adapters.sqlite.store import SqliteCheckpointStore
from ratchet.ports import CheckpointStore, ConcurrencyBound, Leases
from ratchet.state import PRIORITY_AGING_SECONDS, Created, RunState, StoredCheckpoint
from tests.dynamodb_support import SETTINGS, serialized_moto_tables
from tests.postgres_support import scratch_store

AGENT = "tests.bounded_agent:agent"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def slots(clock: Clock) -> Iterator[DynamoDbSlots]:
    with serialized_moto_tables() as client:
        yield DynamoDbSlots(client, SETTINGS.checkpoints_table, clock=clock)


def test_a_name_has_at_most_its_limit_of_holders(slots):
    assert [slots.take(AGENT, 3, f"run-{n}", 60) for n in range(5)] == [True] * 3 + [False] * 2
    assert sorted(slots.holders(AGENT)) == ["run-0", "run-1", "run-2"]
    assert slots.take("another agent", 3, "run-3", 60)  # each name has slots of its own


def test_a_holder_taking_again_keeps_its_one_slot_and_renews_it(slots, clock):
    assert slots.take(AGENT, 2, "run-a", 60)
    clock.now += 50
    assert slots.take(AGENT, 2, "run-a", 60)  # a retried step of the same run
    assert slots.take(AGENT, 2, "run-b", 60)
    clock.now += 30  # past the first take's time, within the renewal's
    assert not slots.take(AGENT, 2, "run-c", 60)
    assert slots.holders(AGENT) == {"run-a": clock.now + 30, "run-b": clock.now + 30}


def test_a_released_slot_is_free_and_a_release_never_frees_anothers(slots):
    assert slots.take(AGENT, 1, "run-a", 60)
    slots.release(AGENT, "run-b")
    assert not slots.take(AGENT, 1, "run-b", 60)
    slots.release(AGENT, "run-a")
    assert slots.take(AGENT, 1, "run-b", 60)
    slots.release(AGENT, "run-a")  # no longer held by run-a: nothing happens
    assert list(slots.holders(AGENT)) == ["run-b"]


def test_a_dead_holders_slot_lapses_at_its_time_and_not_before(slots, clock):
    assert slots.take(AGENT, 1, "dead", 60)
    clock.now += 59.9
    assert not slots.take(AGENT, 1, "next", 60)
    clock.now += 0.1
    assert slots.take(AGENT, 1, "next", 60)
    slots.release(AGENT, "dead")  # its late release leaves the new holder's slot alone
    assert list(slots.holders(AGENT)) == ["next"]


def test_a_taker_that_read_the_slots_before_another_took_the_last_is_refused(slots, monkeypatch):
    stale = slots._held(AGENT)  # what a second taker read: every slot free
    assert slots.take(AGENT, 1, "first", 60)
    monkeypatch.setattr(slots, "_held", lambda name: stale)

    assert not slots.take(AGENT, 1, "second", 60)  # its write's condition turns it away
    monkeypatch.undo()
    assert list(slots.holders(AGENT)) == ["first"]


def test_racing_takers_never_share_a_slot(slots):
    barrier = threading.Barrier(12)
    taken: list[str] = []

    def take(holder: str) -> None:
        barrier.wait()
        if slots.take(AGENT, 3, holder, 60):
            taken.append(holder)

    threads = [threading.Thread(target=take, args=(f"run-{n}",)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(taken) == 3
    assert sorted(slots.holders(AGENT)) == sorted(taken)


# --- keyed slots and priority: the same contract on both backends ----------------------------
#
# Locally a worker's lease on a run is its slot, and its claim picks the waiting run that goes
# first; on AWS a step takes a slot item, and a waiter refused registers its place. Each
# backend is driven here through the same few verbs: `start` a run of a key and a priority,
# `take` its slot (True if it may work a step now), `release` it, and `turn` (which of the
# runs waiting gets a freed slot, each trying in the order given).

KEYED = ConcurrencyBound("keyed", None, per_key=2)
SLOT_SECONDS = 60.0


class SqliteKeyed:
    """Runs in a local store (their static part sealed, with `sealed`), claimed by leases."""

    def __init__(self, root: Path, clock: Clock, *, sealed: bool) -> None:
        codec = KeyringCodec(root / "payload-keys", create=True) if sealed else None
        self.store: CheckpointStore = SqliteCheckpointStore(
            SqliteDatabase(root / "ratchet.db"), codec
        )
        self.leases: Leases = SqliteLeases(SqliteDatabase(root / "ratchet.db"), clock=clock)
        self.clock = clock
        self._owners: dict[str, str] = {}

    def start(self, holder: str, key: str, priority: int = 0) -> None:
        moment = datetime.fromtimestamp(self.clock.now, UTC)
        state = RunState(
            run_id=holder,
            agent=AGENT,
            goal="Work",
            concurrency_key=key,
            priority=priority,
            created_at=moment,
            updated_at=moment,
        )
        created = Created(state=state)
        checkpoint = StoredCheckpoint(
            run_id=holder, version=1, step=0, status=state.status, worker_id="t", event=created
        )
        assert self.store.create_run(state, checkpoint)

    def take(self, holder: str) -> bool:
        return self._claim(holder, run_id=holder) == holder

    def release(self, holder: str) -> None:
        # As a worker lets go after a step: the step's commit wrote the run (its wait for the
        # next turn starts now), then the lease is given back.
        self._written(holder, datetime.fromtimestamp(self.clock.now, UTC))
        self.leases.release(holder, self._owners.get(holder, holder))

    def _written(self, holder: str, moment: datetime) -> None:
        assert isinstance(self.leases, SqliteLeases)
        with self.leases._db.write() as tx:
            tx.execute(
                "UPDATE runs SET updated_at = ? WHERE run_id = ?", (moment.isoformat(), holder)
            )

    def turn(self, waiting: list[str]) -> str | None:
        owner = f"worker-{len(self._owners)}"
        taken = self._claim(owner, run_id=None)
        if taken is not None:
            self._owners[taken] = owner
        return taken

    def _claim(self, owner: str, *, run_id: str | None) -> str | None:
        return self.leases.claim(owner, SLOT_SECONDS, run_id=run_id, limit_of=lambda _: KEYED)


class PostgresKeyed(SqliteKeyed):
    """Runs in a Postgres store (their static part sealed, with `sealed`), claimed by its
    leases."""

    def __init__(self, root: Path, clock: Clock, *, sealed: bool, db: PostgresDatabase) -> None:
        codec = KeyringCodec(root / "payload-keys", create=True) if sealed else None
        self.store = PostgresCheckpointStore(db, codec)
        self.leases = PostgresLeases(db, clock=clock)
        self._db = db
        self.clock = clock
        self._owners = {}

    def _written(self, holder: str, moment: datetime) -> None:
        with self._db.write() as tx:
            tx.execute("UPDATE runs SET updated_at = %s WHERE run_id = %s", (moment, holder))


class DynamoDbKeyed:
    """The key's slot items, taken by each run's step as the engine takes them."""

    def __init__(self, slots: DynamoDbSlots) -> None:
        self.slots = slots
        self.runs: dict[str, tuple[str, int]] = {}

    def start(self, holder: str, key: str, priority: int = 0) -> None:
        self.runs[holder] = (key, priority)

    def take(self, holder: str) -> bool:
        key, priority = self.runs[holder]
        assert KEYED.per_key is not None
        return self.slots.take(
            KEYED.key_slots(key), KEYED.per_key, holder, SLOT_SECONDS, priority=priority
        )

    def release(self, holder: str) -> None:
        self.slots.release(KEYED.key_slots(self.runs[holder][0]), holder)

    def turn(self, waiting: list[str]) -> str | None:
        return next((holder for holder in waiting if self.take(holder)), None)


@pytest.fixture(params=["sqlite", "sqlite-sealed", "postgres", "postgres-sealed", "dynamodb"])
def keyed(request, tmp_path, clock: Clock) -> Iterator[SqliteKeyed | DynamoDbKeyed]:
    if request.param.startswith("sqlite"):
        yield SqliteKeyed(tmp_path, clock, sealed=request.param == "sqlite-sealed")
        return
    if request.param.startswith("postgres"):
        with scratch_store() as open_store:
            sealed = request.param == "postgres-sealed"
            yield PostgresKeyed(tmp_path, clock, sealed=sealed, db=open_store())
        return
    with serialized_moto_tables() as client:
        yield DynamoDbKeyed(DynamoDbSlots(client, SETTINGS.checkpoints_table, clock=clock))


def test_a_key_has_at_most_its_bound_of_runs_at_work_and_other_keys_theirs(keyed):
    for holder, key in [("a0", "acme"), ("a1", "acme"), ("a2", "acme"), ("g0", "globex")]:
        keyed.start(holder, key)

    assert [keyed.take(h) for h in ("a0", "a1", "a2", "g0")] == [True, True, False, True]
    keyed.release("a0")
    assert keyed.take("a2")


def test_a_dead_holders_slot_of_a_key_lapses_at_its_time_and_not_before(keyed, clock):
    keyed.start("dead", "acme")
    keyed.start("next", "acme")
    keyed.start("again", "acme")
    assert keyed.take("dead")
    assert keyed.take("again")

    clock.now += SLOT_SECONDS - 0.1
    assert not keyed.take("next")
    clock.now += 0.1
    assert keyed.take("next")


def test_a_freed_slot_goes_to_the_waiting_run_of_higher_priority(keyed, clock):
    # Given a key's two slots held, and a run of priority 0 waiting before one of priority 9.
    keyed.start("a0", "acme")
    keyed.start("a1", "acme")
    keyed.start("low", "acme", priority=0)
    keyed.start("high", "acme", priority=9)
    assert keyed.take("a0")
    assert keyed.take("a1")
    assert not keyed.take("low")
    assert not keyed.take("high")

    # When a slot frees a second later, and the low one asks first.
    clock.now += 1
    keyed.release("a0")

    # Then the high one has it, and the low one the next.
    assert keyed.turn(["low", "high"]) == "high"
    keyed.release("a1")
    assert keyed.turn(["low"]) == "low"


def test_a_run_of_low_priority_that_waited_long_enough_goes_before_a_fresh_high_one(keyed, clock):
    # Given a run of priority 0 waiting since the key's slots were taken, and a run of
    # priority 9 that came 9 x PRIORITY_AGING_SECONDS (and a second) later.
    keyed.start("a0", "acme")
    keyed.start("a1", "acme")
    keyed.start("low", "acme", priority=0)
    assert keyed.take("a0")
    assert keyed.take("a1")
    assert not keyed.take("low")
    for _ in range(9):  # the holders' steps go on, and the low one keeps asking
        clock.now += PRIORITY_AGING_SECONDS
        assert keyed.take("a0")
        assert keyed.take("a1")
        assert not keyed.take("low")
    clock.now += 1
    keyed.start("high", "acme", priority=9)
    assert not keyed.take("high")

    # When a slot frees.
    keyed.release("a0")

    # Then the run that waited has it: its priority grew past the newcomer's.
    assert keyed.turn(["high", "low"]) == "low"
