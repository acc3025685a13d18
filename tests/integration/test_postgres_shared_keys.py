"""The keys a Postgres store's hosts sign with are the store's, in its database: a worker in
one folder (a host, with its own `.ratchet/postgres/...` files) and a server in another sign
approval links alike and derive the same hooks; and of processes making the key at once,
every one ends up with the one key that was written first."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import psycopg
import pytest

from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl
from ratchet.adapters.postgres.keys import APPROVAL_LINKS, PostgresKeys
from ratchet.approvals.links import LinkClaims
from ratchet.runtime.local import LocalSettings
from ratchet.runtime.postgres import PostgresRuntime
from ratchet.state import utcnow
from tests.postgres_support import Cluster

PATIENCE = 30.0


@pytest.fixture
def store(postgres: Cluster) -> Iterator[str]:
    """A Ratchet store of the test's own: its URL."""
    name = postgres.fresh_database(store=True)
    yield postgres.url(name)
    postgres.drop_database(name)


def _runtime_in(folder: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> PostgresRuntime:
    """A runtime of the store as a process on a host of its own would open it: its files are
    in its working directory, `folder`."""
    folder.mkdir()
    monkeypatch.chdir(folder)
    return PostgresRuntime.open(LocalSettings(store=url))


def test_a_link_signed_in_one_folder_is_verified_in_another_and_hooks_agree(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker's runtime in one folder, which signs a link and makes a hook first
    worker = _runtime_in(tmp_path / "host-a", store, monkeypatch)
    server = None
    try:
        signer = worker.approval_desk(worker_id="a", logger=None).signer
        claims = LinkClaims("ap-1", "r1", "ada", utcnow().replace(microsecond=0) + timedelta(1))
        link = signer.url("https://a.example", claims)
        hook_id = worker.hook_keys.hook_id("r1", "ci-finished")
        secret = worker.hook_keys.secret(hook_id)

        # When a server's runtime in another folder (another host's files) reads them
        server = _runtime_in(tmp_path / "host-b", store, monkeypatch)
        verifier = server.approval_desk(worker_id="b", logger=None).signer
        query = dict(parse_qsl(urlsplit(link).query))

        # Then it verifies the link with the same key, and derives the same hook and secret
        assert verifier.key_id == signer.key_id
        assert verifier.verify("ap-1", query, now=utcnow()) == claims
        assert server.hook_keys.hook_id("r1", "ci-finished") == hook_id
        assert server.hook_keys.secret(hook_id) == secret
        # And neither host keeps a key file of its own
        assert not list(tmp_path.rglob("*-key")), list(tmp_path.rglob("*-key"))
    finally:
        worker.close()
        if server is not None:
            server.close()


def _waits_on_a_lock(url: str, deadline: float) -> None:
    """Until a session of the database waits on a row lock (the racer's insert)."""
    with psycopg.connect(url, autocommit=True) as watcher:
        while not watcher.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone():
            assert time.monotonic() < deadline, "the racer's insert never waited on the lock"
            time.sleep(0.02)


def test_a_process_making_the_key_while_another_does_gets_the_first_ones(store: str) -> None:
    # Given a process that has written a key and not yet committed it
    first = b"\x01" * 32
    holder = psycopg.connect(store)
    db = PostgresDatabase(PostgresUrl.parse(store))
    try:
        holder.execute(
            "INSERT INTO signing_keys (name, secret) VALUES (%s, %s)", (APPROVAL_LINKS, first)
        )

        # When another process makes the key meanwhile (it finds none yet, and writes its own)
        got: list[bytes | BaseException] = []

        def make() -> None:
            try:
                got.append(PostgresKeys(db).key(APPROVAL_LINKS, make=lambda: b"\x02" * 32))
            except BaseException as error:  # told to the test's thread below
                got.append(error)

        racer = threading.Thread(target=make)
        racer.start()
        _waits_on_a_lock(store, time.monotonic() + PATIENCE)
        holder.commit()
        racer.join(PATIENCE)

        # Then it has the first one's key, and the store keeps that one only
        assert got == [first]
        assert PostgresKeys(db).key(APPROVAL_LINKS, make=lambda: b"\x03" * 32) == first
    finally:
        holder.close()
        db.close()
