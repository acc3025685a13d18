"""A local store is its owner's only (issue 37): what runs' tools saw and did is in the store, its
WAL, its blobs and its runs' folders, which Ratchet makes owner-only (0600 files, 0700 folders)
whatever the umask; a store made earlier with wider modes is kept as it is, with one warning
line per process that opens it to write."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet.adapters.call_locks import FileCallLocks
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.postgres import PostgresRuntime
from tests.postgres_support import Cluster
from tests.processes import RATCHET, Cli, checkout_env

WARNING = "may be read by other users"


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The usual umask (022), under which a file is made readable by everyone unless asked."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


def test_a_new_store_its_wal_blobs_and_folders_are_owner_only(tmp_path, open_umask):
    store = tmp_path / "made" / "ratchet.db"
    # A run that parks for a person: its store, its data folder and the email in the outbox.
    made = subprocess.run(
        [
            *RATCHET,
            "--store",
            f"sqlite:///{store}",
            "run",
            "--scenario",
            "migration",
            "--batches",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{store}"))
    try:
        runtime.db.connection.execute("SELECT count(*) FROM runs").fetchone()
        ref = runtime.blobs.put(b"what a tool saw")
        blobs = Path(f"{runtime.root}.blobs")
        modes = {
            "folder made for the store": _mode(store.parent),
            "store": _mode(store),
            # While the store is open, SQLite keeps its WAL and its SHM beside it.
            "wal": _mode(Path(f"{store}-wal")),
            "shm": _mode(Path(f"{store}-shm")),
            "blobs": _mode(blobs),
            "blob shard": _mode(blobs / ref.sha256[:2]),
            "blob": _mode(blobs / ref.sha256[:2] / ref.sha256),
            "runs' data": _mode(Path(f"{runtime.root}.data")),
            "outbox": _mode(Path(f"{runtime.root}.outbox")),
        }
        emails = list(Path(f"{runtime.root}.outbox").glob("*.json"))
    finally:
        runtime.close()
    assert emails, "the run asked its person by email"
    files = {"store", "wal", "shm", "blob"}
    assert modes == {k: "0o600" if k in files else "0o700" for k in modes}


def test_the_folders_a_postgres_store_keeps_on_a_host_are_owner_only(
    tmp_path, open_umask, postgres: Cluster, monkeypatch
):
    # Given a host (a working directory) with no `.ratchet` yet, on a Postgres store
    name = postgres.fresh_database()
    store = postgres.url(name)
    monkeypatch.chdir(tmp_path)
    try:
        # When a run parks for a person there (its data folder, its email in the outbox)
        made = subprocess.run(
            [*RATCHET, "--store", store, "run", "--scenario", "migration", "--batches", "1"],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp_path,
            env=checkout_env(),
        )
        assert made.returncode == 0, made.stderr
        # And a `ratchet serve` says where it listens
        runtime = PostgresRuntime.open(LocalSettings(store=store), create=False)
        try:
            with runtime.serving("http://127.0.0.1:8787"):
                served = runtime.serve_file.exists()
            host = tmp_path / runtime.root.parent
        finally:
            runtime.close()
    finally:
        postgres.drop_database(name)

    # Then every folder Ratchet made on the host is its owner's, from `.ratchet` down, and
    # serve's address is read only through them, as a local store's is
    assert served, "serve wrote where it listens"
    folders = [
        tmp_path / ".ratchet",
        tmp_path / ".ratchet" / "postgres",
        host,
        host / "ratchet.data",
        host / "ratchet.outbox",
    ]
    assert {str(f.relative_to(tmp_path)): _mode(f) for f in folders} == {
        str(f.relative_to(tmp_path)): "0o700" for f in folders
    }


def test_a_serve_token_made_first_on_a_postgres_host_is_in_owner_only_folders(
    tmp_path, open_umask, postgres: Cluster, monkeypatch
):
    # Given a host with no `.ratchet` yet, where a `ratchet serve` bound beyond this machine
    # makes its token before anything else
    name = postgres.fresh_database()
    monkeypatch.chdir(tmp_path)
    runtime = PostgresRuntime.open(LocalSettings(store=postgres.url(name)))
    try:
        runtime.serve_token()
        token, host = tmp_path / runtime.serve_token_file, tmp_path / runtime.root.parent
    finally:
        runtime.close()
        postgres.drop_database(name)

    # Then the token is owner-only, and so is every folder made for it
    folders = [tmp_path / ".ratchet", tmp_path / ".ratchet" / "postgres", host]
    assert [_mode(f) for f in folders] == ["0o700"] * 3
    assert _mode(token) == "0o600"


def test_a_call_lock_taken_first_on_a_host_makes_its_folders_owner_only(tmp_path, open_umask):
    # A Postgres host's call locks (`<host folder>/ratchet.calls`), the first thing made there
    host = tmp_path / ".ratchet" / "postgres" / "db_host_store"
    held = FileCallLocks(host / "ratchet.calls").hold("charge-1")
    assert held is not None
    held.release()
    folders = [tmp_path / ".ratchet", tmp_path / ".ratchet" / "postgres", host]
    assert [_mode(f) for f in [*folders, host / "ratchet.calls"]] == ["0o700"] * 4


def test_a_store_in_a_folder_of_the_users_leaves_the_folder_as_it_is(tmp_path, open_umask):
    tmp_path.chmod(0o755)
    LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/runs.db")).close()
    assert _mode(tmp_path) == "0o755"
    assert _mode(tmp_path / "runs.db") == "0o600"


def test_a_store_others_may_read_is_warned_about_once_and_left_as_it_is(tmp_path):
    cli = Cli(tmp_path)
    cli.ok("start", "--scenario", "migration", "--batches", "1", "--run-id", "w1")
    store = tmp_path / "ratchet.db"
    store.chmod(0o644)

    started = subprocess.run(
        cli.argv("start", "--scenario", "migration", "--batches", "1", "--run-id", "w2"),
        capture_output=True,
        text=True,
        check=True,
    )
    warned = [line for line in started.stderr.splitlines() if WARNING in line]
    assert warned == [
        f"warning: {store} may be read by other users (mode 644): "
        f"chmod 600 {store} {store}-wal {store}-shm makes it private"
    ], started.stderr
    assert _mode(store) == "0o644", "a store's mode is its owner's to change"

    store.chmod(0o600)
    quiet = subprocess.run(
        cli.argv("start", "--scenario", "migration", "--batches", "1", "--run-id", "w3"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert WARNING not in quiet.stderr
