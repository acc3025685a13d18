"""`ratchet migrate --reencrypt` (issue 37): every sealed record and blob of a local or Postgres
store rewritten under the newest payload key, and those written in clear before the codec sealed,
so that the old key can be removed with every run still readable; stopped part-way, a second run
finishes the job; a row a worker rewrote meanwhile keeps what it wrote; without a codec, one
line. Each test runs on a SQLite store and on a Postgres one (tests/postgres_support.py)."""

from __future__ import annotations

import base64
import json
import re
import sqlite3
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from werkzeug.test import Client as HttpClient

from ratchet.adapters.payload_keys import local_key_id, new_keyring_line
from ratchet.adapters.postgres import reencrypt as postgres_reencryption
from ratchet.adapters.sqlite import reencrypt as reencryption
from ratchet.adapters.sqlite.reencrypt import SEALED_COLUMNS, Reencryption
from ratchet.client import Client
from ratchet.errors import PayloadKeyMissing
from ratchet.runtime import runtime_for
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.services import local_runs_services
from ratchet.sealing import header_of
from ratchet.stored import sealed_key_id
from ratchet.waits import ApprovalNotice, Invitation
from ratchet.web.dashboard import local_app
from ratchet.web.serve import wsgi_app
from tests.integration.test_sealed_payloads import AGENT, SECRET, _state, _work
from tests.postgres_support import Cluster, shared_keyring
from tests.processes import RATCHET, checkout_env
from tests.support import LOG

ENVELOPE = re.compile(rb'"sealed" ?: ?"([A-Za-z0-9+/=]+)"')


@dataclass
class Store:
    """A store the tests reencrypt, and what they read of it as stored, whatever its kind."""

    url: str
    key: str
    """Its `RATCHET_PAYLOAD_KEY`: `local` on SQLite, a keyring file every host would be given
    (`file:PATH`) on Postgres, which refuses `local`."""
    ring: Path
    """The keyring `key` names, newest key first."""
    module: ModuleType
    """The store's reencryption (whose `PAGE_ROWS` a test makes small)."""
    texts: Callable[[Any], list[str]]
    """Every sealed text (or one to seal) of every table, of an open runtime."""
    blobs: Callable[[], list[bytes]]
    stored_bytes: Callable[[], dict[str, bytes]]
    """Every byte the store holds (files or rows), by where it is."""
    values: Callable[[], list[bytes]]
    """Every value of every row of every table as it reads now (not a page a write left
    behind in a file), as its bytes."""
    reencrypt: Callable[[Any], Reencryption]
    """The store's reencryption called as `ratchet migrate --reencrypt` calls it."""
    heads: Callable[[Any], dict[str, str]]
    """Each run's head as stored, by run id."""

    @property
    def sealed(self) -> LocalSettings:
        return LocalSettings(store=self.url, payload_key=self.key)

    def open(self, settings: LocalSettings | None = None) -> Any:
        runtime = runtime_for(settings or self.sealed, create=True)
        assert isinstance(runtime, LocalRuntime)
        return runtime

    def cli(self, *args: str, sealed: bool = True) -> subprocess.CompletedProcess[str]:
        env = checkout_env(**({"RATCHET_PAYLOAD_KEY": self.key} if sealed else {}))
        return subprocess.run(
            [*RATCHET, "--store", self.url, *args],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=120,
        )

    def keyring_ids(self) -> list[str]:
        return [local_key_id(bytes.fromhex(line)) for line in self.ring.read_text().split()]

    def texts_by_key(self, runtime: Any) -> dict[str | None, int]:
        """How many of the store's texts each key seals (None: in clear)."""
        found: dict[str | None, int] = {}
        for text in self.texts(runtime):
            key_id = sealed_key_id(text)
            found[key_id] = found.get(key_id, 0) + 1
        return found

    def keys_anywhere(self) -> set[str]:
        """The key of every envelope in any value of any table (whole or inside a record) and
        of every blob: what a reader still needs, found without the list of sealed columns."""
        found = set(filter(None, self.blob_keys()))
        for value in self.values():
            for sealed in ENVELOPE.findall(value):
                found.add(header_of(base64.b64decode(sealed))[0])
        return found

    def blob_keys(self) -> list[str | None]:
        return [
            header_of(data)[0] if data.startswith(b"RTS\x01") else None for data in self.blobs()
        ]


def _sqlite(tmp_path: Path) -> Store:
    store = tmp_path / "ratchet.db"
    beside = tmp_path / store.stem

    def texts(runtime: Any) -> list[str]:
        found = []
        for column in SEALED_COLUMNS:
            if not runtime.db.has_table(column.table):
                continue
            where = f" WHERE {column.where}" if column.where else ""
            found += [
                text
                for (text,) in runtime.db.connection.execute(
                    f"SELECT {column.column} FROM {column.table}{where}"
                ).fetchall()
                if text is not None
            ]
        return found

    def blobs() -> list[bytes]:
        return [path.read_bytes() for path in sorted(Path(f"{beside}.blobs").glob("*/*"))]

    def stored_bytes() -> dict[str, bytes]:
        """Every file of the store: the database, its WAL, the blobs."""
        files = [store, Path(f"{store}-wal"), *sorted(Path(f"{beside}.blobs").rglob("*"))]
        return {str(f.relative_to(tmp_path)): f.read_bytes() for f in files if f.is_file()}

    def values() -> list[bytes]:
        connection = sqlite3.connect(store)
        try:
            tables = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            return [
                value if isinstance(value, bytes) else str(value).encode()
                for (table,) in tables.fetchall()
                for row in connection.execute(f"SELECT * FROM {table}").fetchall()
                for value in row
            ]
        finally:
            connection.close()

    def reencrypt(runtime: Any) -> Reencryption:
        return reencryption.reencrypt(runtime.db, Path(f"{runtime.root}.blobs"), runtime.codec)

    def heads(runtime: Any) -> dict[str, str]:
        return dict(runtime.db.connection.execute("SELECT run_id, state FROM runs").fetchall())

    return Store(
        f"sqlite:///{store}",
        "local",
        Path(f"{beside}.payload-keys"),
        reencryption,
        texts,
        blobs,
        stored_bytes,
        values,
        reencrypt,
        heads,
    )


def _postgres(url: str, folder: Path) -> Store:
    from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl

    parsed = PostgresUrl.parse(url)

    def texts(runtime: Any) -> list[str]:
        found = []
        with runtime.pg.read() as tx:
            for table in postgres_reencryption.SEALED_TABLES:
                for name in table.columns:
                    column = table.local(name)
                    where = f" AND {column.where}" if column.where else ""
                    found += [
                        bytes(text).decode() if table.utf8_bytes else text
                        for (text,) in tx.execute(
                            f"SELECT {name} FROM {table.table} WHERE {name} IS NOT NULL{where}"
                        ).fetchall()
                    ]
        return found

    def rows(sql: str) -> list[Any]:
        db = PostgresDatabase(parsed, create=False)
        try:
            with db.read() as tx:
                return tx.execute(sql.encode()).fetchall()
        finally:
            db.close()

    def blobs() -> list[bytes]:
        return [bytes(data) for (data,) in rows("SELECT data FROM blobs ORDER BY address")]

    def values() -> list[bytes]:
        tables = rows(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() ORDER BY table_name"
        )
        return [
            bytes(value) if isinstance(value, bytes | memoryview) else str(value).encode()
            for (table,) in tables
            for row in rows(f"SELECT * FROM {table}")
            for value in row
        ]

    def stored_bytes() -> dict[str, bytes]:
        """Every value of every row of every table (Postgres's files are not read: a page a
        write left behind is not a row, and a cluster's files are its owner's)."""
        return {str(n): value for n, value in enumerate(values())}

    def reencrypt(runtime: Any) -> Reencryption:
        return postgres_reencryption.reencrypt(runtime.pg, runtime.codec)

    def heads(runtime: Any) -> dict[str, str]:
        with runtime.pg.read() as tx:
            return dict(tx.execute("SELECT run_id, state FROM runs").fetchall())

    key = shared_keyring(folder)
    return Store(
        url,
        key,
        Path(key.removeprefix("file:")),
        postgres_reencryption,
        texts,
        blobs,
        stored_bytes,
        values,
        reencrypt,
        heads,
    )


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if request.param == "sqlite":
        yield _sqlite(tmp_path)
        return
    # A Postgres store's outbox and runs' folders are in the working directory's .ratchet:
    # the test's, for every process it starts.
    monkeypatch.chdir(tmp_path)
    postgres: Cluster = request.getfixturevalue("postgres")
    name = postgres.fresh_database()
    yield _postgres(postgres.url(name), tmp_path)
    postgres.drop_database(name)


def test_after_reencrypt_the_old_key_can_go_and_every_run_still_reads(store: Store):

    # Given a run and a schedule written in clear before the codec was turned on,
    plain = store.open(LocalSettings(store=store.url))
    try:
        assert plain.engine(worker_id="w1", logger=LOG).start(_state("c1"))
        _work(plain, "c1")
    finally:
        plain.close()
    scheduled = store.cli(
        *("schedule", "add", "nightly", "--agent", AGENT, "--every", "1h"),
        *("--input", json.dumps({"customer": SECRET})), sealed=False,
    )  # fmt: skip
    assert scheduled.returncode == 0, scheduled.stderr
    # a run started under key A, rotated to key B and worked to its end, and a fork of it
    first = store.open()
    try:
        assert first.engine(worker_id="w1", logger=LOG).start(_state("r1"))
        _work(first, "r1", steps=2)  # its blob too
    finally:
        first.close()
    (key_a,) = store.keyring_ids()
    ring = store.ring
    ring.write_text(f"{new_keyring_line()}\n{ring.read_text()}")
    key_b = store.keyring_ids()[0]
    second = store.open()
    try:
        _work(second, "r1")
        Client(second).fork("r1", from_step=1, run_id="r1-fork")
        before = store.texts_by_key(second)
    finally:
        second.close()
    print(f"\ntexts before: {before}; blobs before: {store.blob_keys()}")
    assert min(before[None], before[key_a], before[key_b]) > 0
    assert store.keys_anywhere() == {key_a, key_b}
    assert sorted(store.blob_keys(), key=str) == sorted([None, key_a], key=str)

    # ...while key A is still needed: without it, one error naming it
    both = ring.read_text()
    ring.write_text(f"{both.split()[0]}\n")
    refused = store.cli("history", "r1")
    assert refused.returncode != 0
    assert refused.stderr.count("\n") == 1
    assert key_a in refused.stderr
    ring.write_text(both)

    # When the store is reencrypted (after a dry run; twice: the second finds nothing to do)
    dry = store.cli("migrate", "--reencrypt", "--dry-run")
    done = store.cli("migrate", "--reencrypt")
    again = store.cli("migrate", "--reencrypt", "--json")

    # Then it says how many records and blobs it rewrote, under B,
    print(done.stdout)
    assert done.returncode == 0, done.stderr
    rewritten = sum(before.values()) - before[key_b]
    assert done.stdout.splitlines()[0] == (
        f"rewrote {rewritten} records and {len(store.blob_keys())} blobs under key {key_b}"
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[0] == (
        f"would rewrite {rewritten} records and {len(store.blob_keys())} blobs under key "
        f"{key_b} (dry run: nothing changed)"
    )
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert (report["records"], report["blobs"], report["key_id"]) == (0, 0, key_b)
    assert report["current"] == sum(before.values())
    # every text and blob is sealed under B (and no envelope in any table under another key),
    # and the run written in clear is in no stored byte,
    assert set(store.blob_keys()) == {key_b}
    assert store.keys_anywhere() == {key_b}
    for name, data in store.stored_bytes().items():
        assert SECRET.encode() not in data, name

    # and with A removed, every run reads: status, history, the client, replay, fork, dashboard
    ring.write_text(f"{both.split()[0]}\n")
    for command in (
        ["schedule", "list", "--json"],
        *(["status", run_id, "--json"] for run_id in ("c1", "r1", "r1-fork")),
        *(["history", run_id, "--json"] for run_id in ("c1", "r1")),
    ):
        shown = store.cli(*command)
        assert shown.returncode == 0, shown.stderr
        assert SECRET in shown.stdout, command
    runtime = store.open()
    try:
        assert store.texts_by_key(runtime) == {key_b: sum(before.values())}
        client = Client(runtime)
        for run_id in ("c1", "r1"):
            assert client.head(run_id).summary == f"exported the orders of {SECRET}"
            assert SECRET in client.replay(run_id, step=1)
            (blob,) = [r.blob for r in client.head(run_id).tool_results if r.blob is not None]
            assert f"order 199 for {SECRET}".encode() in runtime.blobs.get(blob)
        client.fork("c1", from_step=2, run_id="c1-fork")
        _work(runtime, "c1-fork")
        assert client.head("c1-fork").summary == f"exported the orders of {SECRET}"
        runs = local_runs_services(runtime, worker_id="serve:test", logger=LOG)
        desk = runtime.approval_desk(worker_id="serve:test", logger=LOG)
        http = HttpClient(wsgi_app([("/dashboard", local_app(runs.client, desk, operator="d"))]))
        for run_id in ("c1", "r1"):
            page = http.get(f"/dashboard/runs/{run_id}")
            assert page.status_code == 200
            assert SECRET in page.get_data(as_text=True)
    finally:
        runtime.close()


def test_reencrypt_stopped_part_way_is_finished_by_a_second_run(
    store: Store, monkeypatch: pytest.MonkeyPatch
):
    ring = store.ring
    # Given three runs under key A (sharing one blob), and a fourth (last in the order they are
    # read) under key C
    runtime = store.open()
    try:
        for run_id in ("r1", "r2", "r3"):
            assert runtime.engine(worker_id="w1", logger=LOG).start(_state(run_id))
            _work(runtime, run_id)
    finally:
        runtime.close()
    key_a_line = ring.read_text().split()[0]
    key_c_line = new_keyring_line()
    ring.write_text(f"{key_c_line}\n")
    runtime = store.open()
    try:
        assert runtime.engine(worker_id="w1", logger=LOG).start(_state("z1"))
        _work(runtime, "z1")
    finally:
        runtime.close()
    (key_c,) = store.keyring_ids()

    # When it is reencrypted under a new key B, two heads a transaction, without C:
    ring.write_text(f"{new_keyring_line()}\n{key_a_line}\n")
    key_b = store.keyring_ids()[0]
    monkeypatch.setattr(store.module, "PAGE_ROWS", 2)
    runtime = store.open()
    try:
        assert runtime.codec is not None
        with pytest.raises(PayloadKeyMissing) as stopped:
            store.reencrypt(runtime)
        assert stopped.value.key_id == key_c
        # Then it stopped at z1's head, the second page: the first page's heads are under B
        heads = store.heads(runtime)
        assert {run: sealed_key_id(text) for run, text in heads.items()} == {
            "r1": key_b,
            "r2": key_b,
            "r3": store.keyring_ids()[1],
            "z1": key_c,
        }
    finally:
        runtime.close()

    # And a second run, with C back, rewrites the rest and leaves the first page as it is
    ring.write_text(f"{ring.read_text()}{key_c_line}\n")
    runtime = store.open()
    try:
        assert runtime.codec is not None
        total = sum(store.texts_by_key(runtime).values())
        report = store.reencrypt(runtime)
        print(f"\nsecond run: {report.to_json()}")
        assert report.key_id == key_b
        assert report.current == 2
        assert report.records == total - 2
        assert (report.blobs, report.moved, report.unreadable) == (2, 0, [])
        assert store.texts_by_key(runtime) == {key_b: total}
    finally:
        runtime.close()
    ring.write_text(f"{ring.read_text().split()[0]}\n")  # B alone
    for run_id in ("r1", "r2", "r3", "z1"):
        shown = store.cli("history", run_id, "--json")
        assert shown.returncode == 0, shown.stderr
        assert SECRET in shown.stdout


def test_a_row_a_worker_rewrote_after_it_was_read_keeps_what_the_worker_wrote(
    store: Store, monkeypatch: pytest.MonkeyPatch
):
    # Given a run and a value of its data under key A, and B put first in the keyring
    runtime = store.open()
    try:
        assert runtime.engine(worker_id="w1", logger=LOG).start(_state("r1"))
        runtime.context("r1", _state("r1").options).data.put("customer", SECRET)
    finally:
        runtime.close()
    store.ring.write_text(f"{new_keyring_line()}\n{store.ring.read_text()}")
    key_b = store.keyring_ids()[0]

    # and a worker (another process's runtime) that puts a new value, under B, after the
    # reencryption read the row and before it writes it
    real = store.module.resealed_text
    wrote: list[str] = []

    def resealed_then_written(column: Any, *rest: Any) -> Any:
        if column.table == "run_data" and not wrote:
            worker = store.open()
            try:
                worker.context("r1", _state("r1").options).data.put("customer", "meanwhile")
            finally:
                worker.close()
            wrote.append(column.table)
        return real(column, *rest)

    monkeypatch.setattr(store.module, "resealed_text", resealed_then_written)

    # When the store is reencrypted
    runtime = store.open()
    try:
        report = store.reencrypt(runtime)
        print(f"\nfirst run: {report.to_json()}")

        # Then the write conditional on the value read changed nothing and is counted, and the
        # row holds what the worker wrote
        assert wrote == ["run_data"]
        assert report.moved == 1
        assert "run_data" not in report.resealed
        assert runtime.context("r1", _state("r1").options).data.get("customer") == "meanwhile"
        # and every other text is under B, so a second run rewrites nothing
        monkeypatch.undo()
        again = store.reencrypt(runtime)
        print(f"second run: {again.to_json()}")
        assert (again.records, again.moved, again.blobs) == (0, 0, 0)
        assert set(store.texts_by_key(runtime)) == {key_b}
    finally:
        runtime.close()


def test_an_outbox_message_under_the_old_key_is_rewritten_and_reads_without_it(store: Store):
    # Given an approval's email in the outbox (on this host's disk), sealed under key A
    notice = ApprovalNotice(
        approval_id="a1b2c3d4e5",
        run_id="r1",
        step=2,
        agent=AGENT,
        goal=f"export the orders of {SECRET}",
        prompt=f"Export the orders of {SECRET}?",
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
        emails=[Invitation(recipient="dana@example.com", url="https://example.com/a/1")],
    )
    runtime = store.open()
    try:
        runtime.outbox.send(notice)
    finally:
        runtime.close()
    (key_a,) = store.keyring_ids()
    store.ring.write_text(f"{new_keyring_line()}\n{store.ring.read_text()}")

    # When the store is reencrypted (after a dry run)
    dry = store.cli("migrate", "--reencrypt", "--dry-run")
    done = store.cli("migrate", "--reencrypt", "--json")

    # Then the dry run counts the one message in the singular,
    assert dry.returncode == 0, dry.stderr
    assert "  outbox: 1 message sealed with an older key" in dry.stdout.splitlines(), dry.stdout
    # and the message is rewritten under B, and reads with A gone from the keyring
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    print(f"\n{report}")
    assert report["outbox_resealed"] == 1
    store.ring.write_text(f"{store.ring.read_text().split()[0]}\n")
    runtime = store.open()
    try:
        (message,) = runtime.outbox.messages()
        (path,) = runtime.outbox.folder.glob("*.json")
        text = path.read_text()
    finally:
        runtime.close()
    assert message["to"] == "dana@example.com"
    assert SECRET in message["subject"]
    assert sealed_key_id(text) == store.keyring_ids()[0] != key_a


def test_reencrypt_without_a_payload_key_is_one_line(store: Store):
    ran = store.cli("run", "--agent", "tests.fixtures.sealed_agent:agent", "--run-id", "p1")
    assert ran.returncode == 0, ran.stderr

    refused = store.cli("migrate", "--reencrypt", sealed=False)

    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.count("\n") == 1
    assert "RATCHET_PAYLOAD_KEY" in refused.stderr
