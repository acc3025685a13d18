"""The schedule book on a real Postgres store, reached by workers that share nothing but the
database (each with a pool of its own), with its records in clear or sealed; a schedule added
on a sealed store keeps its input in no clear byte of its row, and fires its run with it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ratchet.adapters.payload_keys import KeyringCodec
from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.postgres.schedules import PostgresScheduleBook
from ratchet.client import Client
from ratchet.runtime.local import LocalSettings
from ratchet.runtime.postgres import PostgresRuntime
from ratchet.schedules import ScheduleSpec, fire_due, new_schedule
from ratchet.sealing import PayloadCodec
from ratchet.stored import sealed_key_id
from tests.fixtures import sealed_agent
from tests.postgres_support import Cluster, scratch_store, shared_keyring

T0 = datetime(2026, 3, 1, 9, 0, 0, 500_000, tzinfo=UTC)
WORKERS = 8


SECRET = "Zanzibar-Quokka-7731"
LOG = logging.getLogger("ratchet.tests.postgres_schedules")
SEALED_AGENT = f"{sealed_agent.__name__}:agent"


@pytest.fixture
def open_store() -> Iterator[Callable[[], PostgresDatabase]]:
    with scratch_store() as open_store:
        yield open_store


@pytest.fixture(params=["clear", "sealed"])
def codec(request: pytest.FixtureRequest, tmp_path: Path) -> PayloadCodec | None:
    """The book's codec: none, or a payload key's (its records sealed): the book is the same."""
    if request.param == "clear":
        return None
    return KeyringCodec(tmp_path / "payload-keys", create=True)


def spec(name: str = "nightly") -> ScheduleSpec:
    return ScheduleSpec(name=name, agent="tests.waits_agent:agent", every_seconds=3600)


def test_a_schedule_reads_back_as_added_once_and_is_due_from_its_next_fire(open_store, codec):
    book = PostgresScheduleBook(open_store(), codec)
    added = new_schedule(spec(), T0)

    assert book.add(added)
    assert not book.add(new_schedule(spec(), T0 + timedelta(days=1)))  # the first stands

    assert book.get("nightly") == added
    assert book.all() == [added]
    assert book.due(added.next_fire - timedelta(microseconds=1)) == []
    assert book.due(added.next_fire) == [added]
    paused = added.model_copy(update={"paused": True})
    assert book.replace(paused, expected=added)
    assert book.due(added.next_fire) == []
    assert not book.replace(added, expected=added), "not what it read: nothing written"
    assert book.remove("nightly")
    assert book.get("nightly") is None
    assert not book.remove("nightly")


def test_of_workers_firing_one_time_at_once_one_moves_the_schedule_on(open_store, codec):
    first = PostgresScheduleBook(open_store(), codec)
    fired = new_schedule(spec(), T0)
    first.add(fired)
    books = [PostgresScheduleBook(open_store(), codec) for _ in range(WORKERS)]
    start = threading.Barrier(WORKERS)

    def move(n: int) -> bool:
        start.wait(timeout=30)
        return books[n].move_on(
            fired, next_fire=fired.next_fire + timedelta(hours=1), last_run=f"run-by-{n}"
        )

    with ThreadPoolExecutor(WORKERS) as pool:
        moved = list(pool.map(move, range(WORKERS)))

    assert moved.count(True) == 1
    stored = first.get("nightly")
    assert stored is not None
    assert stored.next_fire == fired.next_fire + timedelta(hours=1)
    assert stored.last_run == f"run-by-{moved.index(True)}"


def test_a_pause_that_landed_while_a_fire_started_its_run_is_kept(open_store, codec):
    book = PostgresScheduleBook(open_store(), codec)
    fired = new_schedule(spec(), T0)
    book.add(fired)
    book.replace(fired.model_copy(update={"paused": True}), expected=fired)

    assert book.move_on(fired, next_fire=fired.next_fire + timedelta(hours=1), last_run="r")

    stored = book.get("nightly")
    assert stored is not None
    assert (stored.paused, stored.last_run) == (True, "r")


def _records(db: PostgresDatabase) -> dict[str, str]:
    with db.read() as tx:
        return dict(tx.execute("SELECT name, record FROM schedules").fetchall())


def test_on_a_sealed_store_a_schedules_input_is_in_no_clear_byte_and_its_run_starts_with_it(
    postgres: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # What the store's processes keep on their host is in the working directory: the test's.
    monkeypatch.chdir(tmp_path)
    name = postgres.fresh_database(store=True)
    key = shared_keyring(tmp_path)
    runtime = PostgresRuntime.open(LocalSettings(store=postgres.url(name), payload_key=key))
    client = Client(runtime, worker_id="test", logger=LOG)
    try:
        assert runtime.codec is not None
        # Given a schedule in clear, added before the payload key was set
        PostgresScheduleBook(runtime.pg).add(
            new_schedule(spec("before").model_copy(update={"input": {"customer": SECRET}}), T0)
        )

        # When one is added on the sealed store
        client.schedule_add("nightly", agent=SEALED_AGENT, every="1h", input={"customer": SECRET})

        # Then its row holds its input in no clear byte, sealed under the store's key,
        records = _records(runtime.pg)
        print(f"\nstored records: {records}")
        assert SECRET not in records["nightly"]
        assert sealed_key_id(records["nightly"]) == runtime.codec.key_id
        assert SECRET in records["before"]
        # and both read back, and the sealed one fires its run with its input
        schedules = {schedule.name: schedule for schedule in client.schedules()}
        assert schedules["before"].spec.input == {"customer": SECRET}
        assert schedules["nightly"].spec.input == {"customer": SECRET}
        due = schedules["nightly"].next_fire

        def start(run_id: str, spec: ScheduleSpec, _: object) -> None:
            if spec.name == "nightly":
                client.start(run_id=run_id, agent=spec.agent, input=spec.input)

        started = list(fire_due(runtime.schedules, start, due, logger=LOG))
        (run_id,) = [run for run in started if run.startswith("nightly-")]
        assert client.head(run_id).options.params["customer"] == SECRET
        moved = _records(runtime.pg)["nightly"]
        assert SECRET not in moved
        assert sealed_key_id(moved) == runtime.codec.key_id
    finally:
        client.close()
        postgres.drop_database(name)
