"""A throwaway Postgres cluster for the tests and benches, with no Docker: Debian's server
binaries (`make test` installs the `postgresql` package), a cluster made by `initdb` in a
temporary folder, reached through a unix socket in that folder only (no TCP port to race other
test processes for), stopped and removed when the process ends.

`initdb` refuses to run as root, and CI runs as root: there the cluster belongs to the
`postgres` system user the package makes (`runuser`), and its folder is given to that user.

One cluster per test process (`cluster()`, started on first use); each test takes a database
of its own (`Cluster.fresh_database`), made empty and dropped after, so tests share nothing.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ratchet.adapters.postgres.database import PostgresDatabase

SERVER_PACKAGE = "postgresql"
START_SECONDS = 60
"""How long `pg_ctl` may take to start the cluster: seconds on an idle machine, but CI shares
its cores with the other test processes."""


def server_binaries() -> Path | None:
    """The folder of `initdb` and `pg_ctl`: the one on PATH, else the newest Debian's
    `/usr/lib/postgresql/<major>/bin` (Debian puts only its wrappers on PATH)."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(os.path.realpath(on_path)).parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(Path(path).parent.parent.name),
    )
    return Path(found[-1]).parent if found else None


def _as_owner(owner: str | None) -> list[str]:
    """What runs a command as the cluster's owner: itself, or (as root) `runuser`."""
    return ["runuser", "-u", owner, "--"] if owner else []


@dataclass
class Cluster:
    folder: Path
    binaries: Path
    owner: str | None
    started_in_seconds: float
    settings: str = ""
    """The server's options (`pg_ctl start -o`), for a start after a stop."""
    _names: count[int] = field(default_factory=count)
    _template: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def socket_folder(self) -> Path:
        return self.folder / "socket"

    def url(self, database: str = "postgres") -> str:
        """A `postgresql://` store URL of a database in this cluster, through its socket."""
        return f"postgresql://postgres@/{database}?host={self.socket_folder}"

    def admin(self, sql: str) -> None:
        """Run one statement on the cluster's `postgres` database (outside a transaction, as
        CREATE and DROP DATABASE must be)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(sql.encode())  # the tests' own statements

    def fresh_database(self, *, store: bool = False) -> str:
        """A database no other test uses, empty or (with `store`) a Ratchet store already:
        its name."""
        with self._lock:
            name = f"test_{os.getpid()}_{next(self._names)}"
            template = self._store_template() if store else "template1"
        # FILE_COPY: a copy of the (tiny) template's files, about 20 ms, where the default
        # strategy writes it through the WAL, about 100 ms.
        self.admin(f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY")
        return name

    def _store_template(self) -> str:
        """A database made a store once, copied for each test that wants one: a copy costs
        less than making the store's tables and indexes anew (tests/integration's
        test_postgres_store.py makes them from empty). Kept without connections, which a
        database copied must have."""
        from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl

        if self._template is None:
            name = f"store_template_{os.getpid()}"
            self.admin(f"CREATE DATABASE {name} STRATEGY FILE_COPY")
            PostgresDatabase(PostgresUrl.parse(self.url(name))).close()
            self._template = name
        return self._template

    def drop_database(self, name: str) -> None:
        # FORCE: a connection a test left open (a pool's, in a thread that raised) does not
        # keep the database, nor hold up the next test.
        self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def restart(self) -> None:
        """Stop the server (`fast`: every session cut, what committed kept; an `immediate`
        stop would lose recent commits to this cluster's fsync and synchronous_commit off) and
        start it again with the options it had, as an operator's restart under load does."""
        subprocess.run(
            [
                *_as_owner(self.owner),
                str(self.binaries / "pg_ctl"),
                "restart",
                "-m",
                "fast",
                "-w",
                "-t",
                str(START_SECONDS),
                "-D",
                str(self.folder / "data"),
                "-l",
                str(self.folder / "server.log"),
            ],
            capture_output=True,
            check=True,
            timeout=START_SECONDS + 10,
        )

    def stop_server(self) -> None:
        """Stop the server (`fast`: every session cut, what committed kept), as a database
        that goes away under load does; `start_server` brings it back."""
        self._pg_ctl("stop", "-m", "fast", "-w", "-t", str(START_SECONDS))

    def start_server(self) -> None:
        self._pg_ctl(
            "start",
            "-w",
            "-t",
            str(START_SECONDS),
            "-l",
            str(self.folder / "server.log"),
            "-o",
            self.settings,
        )

    def _pg_ctl(self, *arguments: str) -> None:
        subprocess.run(
            [
                *_as_owner(self.owner),
                str(self.binaries / "pg_ctl"),
                *arguments,
                "-D",
                str(self.folder / "data"),
            ],
            capture_output=True,
            check=True,
            timeout=START_SECONDS + 10,
        )

    def stop(self) -> None:
        subprocess.run(
            [
                *_as_owner(self.owner),
                str(self.binaries / "pg_ctl"),
                "stop",
                "-m",
                "immediate",
                "-D",
                str(self.folder / "data"),
            ],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self.folder, ignore_errors=True)


def start_cluster() -> Cluster:
    """A new cluster in a temporary folder, started; `pytest.skip` if this machine has no
    Postgres server binaries (CI always has them: `make test` installs them first)."""
    binaries = server_binaries()
    if binaries is None:
        pytest.skip(
            f"no Postgres server here (initdb, pg_ctl): 'make test' installs Debian's "
            f"{SERVER_PACKAGE} package, or run 'apt-get install {SERVER_PACKAGE}' as root"
        )
    owner = "postgres" if os.getuid() == 0 else None
    started = time.perf_counter()
    # Not under pytest's own temporary folders: those are private to the user running the
    # tests, and the cluster's owner must reach its folder.
    folder = Path(tempfile.mkdtemp(prefix="ratchet-pg-"))
    (folder / "socket").mkdir()
    if owner:
        entry = pwd.getpwnam(owner)
        for path in (folder, folder / "socket"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    data = folder / "data"
    run = [*_as_owner(owner)]
    try:
        subprocess.run(
            [
                *run,
                str(binaries / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
            capture_output=True,
            check=True,
            timeout=START_SECONDS,
        )
        # fsync off: a throwaway cluster that a crash of the machine may lose. Sockets in the
        # folder only: no TCP port, so test processes never race each other for one.
        settings = (
            f"-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            f"-c listen_addresses='' -c unix_socket_directories='{folder / 'socket'}' "
            f"-c max_connections=200"
        )
        subprocess.run(
            [
                *run,
                str(binaries / "pg_ctl"),
                "start",
                "-D",
                str(data),
                "-w",
                "-t",
                str(START_SECONDS),
                "-l",
                str(folder / "server.log"),
                "-o",
                settings,
            ],
            capture_output=True,
            check=True,
            timeout=START_SECONDS + 10,
        )
    except subprocess.CalledProcessError as error:
        # The folder stays, with the server's log, for whoever reads why.
        raise RuntimeError(
            f"the test Postgres cluster in {folder} did not start "
            f"({Path(error.cmd[len(run)]).name}): "
            f"{error.stderr.decode(errors='replace').strip()}"
        ) from None
    return Cluster(folder, binaries, owner, time.perf_counter() - started, settings)


_cluster: Cluster | None = None
_cluster_lock = threading.Lock()


def cluster() -> Cluster:
    """This process's cluster, started on first use and stopped when the process exits."""
    global _cluster
    with _cluster_lock:
        if _cluster is None:
            _cluster = start_cluster()
            atexit.register(_cluster.stop)
        return _cluster


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    """A cluster of its own, for a test that stops and starts its server: the process's
    shared one (`cluster()`) serves other tests' databases meanwhile. Removed after."""
    own = start_cluster()
    try:
        yield own
    finally:
        own.stop()


@contextmanager
def scratch_store() -> Iterator[Callable[[], PostgresDatabase]]:
    """A database of its own in this process's cluster, as a store: the function given opens
    it, each time with a pool of its own (as another process would); every one opened is
    closed, and the database dropped, after."""
    from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl

    postgres = cluster()
    name = postgres.fresh_database(store=True)
    url = PostgresUrl.parse(postgres.url(name))
    opened: list[PostgresDatabase] = []

    def open_store() -> PostgresDatabase:
        db = PostgresDatabase(url)
        opened.append(db)
        return db

    try:
        yield open_store
    finally:
        for db in opened:
            db.close()
        postgres.drop_database(name)


def shared_keyring(folder: Path) -> str:
    """A `RATCHET_PAYLOAD_KEY` for a Postgres store: a keyring file of one new key, owner-only,
    in `folder` (`file:PATH`), as every host of a shared store would be given one (`local`,
    a keyring each host makes for itself, is refused there)."""
    from ratchet.adapters.payload_keys import new_keyring_line

    ring = folder / "payload-keys"
    ring.write_text(f"{new_keyring_line()}\n")
    ring.chmod(0o600)  # a keyring others may read is refused
    return f"file:{ring}"
