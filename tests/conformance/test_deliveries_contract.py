"""The contract of the webhooks' book of deliveries (`ratchet.runtime.webhooks.DeliveryBook`,
whose terms `ratchet.adapters.sqlite.deliveries` states): SQLite's and Postgres's, each with its
bodies sealed and not. DynamoDB has none: on AWS a run's status changes are EventBridge events.

The runs are a real checkpoint store's, in the same database (the book reads their heads); a
second book on a connection of its own (a pool of its own, on Postgres) stands for another
sender, as another process reaches the store.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ratchet.adapters.payload_keys import KeyringCodec
from ratchet.adapters.postgres.deliveries import PostgresDeliveries
from ratchet.adapters.postgres.store import PostgresCheckpointStore
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.deliveries import CLAIM_SECONDS, Moved, Owed, SqliteDeliveries
from ratchet.adapters.sqlite.store import SqliteCheckpointStore
from ratchet.ports import CheckpointStore
from ratchet.runtime.webhooks import DeliveryBook
from ratchet.sealing import PayloadCodec
from ratchet.state import RunStatus
from tests.conformance.test_store_contract import new_run as created_run
from tests.postgres_support import scratch_store

T0 = 1_800_000_000.0
URL = "https://hooks.example/ratchet"
SECRET = "card 4242-4242-4242-4242"


class Clock:
    """The books' time, moved by the test: a claim lapses when the test says, not when a
    machine's load lets it."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class DeliveriesBackend:
    name: str
    store: CheckpointStore
    book: DeliveryBook
    other: Callable[[], DeliveryBook]
    """Another sender's book, on a connection of its own (usable from another thread)."""
    stored_bodies: Callable[[], list[str]]
    """Every delivery's body as the store holds it."""
    clock: Clock
    sealed: bool = False


def _sqlite(tmp_path: Path, codec: PayloadCodec | None, clock: Clock) -> Iterator[Any]:
    path = tmp_path / "ratchet.db"
    db = SqliteDatabase(path)
    opened = [db]

    def other() -> DeliveryBook:
        # A connection serves the thread that opened it: each sender opens its own.
        connection = SqliteDatabase(path, any_thread=True)
        opened.append(connection)
        return SqliteDeliveries(connection, codec, clock=clock)

    def bodies() -> list[str]:
        return [row[0] for row in db.connection.execute("SELECT body FROM deliveries")]

    try:
        yield DeliveriesBackend(
            "sqlite",
            SqliteCheckpointStore(db, codec),
            SqliteDeliveries(db, codec, clock=clock),
            other,
            bodies,
            clock,
        )
    finally:
        for connection in opened:
            connection.close()


def _postgres(tmp_path: Path, codec: PayloadCodec | None, clock: Clock) -> Iterator[Any]:
    with scratch_store() as open_store:
        db = open_store()

        def bodies() -> list[str]:
            with db.read() as tx:
                return [str(row[0]) for row in tx.execute("SELECT body FROM deliveries")]

        yield DeliveriesBackend(
            "postgres",
            PostgresCheckpointStore(db, codec),
            PostgresDeliveries(db, codec, clock=clock),
            lambda: PostgresDeliveries(open_store(), codec, clock=clock),
            bodies,
            clock,
        )


BACKENDS = {"sqlite": _sqlite, "postgres": _postgres}


@pytest.fixture(params=["sqlite", "postgres", "sqlite-sealed", "postgres-sealed"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DeliveriesBackend]:
    # "-sealed": with a payload codec (`RATCHET_PAYLOAD_KEY`), which seals each body.
    name, _, sealed = request.param.partition("-")
    codec = KeyringCodec(tmp_path / "payload-keys", create=True) if sealed else None
    for found in BACKENDS[name](tmp_path, codec, Clock()):
        found.sealed = codec is not None
        yield found


def new_run(store: CheckpointStore, run_id: str) -> None:
    assert store.create_run(*created_run(run_id))


def move(store: CheckpointStore, run_id: str) -> int:
    """Move the run's head on a version (an attempt counted): its new version."""
    head = store.load_head(run_id)
    assert head is not None
    return store.begin_attempt(run_id, head.version)


def owe(run_id: str, version: int, *, url: str = URL, body: str = "") -> Owed:
    change = f"{run_id}:{version}"
    return Owed(f"{change}@{url[-4:]}", change, run_id, url, body or f'{{"id": "{change}"}}')


def owe_moved(book: DeliveryBook, moved: Moved, *owed: Owed) -> bool:
    return book.enqueue(moved, version=moved.version, status=RunStatus.RUNNING, owed=owed)


# --- where the first sender starts -------------------------------------------------------------


def test_the_first_sender_owes_nothing_of_what_was_there_before_it(backend):
    # Given runs made (and moved) before any sender ran on the store
    new_run(backend.store, "old")
    move(backend.store, "old")

    # When the first sender prepares, and a run is made and the old one moves after
    backend.book.prepare()
    new_run(backend.store, "new")
    moved_to = move(backend.store, "old")

    # Then what moved after is owed, from where it stood at the start; nothing before
    moved = {m.run_id: m for m in backend.book.moved()}
    assert moved["new"] == Moved("new", 1, None, None)
    assert moved["old"] == Moved("old", moved_to, moved_to - 1, RunStatus.RUNNING)
    assert set(moved) == {"new", "old"}


def test_a_later_sender_starts_where_the_first_did(backend):
    backend.book.prepare()
    new_run(backend.store, "r1")

    # A second sender, starting after the run was made, owes it all the same
    later = backend.other()
    later.prepare()

    assert [m.run_id for m in later.moved()] == ["r1"]


# --- owing ------------------------------------------------------------------------------------


def test_enqueue_owes_each_change_and_moves_the_cursor(backend):
    backend.book.prepare()
    new_run(backend.store, "r1")
    (moved,) = backend.book.moved()

    assert owe_moved(backend.book, moved, owe("r1", 1), owe("r1", 1, url="https://b.example/h"))

    assert backend.book.moved() == []
    assert sorted(d.url for d in backend.book.due()) == ["https://b.example/h", URL]
    assert backend.book.owing("r1") == 2
    assert backend.book.owing("other") == 0


def test_a_change_read_by_two_senders_is_owed_once(backend):
    backend.book.prepare()
    new_run(backend.store, "r1")
    other = backend.other()
    # Both senders read the run moved, from no cursor and then from one
    (first,) = backend.book.moved()
    (same,) = other.moved()

    assert owe_moved(backend.book, first, owe("r1", 1))
    assert not owe_moved(other, same, owe("r1", 1, url="https://b.example/h"))

    version = move(backend.store, "r1")
    (again,) = backend.book.moved()
    (stale,) = other.moved()
    assert again.cursor == stale.cursor == 1
    assert owe_moved(other, stale, owe("r1", version, url="https://b.example/h"))
    assert not owe_moved(backend.book, again, owe("r1", version))
    assert sorted((d.change_id, d.url) for d in backend.book.listed("r1")) == [
        ("r1:1", URL),
        ("r1:2", "https://b.example/h"),
    ]


def test_senders_racing_on_many_runs_owe_each_change_once(backend):
    # Given runs moved, each read by several senders at once on connections of their own
    backend.book.prepare()
    runs = [f"r{i}" for i in range(12)]
    for run_id in runs:
        new_run(backend.store, run_id)
    senders = [backend.other() for _ in range(4)]
    start = threading.Barrier(len(senders))
    taken: list[tuple[str, int]] = []
    lock = threading.Lock()

    def send(index: int, book: DeliveryBook) -> None:
        read = book.moved()
        start.wait(timeout=60)
        for moved in read:
            # Each sender owes its own delivery id: two owed for one change would both stay.
            if book.enqueue(
                moved,
                version=moved.version,
                status=RunStatus.RUNNING,
                owed=[owe(moved.run_id, moved.version, url=f"https://s{index}.example/h")],
            ):
                with lock:
                    taken.append((moved.run_id, index))

    threads = [threading.Thread(target=send, args=(i, book)) for i, book in enumerate(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    owed = backend.book.listed(limit=100)
    print(f"{backend.name}: {len(taken)} enqueues won of {len(runs) * len(senders)} tried")
    assert sorted(run_id for run_id, _ in taken) == sorted(runs)
    assert sorted(d.run_id for d in owed) == sorted(runs)
    assert backend.book.moved() == []


# --- sending ----------------------------------------------------------------------------------


def test_a_delivery_is_claimed_by_one_sender_until_its_claim_lapses(backend):
    backend.book.prepare()
    new_run(backend.store, "r1")
    (moved,) = backend.book.moved()
    owe_moved(backend.book, moved, owe("r1", 1))
    other = backend.other()
    (delivery,) = backend.book.due()

    assert backend.book.claim(delivery)
    assert not other.claim(delivery)
    assert other.due() == []
    assert backend.book.next_due() == T0 + CLAIM_SECONDS

    # A sender killed mid-send records nothing: its claim lapses, and the delivery is due
    backend.clock.now = T0 + CLAIM_SECONDS
    (again,) = other.due()
    assert again.delivery_id == delivery.delivery_id
    assert other.claim(again)


def test_of_senders_claiming_one_delivery_at_once_one_holds_it(backend):
    # Given deliveries due, read by several senders on connections of their own
    backend.book.prepare()
    for i in range(10):
        new_run(backend.store, f"r{i}")
    for moved in backend.book.moved():
        owe_moved(backend.book, moved, owe(moved.run_id, 1))
    senders = [backend.other() for _ in range(6)]
    due = backend.book.due()
    assert len(due) == 10
    start = threading.Barrier(len(senders))
    held: Counter[str] = Counter()
    lock = threading.Lock()

    # When each claims every one of them at once
    def claim(book: DeliveryBook) -> None:
        start.wait(timeout=60)
        for delivery in due:
            if book.claim(delivery):
                with lock:
                    held[delivery.delivery_id] += 1

    threads = [threading.Thread(target=claim, args=(book,)) for book in senders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    # Then each is held by one sender
    print(f"{backend.name}: {sum(held.values())} claims won of {len(due) * len(senders)} tried")
    assert held == Counter({d.delivery_id: 1 for d in due})


def test_a_delivery_read_before_another_sender_sent_it_is_not_claimed(backend):
    backend.book.prepare()
    new_run(backend.store, "r1")
    (moved,) = backend.book.moved()
    owe_moved(backend.book, moved, owe("r1", 1))
    other = backend.other()
    (read,) = other.due()
    (delivery,) = backend.book.due()

    # One sender claims it, fails, and it is due again at once (a retry at now)
    assert backend.book.claim(delivery)
    backend.book.record(delivery, delivered=False, error="answered HTTP 500", retry_at=T0)

    # The other, holding what it read before that attempt, does not send it again
    assert not other.claim(read)
    (fresh,) = other.due()
    assert fresh.attempts == 1
    assert other.claim(fresh)


def test_each_outcome_is_recorded(backend):
    backend.book.prepare()
    for run_id in ("ok", "retried", "gave-up"):
        new_run(backend.store, run_id)
    for moved in backend.book.moved():
        owe_moved(backend.book, moved, owe(moved.run_id, 1))
    due = {d.run_id: d for d in backend.book.due()}
    for delivery in due.values():
        assert backend.book.claim(delivery)

    backend.book.record(due["ok"], delivered=True, error=None, retry_at=None)
    backend.book.record(due["retried"], delivered=False, error="answered HTTP 500", retry_at=T0 + 5)
    backend.book.record(due["gave-up"], delivered=False, error="not sent: refused", retry_at=None)

    listed = {d.run_id: d for d in backend.book.listed()}
    assert {r: (d.state, d.attempts, d.last_error) for r, d in listed.items()} == {
        "ok": ("delivered", 1, None),
        "retried": ("pending", 1, "answered HTTP 500"),
        "gave-up": ("failed", 1, "not sent: refused"),
    }
    assert all(d.answered_at == T0 for d in listed.values())
    assert backend.book.due() == []
    assert backend.book.next_due() == T0 + 5
    assert backend.book.owing() == 1
    assert backend.book.owing(due_by=T0 + 4) == 0
    backend.clock.now = T0 + 5
    assert [d.run_id for d in backend.book.due()] == ["retried"]


def test_nothing_owed_is_lost_across_a_senders_restart(backend):
    # Given a sender that owed a change and claimed it, then died (its book is dropped)
    backend.book.prepare()
    new_run(backend.store, "r1")
    (moved,) = backend.book.moved()
    owe_moved(backend.book, moved, owe("r1", 1))
    (delivery,) = backend.book.due()
    assert backend.book.claim(delivery)
    new_run(backend.store, "r2")

    # When a sender starts again
    restarted = backend.other()
    restarted.prepare()

    # Then it owes what the dead one had not, and sends its delivery once the claim lapses
    assert [m.run_id for m in restarted.moved()] == ["r2"]
    assert restarted.owing() == 2
    backend.clock.now = T0 + CLAIM_SECONDS
    assert [d.delivery_id for d in restarted.due()] == [delivery.delivery_id]


# --- reading ----------------------------------------------------------------------------------


def test_deliveries_are_listed_newest_first_by_run_and_bounded(backend):
    backend.book.prepare()
    for at, run_id in enumerate(("a", "b", "a")):
        if backend.store.load_head(run_id) is None:
            new_run(backend.store, run_id)
            version = 1
        else:
            version = move(backend.store, run_id)
        backend.clock.now = T0 + at
        (moved,) = [m for m in backend.book.moved() if m.run_id == run_id]
        owe_moved(backend.book, moved, owe(run_id, version))

    assert [d.change_id for d in backend.book.listed()] == ["a:2", "b:1", "a:1"]
    assert [d.change_id for d in backend.book.listed("a")] == ["a:2", "a:1"]
    assert [d.change_id for d in backend.book.listed(limit=1)] == ["a:2"]
    assert backend.book.listed("none") == []


def test_a_store_no_sender_ran_on_lists_no_deliveries(backend):
    new_run(backend.store, "r1")

    assert backend.book.listed() == []
    assert backend.book.listed("r1") == []


def test_a_body_is_sealed_when_a_codec_is_set_and_read_whole(backend):
    backend.book.prepare()
    new_run(backend.store, "w1")
    body = f'{{"run_id": "w1", "status": "done", "summary": "paid {SECRET}"}}'
    (moved,) = backend.book.moved()
    owe_moved(backend.book, moved, owe("w1", 1, body=body))

    (stored,) = backend.stored_bodies()
    (due,) = backend.book.due()
    assert due.body == body
    assert [d.body for d in backend.book.listed("w1")] == [body]
    assert [d.body for d in backend.other().listed("w1")] == [body]
    # Sealed, the body is in no stored byte; in clear, it is as it was given
    assert (SECRET in stored) is not backend.sealed
