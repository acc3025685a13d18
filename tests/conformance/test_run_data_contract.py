"""The contract every RunData backend must honour (`ratchet.ports.RunData`).

One suite, parametrised over backends (`backend` below): the local store's SQLite file, and
the stack's app table on DynamoDB (moto). Where the backends differ on purpose (how they are
reached from threads and other processes, how their errors are named), the difference is a
test of its own at the end.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest
from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.data import DynamoDbRunData
from ratchet.adapters.payload_keys import KeyringCodec
from ratchet.adapters.postgres.data import PostgresRunData
from ratchet.adapters.run_data import MAX_DATA_KEY_BYTES
from ratchet.adapters.sqlite.data import SqliteRunData
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.errors import InvalidInput, StoreBusy, StoreUnavailable
from ratchet.ports import MAX_DATA_KEY_CHARS, MAX_DATA_VALUE_BYTES, RunData
from tests.dynamodb_support import SETTINGS, new_client, scan, serialized_moto_tables
from tests.postgres_support import scratch_store

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

FOUR_BYTES = "\N{GRINNING FACE}"


@dataclass
class Backend:
    name: str
    open: Callable[[str], RunData]
    """The data of a run, through a connection (SQLite) or client (DynamoDB) of its own, as
    another process would reach it."""


@pytest.fixture(scope="module")
def dynamodb() -> Iterator[DynamoDBClient]:
    """One moto DynamoDB for the module, serving one request at a time; each test starts
    from an empty app table."""
    with serialized_moto_tables() as client:
        yield client


def emptied(client: DynamoDBClient) -> DynamoDBClient:
    for item in scan(client, SETTINGS.app_table):
        client.delete_item(TableName=SETTINGS.app_table, Key={"pk": item["pk"], "sk": item["sk"]})
    return client


@pytest.fixture(
    params=[
        "sqlite",
        "dynamodb",
        "postgres",
        "sqlite-sealed",
        "dynamodb-sealed",
        "postgres-sealed",
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    # "-sealed": with a payload codec (`RATCHET_PAYLOAD_KEY`), which seals each value.
    name, _, sealed = request.param.partition("-")
    codec = KeyringCodec(tmp_path / "payload-keys", create=True) if sealed else None
    if name == "sqlite":
        opened: list[SqliteDatabase] = []

        def sqlite_data(run_id: str) -> RunData:
            db = SqliteDatabase(tmp_path / "ratchet.db")
            opened.append(db)
            return SqliteRunData(db, run_id, codec)

        yield Backend("sqlite", sqlite_data)
        for db in opened:
            db.close()
    elif name == "postgres":
        with scratch_store() as open_store:
            yield Backend("postgres", lambda run_id: PostgresRunData(open_store(), run_id, codec))
    else:
        emptied(request.getfixturevalue("dynamodb"))
        yield Backend(
            "dynamodb",
            lambda run_id: DynamoDbRunData(new_client(), SETTINGS.app_table, run_id, codec=codec),
        )


@pytest.fixture
def data(backend: Backend) -> RunData:
    return backend.open("run-1")


# --- reads and writes ------------------------------------------------------------------------


def test_a_value_put_is_read_back_and_a_missing_key_is_none(data):
    data.put("plan", "copy the orders")

    assert data.get("plan") == "copy the orders"
    assert data.get("nothing here") is None


def test_put_overwrites_and_delete_removes(data):
    data.put("plan", "first")
    data.put("plan", "second")
    assert data.get("plan") == "second"

    data.delete("plan")
    data.delete("plan")  # deleting what is not there is no error

    assert data.get("plan") is None
    assert data.items() == []


def test_put_once_writes_only_if_the_key_has_no_value(data):
    assert data.put_once("step-3", "the note") is True
    assert data.put_once("step-3", "the note") is False
    assert data.put_once("step-3", "another note") is False

    assert data.get("step-3") == "the note"


def test_put_once_writes_again_after_a_delete(data):
    data.put("k", "old")
    assert data.put_once("k", "new") is False
    data.delete("k")

    assert data.put_once("k", "new") is True
    assert data.get("k") == "new"


def test_the_empty_text_is_a_value(data):
    assert data.put_once("empty", "") is True

    assert data.get("empty") == ""
    assert data.put_once("empty", "something") is False


def test_the_largest_key_and_value_are_kept_whole(data):
    value = "é" * (MAX_DATA_VALUE_BYTES // 2)  # two bytes each: exactly the limit
    longest = "k" * MAX_DATA_KEY_CHARS
    widest = FOUR_BYTES * (MAX_DATA_KEY_BYTES // 4)

    data.put(longest, value)
    data.put(widest, "four-byte characters")

    assert data.get(longest) == value
    assert data.get(widest) == "four-byte characters"


def test_text_of_every_plane_round_trips(data):
    text = 'naïve 日本語 \N{GRINNING FACE} \x00 tab\t newline\n quote" end'

    data.put(text[:40], text)

    assert data.items() == [(text[:40], text)]


# --- items: order and prefix -----------------------------------------------------------------


def test_items_are_ordered_by_key_whatever_the_write_order(data):
    keys = ["b", "a", "notes/00000010", "notes/00000002", "A", "a/b", "a0", "é", FOUR_BYTES]
    for n, key in enumerate(keys):
        data.put(key, str(n))

    listed = data.items()

    # Python orders str by code point, which is the UTF-8 byte order both backends keep.
    assert [k for k, _ in listed] == sorted(keys)
    assert dict(listed) == {key: str(n) for n, key in enumerate(keys)}


def test_items_lists_exactly_the_keys_with_the_prefix(data):
    for key in ["note", "notes/1", "notes/2", "notes/", "notes0", "notez", "other", "n"]:
        data.put(key, key.upper())

    assert data.items("notes/") == [
        ("notes/", "NOTES/"),
        ("notes/1", "NOTES/1"),
        ("notes/2", "NOTES/2"),
    ]
    with_note = ["note", "notes/", "notes/1", "notes/2", "notes0", "notez"]
    assert [k for k, _ in data.items("note")] == with_note
    assert data.items("notes/3") == []
    assert data.items("zzz") == []


def test_a_prefix_ending_in_the_highest_characters_lists_only_its_keys(data):
    top = "\U0010ffff"
    for key in [f"a{top}", f"a{top}{top}", f"a{top}b", "b", f"{top}"]:
        data.put(key, "v")

    assert [k for k, _ in data.items(f"a{top}")] == [f"a{top}", f"a{top}b", f"a{top}{top}"]
    assert [k for k, _ in data.items(top)] == [top]


# --- runs and readers ------------------------------------------------------------------------


def test_no_run_sees_another_runs_keys(backend):
    # Run ids that prefix one another, and one that looks like a key path.
    runs = {run_id: backend.open(run_id) for run_id in ["run-1", "run-10", "run", "run-1/x"]}
    for run_id, data in runs.items():
        data.put("shared", run_id)
        assert data.put_once("once", run_id) is True

    for run_id, data in runs.items():
        assert data.items() == [("once", run_id), ("shared", run_id)]
    runs["run-1"].delete("shared")
    assert runs["run-10"].get("shared") == "run-10"
    assert runs["run"].items("shared") == [("shared", "run")]


def test_every_read_sees_every_write_that_returned_before_it(backend):
    writer, reader = backend.open("run-1"), backend.open("run-1")
    assert reader.get("k") is None  # a reader that has read before, and may cache

    for n in range(5):
        writer.put("k", f"v{n}")
        assert reader.get("k") == f"v{n}"
        assert reader.items() == [("k", f"v{n}")]
    assert writer.put_once("once", "first") is True
    assert reader.put_once("once", "second") is False
    writer.delete("k")
    assert reader.get("k") is None


def test_put_once_racing_writes_exactly_once(backend):
    """Two writers (threads, each with a connection or client of its own, as two processes
    would be) put the same keys at once: each key is written once, by one of them."""
    writers = [backend.open("run-1"), backend.open("run-1")]
    keys = [f"step-{n:04d}" for n in range(30)]
    start = threading.Barrier(len(writers))

    def write_all(n: int) -> list[bool]:
        start.wait()
        return [writers[n].put_once(key, f"writer {n}") for key in keys]

    with ThreadPoolExecutor(len(writers)) as pool:
        first, second = pool.map(write_all, range(len(writers)))

    assert [a + b for a, b in zip(first, second, strict=True)] == [1] * len(keys)
    stored = dict(writers[0].items())
    assert stored == {
        key: f"writer {0 if won else 1}" for key, won in zip(keys, first, strict=True)
    }


# --- bad input -------------------------------------------------------------------------------

BAD_KEYS = [
    pytest.param("", id="empty"),
    pytest.param("k" * (MAX_DATA_KEY_CHARS + 1), id="too-many-characters"),
    pytest.param(FOUR_BYTES * (MAX_DATA_KEY_BYTES // 4 + 1), id="too-many-bytes"),
    pytest.param("bad \ud800 surrogate", id="not-unicode"),
    pytest.param(None, id="none"),
    pytest.param(7, id="a-number"),
    pytest.param(b"bytes", id="bytes"),
]
BAD_VALUES = [
    pytest.param("x" * (MAX_DATA_VALUE_BYTES + 1), id="too-large"),
    pytest.param("é" * (MAX_DATA_VALUE_BYTES // 2) + "x", id="too-large-in-utf8"),
    pytest.param("bad \udfff surrogate", id="not-unicode"),
    pytest.param(None, id="none"),
    pytest.param(7, id="a-number"),
    pytest.param(b"bytes", id="bytes"),
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_bad_key_is_refused_and_nothing_is_written(data, key):
    data.put("kept", "as it was")

    for attempt in (
        lambda: data.put(key, "value"),
        lambda: data.put_once(key, "value"),
        lambda: data.get(key),
        lambda: data.delete(key),
    ):
        with pytest.raises(InvalidInput, match="key"):
            attempt()

    assert data.items() == [("kept", "as it was")]


@pytest.mark.parametrize("value", BAD_VALUES)
def test_a_bad_value_is_refused_and_nothing_is_written(data, value):
    data.put("kept", "as it was")

    with pytest.raises(InvalidInput, match="value"):
        data.put("kept", value)
    with pytest.raises(InvalidInput, match="value"):
        data.put_once("new", value)

    assert data.items() == [("kept", "as it was")]


@pytest.mark.parametrize("prefix", [p for p in BAD_KEYS if p.id != "empty"])
def test_a_bad_prefix_is_refused(data, prefix):
    with pytest.raises(InvalidInput, match="key"):
        data.items(prefix)


# --- SQLite: threads, other processes, old stores --------------------------------------------


def test_sqlite_serves_a_thread_other_than_the_one_that_opened_the_store(tmp_path):
    """The engine runs tools on its agent thread, hooks on the caller's; a timed-out step's
    thread may still write while the next attempt's thread starts."""
    db = SqliteDatabase(tmp_path / "ratchet.db")
    data = SqliteRunData(db, "run-1")
    data.put("opened-here", "main")

    def on_agent_thread(n: int) -> bool:
        data.put(f"thread-{n}", "agent")
        return data.put_once("once", f"thread {n}")

    with ThreadPoolExecutor(4) as pool:
        written = list(pool.map(on_agent_thread, range(4)))

    assert sorted(written) == [False, False, False, True]
    assert [k for k, _ in data.items()] == ["once", "opened-here"] + [
        f"thread-{n}" for n in range(4)
    ]
    db.close()


def test_sqlite_a_store_made_before_run_data_reads_empty_and_gets_the_table_on_write(tmp_path):
    path = tmp_path / "ratchet.db"
    SqliteDatabase(path).close()
    old = sqlite3.connect(path)
    old.execute("DROP TABLE run_data")
    old.close()

    db = SqliteDatabase(path, create=False)  # a read command: it creates no schema
    data = SqliteRunData(db, "run-1")
    assert (data.get("k"), data.items()) == (None, [])
    assert not _has_run_data(path), "a read changed the store"

    assert data.put_once("k", "v") is True
    assert data.items() == [("k", "v")]
    assert _has_run_data(path)
    db.close()
    SqliteDatabase(path, create=False).close()  # and the store still opens as Ratchet's


def _has_run_data(path: Path) -> bool:
    connection = sqlite3.connect(path)
    try:
        found = connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'run_data'"
        ).fetchone()
    finally:
        connection.close()
    return found is not None


def test_sqlite_a_store_locked_by_another_process_is_busy_and_unchanged(tmp_path):
    path = tmp_path / "ratchet.db"
    data = SqliteRunData(SqliteDatabase(path, busy_timeout=0.2), "run-1")
    data.put("k", "before")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(StoreBusy, match="busy"):
            data.put("k", "after")
        with pytest.raises(StoreBusy, match="busy"):
            data.put_once("new", "v")
        assert data.get("k") == "before"  # readers are not blocked (WAL)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert data.items() == [("k", "before")]


def test_sqlite_a_store_that_is_gone_is_unavailable(tmp_path):
    path = tmp_path / "ratchet.db"
    db = SqliteDatabase(path)
    data = SqliteRunData(db, "run-1")
    db.close()
    path.unlink()

    with pytest.raises(StoreUnavailable):
        data.get("k")


# --- DynamoDB: pages and errors --------------------------------------------------------------


class CountingClient:
    """A client that counts its Query calls."""

    def __init__(self, client: DynamoDBClient) -> None:
        self._client = client
        self.queries = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def query(self, **kwargs: Any) -> Any:
        self.queries += 1
        return self._client.query(**kwargs)


def test_dynamodb_items_reads_every_page_past_a_megabyte(dynamodb):
    client = CountingClient(emptied(dynamodb))
    data = DynamoDbRunData(client, SETTINGS.app_table, "run-1")  # type: ignore[arg-type]
    value = "v" * (MAX_DATA_VALUE_BYTES - 100)
    keys = [f"blob/{n:03d}" for n in range(20)]  # 20 x 64 KB: over DynamoDB's 1 MB page
    for key in keys:
        data.put(key, value)
    data.put("other", "not listed")

    listed = data.items("blob/")

    assert [k for k, _ in listed] == keys
    assert all(v == value for _, v in listed)
    assert client.queries >= 2, "the items fit one page: the test does not test pagination"


def test_dynamodb_items_reads_every_page_of_a_small_page_size(dynamodb):
    client = CountingClient(emptied(dynamodb))
    data = DynamoDbRunData(client, SETTINGS.app_table, "run-1", page_size=3)  # type: ignore[arg-type]
    keys = [f"notes/{n:08d}" for n in range(10)]
    for key in reversed(keys):
        data.put(key, key)

    assert data.items("notes/") == [(k, k) for k in keys]
    assert client.queries == 4


def test_dynamodb_keeps_each_run_in_a_partition_of_its_own(dynamodb):
    data = DynamoDbRunData(emptied(dynamodb), SETTINGS.app_table, "run-1")
    data.put("k", "v")

    assert scan(dynamodb, SETTINGS.app_table) == [
        {"pk": {"S": "data#run-1"}, "sk": {"S": "k"}, "value": {"S": "v"}}
    ]


def test_dynamodb_a_missing_table_is_unavailable(dynamodb):
    data = DynamoDbRunData(dynamodb, "no-such-table", "run-1")

    for attempt in (lambda: data.get("k"), lambda: data.put_once("k", "v"), data.items):
        with pytest.raises(StoreUnavailable, match="no-such-table"):
            attempt()


@pytest.mark.parametrize("code", ["ThrottlingException", "ProvisionedThroughputExceededException"])
def test_dynamodb_throttling_is_busy(dynamodb, code):
    data = DynamoDbRunData(dynamodb, SETTINGS.app_table, "run-1")
    throttled = ClientError({"Error": {"Code": code, "Message": "slow down"}}, "PutItem")

    attempts: list[tuple[str, Callable[[], object]]] = [
        ("put_item", lambda: data.put_once("k", "v")),
        ("put_item", lambda: data.put("k", "v")),
        ("get_item", lambda: data.get("k")),
        ("query", data.items),
        ("delete_item", lambda: data.delete("k")),
    ]
    for name, attempt in attempts:
        with (
            mock.patch.object(dynamodb, name, side_effect=throttled),
            pytest.raises(StoreBusy, match="busy"),
        ):
            attempt()
