"""With a payload key, a Postgres store's signing keys (the approval links' and the hooks') are
sealed in its database, each bound to its name: whoever reads the database learns neither, a
key moved to the other's row is refused, and of two processes making a key at once, each ends
up with the one written first. tests/e2e/test_postgres_sealed_keys.py holds the claims about
processes (another host, another payload key, `migrate --reencrypt`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ratchet.adapters.payload_keys import new_keyring_line
from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl
from ratchet.adapters.postgres.keys import APPROVAL_LINKS, HOOKS, PostgresKeys, sealed_key
from ratchet.adapters.postgres.reencrypt import reencrypt
from ratchet.errors import PayloadTampered
from ratchet.runtime.local import LocalSettings
from ratchet.runtime.postgres import PostgresRuntime
from ratchet.sealing import header_of, is_sealed
from tests.integration.test_postgres_shared_keys import PATIENCE, _waits_on_a_lock
from tests.postgres_support import Cluster, shared_keyring


@pytest.fixture
def store(postgres: Cluster) -> Iterator[str]:
    """A Ratchet store of the test's own: its URL."""
    name = postgres.fresh_database(store=True)
    yield postgres.url(name)
    postgres.drop_database(name)


def _runtime(url: str, payload_key: str) -> PostgresRuntime:
    return PostgresRuntime.open(LocalSettings(store=url, payload_key=payload_key))


def _rows(url: str) -> dict[str, bytes]:
    with psycopg.connect(url) as connection:
        rows = connection.execute("SELECT name, secret FROM signing_keys").fetchall()
    return {str(name): bytes(secret) for name, secret in rows}


def test_on_a_sealed_store_neither_keys_row_holds_its_key_nor_its_hex(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a store with a payload key, whose processes make both keys
    monkeypatch.chdir(tmp_path)
    payload_key = shared_keyring(tmp_path)
    runtime = _runtime(store, payload_key)
    try:
        keys = {APPROVAL_LINKS: runtime.approval_key(), HOOKS: runtime.hook_key()}
    finally:
        runtime.close()

    # When the database is read
    rows = _rows(store)
    print(f"\nkey bytes {[len(k) for k in keys.values()]}, rows {[len(r) for r in rows.values()]}")

    # Then neither row holds its key, in bytes or in hex, nor the other's
    assert set(rows) == set(keys)
    for row in rows.values():
        assert is_sealed(row), row
        for key in keys.values():
            assert key not in row
            assert key.hex().encode() not in row.lower()
    # And another process with the payload key opens the same keys
    again = _runtime(store, payload_key)
    try:
        assert (again.approval_key(), again.hook_key()) == (keys[APPROVAL_LINKS], keys[HOOKS])
    finally:
        again.close()


def test_the_hooks_key_moved_to_the_approval_links_row_is_refused_and_left(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a sealed store whose approval links' row was overwritten with the hooks' row (so
    # that whoever knows a hook's secret derivation could sign links with it)
    monkeypatch.chdir(tmp_path)
    payload_key = shared_keyring(tmp_path)
    runtime = _runtime(store, payload_key)
    try:
        runtime.approval_key()
        runtime.hook_key()
    finally:
        runtime.close()
    with psycopg.connect(store) as connection:
        connection.execute(
            "UPDATE signing_keys SET secret = (SELECT secret FROM signing_keys WHERE name = %s) "
            "WHERE name = %s",
            (HOOKS, APPROVAL_LINKS),
        )
    moved = _rows(store)

    # When a process of the store reads the approval links' key
    reader = _runtime(store, payload_key)
    try:
        with pytest.raises(PayloadTampered) as refused:
            reader.approval_key()
    finally:
        reader.close()

    # Then it is refused in one line naming the key, and the row is left as it is
    print(f"\nrefused: {refused.value}")
    assert "'approval-links' signing key" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert _rows(store) == moved


def test_two_makers_with_a_payload_key_end_up_with_the_first_ones_key(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a process that has written a sealed key and not yet committed it
    monkeypatch.chdir(tmp_path)
    payload_key = shared_keyring(tmp_path)
    runtime = _runtime(store, payload_key)
    first = b"\x01" * 32
    holder = psycopg.connect(store)
    db = PostgresDatabase(PostgresUrl.parse(store))
    try:
        sealed_first = sealed_key(first, runtime.codec, name=APPROVAL_LINKS)
        holder.execute(
            "INSERT INTO signing_keys (name, secret) VALUES (%s, %s)",
            (APPROVAL_LINKS, sealed_first),
        )

        # When another process, with the same payload key, makes the key meanwhile
        got: list[bytes | BaseException] = []

        def make() -> None:
            try:
                keys = PostgresKeys(db, runtime.codec)
                got.append(keys.key(APPROVAL_LINKS, make=lambda: b"\x02" * 32))
            except BaseException as error:  # told to the test's thread below
                got.append(error)

        racer = threading.Thread(target=make)
        racer.start()
        _waits_on_a_lock(store, time.monotonic() + PATIENCE)
        holder.commit()
        racer.join(PATIENCE)

        # Then it has the first one's key, opened, and the store keeps the first one's row
        assert got == [first]
        assert _rows(store) == {APPROVAL_LINKS: sealed_first}
        assert PostgresKeys(db, runtime.codec).key(APPROVAL_LINKS, make=lambda: b"\x03" * 32) == (
            first
        )
    finally:
        holder.close()
        db.close()
        runtime.close()


def test_reencrypt_rewrites_the_keys_under_the_newest_payload_key_and_they_open_without_the_old(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given both keys sealed under payload key A
    monkeypatch.chdir(tmp_path)
    payload_key = shared_keyring(tmp_path)
    ring = Path(payload_key.removeprefix("file:"))
    runtime = _runtime(store, payload_key)
    try:
        keys = (runtime.approval_key(), runtime.hook_key())
    finally:
        runtime.close()
    key_a = ring.read_text()

    # When the keyring's newest key is B, and the store is reencrypted
    ring.write_text(f"{new_keyring_line()}\n{key_a}")
    runtime = _runtime(store, payload_key)
    try:
        assert runtime.codec is not None
        key_b = runtime.codec.key_id
        report = reencrypt(runtime.pg, runtime.codec)
        again = reencrypt(runtime.pg, runtime.codec)
    finally:
        runtime.close()
    print(f"\nfirst: {report.to_json()}\nsecond: {again.to_json()}")

    # Then both keys are under B, counted, and a second run finds them current
    assert report.resealed.get("signing_keys") == 2, report
    assert "signing_keys" not in again.resealed
    assert {name: header_of(row)[0] for name, row in _rows(store).items()} == {
        APPROVAL_LINKS: key_b,
        HOOKS: key_b,
    }
    # And with B alone they open as the same keys
    ring.write_text(ring.read_text().splitlines()[0] + "\n")
    runtime = _runtime(store, payload_key)
    try:
        assert (runtime.approval_key(), runtime.hook_key()) == keys
    finally:
        runtime.close()
