"""The contract every HookBook backend must honour (`ratchet.ports.HookBook`): SQLite locally,
DynamoDB (on moto) on AWS, one suite."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from ratchet.adapters.dynamodb.hooks import DynamoDbHookBook
from ratchet.adapters.postgres.hooks import PostgresHookBook
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.hooks import SqliteHookBook
from ratchet.errors import StoreUnavailable
from ratchet.ports import Hook, HookBook
from ratchet.waiting.hooks import HookKeys
from tests.dynamodb_support import SETTINGS, moto_tables, new_client, scan
from tests.postgres_support import scratch_store

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
KEYS = HookKeys(b"k" * 32)


@dataclass
class HookBackend:
    name: str
    book: HookBook
    another: Callable[[], HookBook]
    """A second book on the same data, as another process (or container) would open."""
    rows: Callable[[], Any]


@pytest.fixture(scope="module")
def dynamodb() -> Iterator[DynamoDBClient]:
    with moto_tables() as client:
        yield client


@pytest.fixture(params=["sqlite", "dynamodb", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[HookBackend]:
    if request.param == "postgres":
        with scratch_store() as open_store:
            first = open_store()

            def postgres_rows() -> Any:
                with first.read() as tx:
                    return tx.execute("SELECT * FROM hooks ORDER BY hook_id").fetchall()

            yield HookBackend(
                "postgres",
                PostgresHookBook(first),
                lambda: PostgresHookBook(open_store()),
                postgres_rows,
            )
        return
    if request.param == "sqlite":
        path = tmp_path / "ratchet.db"
        db = SqliteDatabase(path)
        opened: list[SqliteDatabase] = []

        def another() -> HookBook:
            opened.append(SqliteDatabase(path, any_thread=True))
            return SqliteHookBook(opened[-1])

        def rows() -> Any:
            return db.connection.execute("SELECT * FROM hooks ORDER BY hook_id").fetchall()

        yield HookBackend("sqlite", SqliteHookBook(db), another, rows)
        for other in opened:
            other.close()
        db.close()
        return
    client = request.getfixturevalue("dynamodb")
    table = SETTINGS.checkpoints_table
    for item in scan(client, table):
        client.delete_item(TableName=table, Key={"run_id": item["run_id"], "sk": item["sk"]})
    yield HookBackend(
        "dynamodb",
        DynamoDbHookBook(client, table),
        lambda: DynamoDbHookBook(new_client(), table),
        lambda: scan(client, table),
    )


def hook(run_id: str = "run-1", name: str = "ci-finished", *, at: datetime = T0) -> Hook:
    return Hook(hook_id=KEYS.hook_id(run_id, name), run_id=run_id, name=name, created_at=at)


def test_an_added_hook_reads_back_by_its_id(backend):
    made = hook()
    assert backend.book.add(made) == (made, True)
    assert backend.book.get(made.hook_id) == made
    assert backend.another().get(made.hook_id) == made


def test_an_unknown_id_is_none(backend):
    backend.book.add(hook())
    assert backend.book.get("0" * 32) is None


def test_adding_a_hook_again_finds_the_first_and_writes_nothing(backend):
    first = hook()
    backend.book.add(first)
    before = backend.rows()
    later = hook(at=T0 + timedelta(days=1))
    assert backend.another().add(later) == (first, False)
    assert backend.rows() == before


def test_each_run_and_name_has_its_own_hook(backend):
    made = [hook("run-1", "a"), hook("run-1", "b"), hook("run-2", "a")]
    for each in made:
        backend.book.add(each)
    assert len({h.hook_id for h in made}) == 3
    assert [backend.book.get(h.hook_id) for h in made] == made


def test_of_two_adding_at_once_one_writes_and_both_get_the_same_hook(backend):
    results: list[tuple[Hook, bool]] = []
    books = [backend.another() for _ in range(2)]
    barrier = threading.Barrier(2)

    def add(book: HookBook, at: datetime) -> None:
        barrier.wait()
        results.append(book.add(hook(at=at)))

    threads = [
        threading.Thread(target=add, args=(b, T0 + timedelta(seconds=i)))
        for i, b in enumerate(books)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(created for _, created in results) == [False, True]
    assert len({stored for stored, _ in results}) == 1
    assert backend.book.get(hook().hook_id) == results[0][0]


def test_a_missing_table_is_a_store_unavailable_on_dynamodb(dynamodb):
    with pytest.raises(StoreUnavailable):
        DynamoDbHookBook(dynamodb, "no-such-table").get("0" * 32)


def test_a_store_made_before_hooks_gets_the_table_on_first_use(tmp_path):
    db = SqliteDatabase(tmp_path / "old.db")
    db.connection.execute("DROP TABLE hooks")
    assert SqliteHookBook(db).get("0" * 32) is None
    made = hook()
    assert SqliteHookBook(db).add(made) == (made, True)
    db.close()
