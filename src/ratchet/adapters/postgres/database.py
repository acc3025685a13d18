"""One Postgres database of Ratchet's: its URL, its connection pool, its schema, its
transactions, and Ratchet's names for Postgres's failures.

Workers on many machines share one database and nothing else. Every write is one transaction
at READ COMMITTED, Postgres's default: a conditional `UPDATE ... WHERE version = %s` that meets
a row another transaction is changing waits for it, then checks its condition on the row as
that transaction left it, so of two writers from one version exactly one changes it. Where a
write depends on a count rather than on one row (a mailbox's bound), a transaction-scoped
advisory lock on the run orders the writers.

A database is used only if it is a Ratchet store: its schema holds Ratchet's marker table
(`ratchet_store`, with the schema's version), or nothing at all, which then becomes a store in
one transaction, the marker with its tables. A schema holding another application's tables is
refused before anything is written. A store of an older schema version is upgraded, step by
step (`_UPGRADES`), by the first process that opens it to write; one of a newer version is
refused.

Every Postgres adapter works through `PostgresDatabase`, whose transactions raise Ratchet's
errors: nothing above the adapters sees a `psycopg` error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ratchet.errors import (
    InvalidInput,
    StoreBusy,
    StoreMissing,
    StoreUnavailable,
    StoreUnreachable,
)
from ratchet.store_urls import POSTGRES_SCHEMES, shown_url

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

MARKER_TABLE = "ratchet_store"

_SCHEMA = f"""
-- Version 1 of the schema, as the first Postgres stores were made: never changed, since
-- stores made by it exist. A change is an upgrade step (_UPGRADES below).
-- Run ids in byte order (COLLATE "C"), as SQLite and DynamoDB order them, whatever the
-- database's own collation: the runs list pages by them.
CREATE TABLE runs (
    run_id     text COLLATE "C" PRIMARY KEY,
    version    bigint NOT NULL,
    status     text NOT NULL,
    step       integer NOT NULL,
    attempts   integer NOT NULL,
    state      text NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX runs_by_status ON runs (status);
-- The runs list's order (newest change first): Postgres keeps an index up to date in place,
-- where SQLite's page of WAL a step made one too dear for a local store.
CREATE INDEX runs_by_update ON runs (updated_at DESC, run_id DESC);
-- The part of each run's head that no step changes (goal, options), written once: see
-- ratchet.stored.
CREATE TABLE run_static (
    run_id text PRIMARY KEY,
    state  text NOT NULL
);
CREATE TABLE checkpoints (
    run_id     text NOT NULL,
    version    bigint NOT NULL,
    step       integer NOT NULL,
    status     text NOT NULL,
    worker_id  text NOT NULL,
    bytes      integer NOT NULL,
    created_at timestamptz NOT NULL,
    event      text NOT NULL,
    PRIMARY KEY (run_id, version)
);
-- The ledger (ratchet.adapters.postgres.ledger): `decision` is NULL once the step's commit
-- completed the key, whose record holds the decision from then on. `result` is the tool's
-- output as its UTF-8 bytes: a text column cannot hold the character NUL, which a tool's
-- output may (the other columns hold JSON, which writes it as an escape).
CREATE TABLE idempotency (
    key        text PRIMARY KEY,
    run_id     text NOT NULL,
    step       integer NOT NULL,
    status     text NOT NULL,
    args_hash  text NOT NULL,
    decision   text,
    result     bytea,
    created_at timestamptz NOT NULL,
    expires_at timestamptz
);
-- The events sent to runs, once per event id, in order of arrival (seq); a step's commit
-- consumes one in the transaction that records it.
CREATE TABLE mailbox (
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id        text NOT NULL,
    event_id      text NOT NULL,
    name          text NOT NULL,
    consumed_step integer,
    refused       text,
    record        text NOT NULL,
    UNIQUE (run_id, event_id)
);
CREATE INDEX mailbox_pending ON mailbox (run_id, name, seq)
    WHERE consumed_step IS NULL AND refused IS NULL;
-- The book of open waits: one row per waiting run, written by the commit that parks it and
-- removed by the one that settles it.
CREATE TABLE open_waits (
    run_id text PRIMARY KEY,
    step   integer NOT NULL,
    kind   text NOT NULL,
    name   text,
    due_at timestamptz
);
CREATE INDEX open_waits_due ON open_waits (due_at) WHERE due_at IS NOT NULL;
-- ratchet.adapters.postgres.leases: which worker works on which run, and the live workers.
-- Times are the workers' clocks, in seconds since the epoch.
CREATE TABLE leases (
    run_id     text PRIMARY KEY,
    owner      text NOT NULL,
    expires_at double precision NOT NULL
);
CREATE TABLE workers (
    worker_id  text PRIMARY KEY,
    host       text NOT NULL,
    pid        integer NOT NULL,
    token      text NOT NULL,
    expires_at double precision NOT NULL
);
-- ratchet.adapters.postgres.rate counts requests here, a row per name and minute.
CREATE TABLE rate_windows (
    name   text NOT NULL,
    minute bigint NOT NULL,
    count  integer NOT NULL,
    PRIMARY KEY (name, minute)
);
-- ratchet.adapters.postgres.data keeps each run's own key-value data here. Keys and values
-- as their UTF-8 bytes: a text column cannot hold the character NUL, which a run's data may,
-- and bytes sort as Python's str and the other stores' keys do.
CREATE TABLE run_data (
    run_id text NOT NULL,
    key    bytea NOT NULL,
    value  bytea NOT NULL,
    PRIMARY KEY (run_id, key)
);
-- ratchet.adapters.postgres.hooks keeps the webhooks here: the id a delivery's URL carries,
-- and the run and event name it delivers to. No secret: each is derived from the id and key.
CREATE TABLE hooks (
    hook_id text PRIMARY KEY,
    run_id  text NOT NULL,
    name    text NOT NULL,
    record  text NOT NULL
);
-- ratchet.adapters.postgres.schedules keeps the schedules here.
CREATE TABLE schedules (
    name      text PRIMARY KEY,
    next_fire timestamptz NOT NULL,
    paused    boolean NOT NULL,
    record    text NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_fire) WHERE NOT paused;
-- ratchet.adapters.postgres.approvals keeps the approval requests here.
CREATE TABLE approvals (
    approval_id text PRIMARY KEY,
    run_id      text NOT NULL,
    step        integer NOT NULL,
    status      text NOT NULL,
    expires_at  timestamptz NOT NULL,
    record      text NOT NULL
);
CREATE INDEX approvals_by_run ON approvals (run_id, step);
-- ratchet.adapters.postgres.blobs keeps large tool outputs here, by the address the file
-- blobs take (their SHA-256, or keyed hash when sealed): workers on every host read them.
CREATE TABLE blobs (
    address    text PRIMARY KEY,
    data       bytea NOT NULL,
    touched_at timestamptz NOT NULL
);
-- ratchet.adapters.postgres.daily_spend counts an agent's spend on model calls here, a row
-- per agent and day (UTC), in millionths of a US dollar: micros is the spend less the day's
-- raises (raised), so it may go below 0.
CREATE TABLE daily_spend (
    agent  text NOT NULL,
    day    text NOT NULL,
    micros bigint NOT NULL,
    raised bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, day)
);
CREATE TABLE {MARKER_TABLE} (
    schema_version integer NOT NULL,
    made_at        timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {MARKER_TABLE} (schema_version) VALUES (1);
"""

_UPGRADES: dict[int, str] = {
    # 1 -> 2: `ratchet gc` reads the blobs past their grace period by their last use
    # (ratchet.adapters.postgres.housekeeping), not every blob's row.
    1: "CREATE INDEX blobs_by_touch ON blobs (touched_at);",
    # 2 -> 3: the keys every host of the store signs with (ratchet.adapters.postgres.keys),
    # and the webhooks' deliveries (ratchet.adapters.postgres.deliveries).
    2: """
-- ratchet.adapters.postgres.keys keeps the keys every host of the store signs with here:
-- the approval links' key and the hooks' key, each made by the first process that needs it.
CREATE TABLE signing_keys (
    name    text PRIMARY KEY,
    secret  bytea NOT NULL,
    made_at timestamptz NOT NULL DEFAULT now()
);
-- ratchet.adapters.postgres.deliveries keeps the webhooks' deliveries here: where the store's
-- first sender started (push_start), how far each run's changes are owed (push_cursors), and
-- each change owed to a URL with how its sending went. Times are the senders' clocks, in
-- seconds since the epoch; `body` is sealed under the codec when one is set.
CREATE TABLE push_start (
    one        integer PRIMARY KEY CHECK (one = 1),
    started_at double precision NOT NULL
);
CREATE TABLE push_cursors (
    run_id  text PRIMARY KEY,
    version bigint NOT NULL,
    status  text NOT NULL
);
CREATE TABLE deliveries (
    delivery_id   text COLLATE "C" PRIMARY KEY,
    change_id     text NOT NULL,
    run_id        text NOT NULL,
    url           text NOT NULL,
    body          text NOT NULL,
    state         text NOT NULL,
    attempts      integer NOT NULL,
    created_at    double precision NOT NULL,
    next_at       double precision NOT NULL,
    claimed_until double precision NOT NULL,
    answered_at   double precision,
    last_error    text
);
CREATE INDEX deliveries_due ON deliveries (next_at) WHERE state = 'pending';
CREATE INDEX deliveries_by_run ON deliveries (run_id, created_at);
""",
}
"""The steps that bring a store of one schema version to the next, keyed by the version each
upgrades from, in SQL. A new store is made at version 1 and brought up by the same steps, so
every store of one version has the same tables, whichever Ratchet made it. A change to the
schema is one more step here, at the next version."""

SCHEMA_VERSION = 1 + len(_UPGRADES)
"""The version of the tables, kept in the marker: a store made by a newer Ratchet (a higher
version) is refused rather than misread; an older one is upgraded (`PostgresDatabase`)."""

_MAKING_LOCK = 0x52744368_00000001
"""The advisory lock (transaction-scoped) two processes making one new store at once take in
turn: the second finds the store made, and makes nothing."""

WORK_CHANNEL = "ratchet_work"
"""The channel on which a write that gives workers something to do says so (a new run, an
event, a decision or a settled wait: the run becomes runnable), for `PostgresWakeUps`."""

DEFAULT_POOL_SIZE = 4
POOL_SIZE_PARAMETER = "pool_size"
URL_FORM = "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?pool_size=N&...libpq parameters]"
_CONNECT_SECONDS = 10
_RECONNECT_SECONDS = 10.0
"""How long the pool's background tries to make one lost connection again (1, 2, 4 s apart)
before giving that try up: the next transaction wanting a connection starts a new one at once.
The pool's own default (5 minutes, its pauses doubling meanwhile) would leave a worker up to
minutes behind a database that came back."""
_LOST_CONNECTION = ("08", "57P01", "57P02", "57P03")
"""SQLSTATE classes and codes of a connection cut or refused (connection exceptions; the
server shutting down, crashed, or not yet accepting connections): an outage, not a
transaction turned away."""

# The pool says every failed try to reconnect (a warning each, through Python's last-resort
# handler when the application set up none). A worker says an outage once, in its own words
# (ratchet.worker.StoreOutage); an application that configures logging still sees these.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class PostgresUrl:
    """A `postgresql://` store URL, parsed and checked before any connection is made: what
    libpq takes (every parameter but Ratchet's own), and the pool's size."""

    conninfo: str = field(repr=False)  # it may hold a password
    pool_size: int
    where: str
    """The database as a message names it: host and database, never a password."""

    @classmethod
    def parse(cls, url: str) -> PostgresUrl:
        if not url.startswith(POSTGRES_SCHEMES):
            raise InvalidInput(f"not a Postgres store URL {shown_url(url)!r}: use {URL_FORM}")
        try:
            parts = urlsplit(url)
            query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
            port = parts.port
        except ValueError:
            raise InvalidInput(f"malformed store URL: use {URL_FORM}") from None
        database = parts.path.lstrip("/")
        if not database or "/" in database or parts.fragment:
            raise InvalidInput(f"the store URL must name one database: use {URL_FORM}")
        sizes = [value for name, value in query if name == POOL_SIZE_PARAMETER]
        if len(sizes) > 1:
            raise InvalidInput(f"parameter {POOL_SIZE_PARAMETER!r} is given twice in the store URL")
        pool_size = DEFAULT_POOL_SIZE
        if sizes:
            if not sizes[0].isdigit() or not 1 <= int(sizes[0]) <= 100:
                raise InvalidInput(
                    f"the store URL's {POOL_SIZE_PARAMETER} must be a number of connections "
                    f"from 1 to 100, not {sizes[0]!r}"
                )
            pool_size = int(sizes[0])
        rest = [(name, value) for name, value in query if name != POOL_SIZE_PARAMETER]
        host = dict(rest).get("host") or parts.hostname or "localhost"
        where = f"{host}{f':{port}' if port else ''}/{database}"
        conninfo = urlunsplit(
            ("postgresql", parts.netloc, parts.path, urlencode(rest, quote_via=quote), "")
        )
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
        except ImportError:
            raise StoreUnavailable(
                "a postgresql:// store needs psycopg: pip install 'ratchet-agents[postgres]'"
            ) from None
        try:
            conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError as error:  # libpq refused its parameters
            raise InvalidInput(
                f"malformed store URL ({_first_line(error)}): use {URL_FORM}"
            ) from None
        return cls(conninfo, pool_size, where)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


class PostgresDatabase:
    """A pool of connections to a Ratchet store in Postgres, shared by the store, the ledger
    and the mailbox (and safe to share between threads: each transaction takes a connection of
    its own from the pool).

    With `create`, an empty database (its current schema holds no table) becomes a store;
    without it, an empty one is `StoreMissing`. A database holding other tables than Ratchet's
    is `StoreUnavailable`, and nothing in it is changed."""

    def __init__(self, url: PostgresUrl, *, create: bool = True) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        self.url = url
        self._psycopg = psycopg
        self.found_version: int | None = None
        """The schema version of the store as this open found it; None if it made it."""
        self.upgraded_from: int | None = None
        """The older schema version this open upgraded the store from, if it did."""
        try:
            # One connection first, alone: a wrong host, a missing database or a role refused
            # fails here with libpq's own reason, rather than as a pool's timeout.
            with psycopg.connect(
                url.conninfo, autocommit=True, connect_timeout=_CONNECT_SECONDS
            ) as connection:
                self._make_or_check(connection, create=create)
        except psycopg.OperationalError as error:
            raise StoreUnavailable(
                f"cannot reach the Postgres store {url.where}: {_first_line(error)}"
            ) from None
        except psycopg.errors.InsufficientPrivilege as error:
            raise StoreUnavailable(
                f"the Postgres store {url.where} cannot be used: {_first_line(error)}"
            ) from None
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url.conninfo,
            min_size=1,
            max_size=url.pool_size,
            # Autocommit, so that every transaction is one `transaction()` block or one
            # statement (`autocommit()`), and nothing is left open between them.
            kwargs={"autocommit": True},
            configure=_configure,
            # A transaction waits this long for a connection: one of the pool's, or the one
            # it makes again after the database restarted.
            timeout=_CONNECT_SECONDS,
            reconnect_timeout=_RECONNECT_SECONDS,
            open=True,
        )

    @property
    def schema_version(self) -> int:
        """The schema version this Ratchet makes and upgrades stores to."""
        return SCHEMA_VERSION

    def _make_or_check(self, connection: psycopg.Connection[Any], *, create: bool) -> None:
        # The marker and the other tables are seen in one statement, one snapshot: a store
        # another process makes meanwhile is seen whole (its marker with its tables) or not
        # at all, never as tables without their marker, which is another application's.
        tables = _tables(connection)
        self.found_version = self._marked(connection, tables)
        if self.found_version == SCHEMA_VERSION:
            return
        if self.found_version is None and tables:
            raise StoreUnavailable(
                f"{self.url.where} is not a Ratchet store: it has tables of another application "
                f"({', '.join(tables[:3])}); nothing was changed"
            )
        if not create:
            if self.found_version is None:
                raise StoreMissing(f"no Ratchet store in {self.url.where} (start a run first)")
            # A store of an older schema is read as it is (every version keeps the tables of
            # the one before): the first command that writes upgrades it.
            return
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_MAKING_LOCK,))
            # Another process may have made or upgraded it while this one waited for the
            # lock: then it is whole (each in one transaction), and nothing is done twice.
            tables = _tables(connection)
            version = self._marked(connection, tables)
            if version is None:
                if tables:
                    raise StoreUnavailable(
                        f"{self.url.where} is not a Ratchet store: another application made "
                        "its tables meanwhile; nothing was changed"
                    )
                connection.execute(_SCHEMA.encode())
                version = 1
            elif version < SCHEMA_VERSION:
                self.upgraded_from = version
            # In the transaction that made the store, or under the lock: a process that
            # opens it next finds every step done or none.
            for step in range(version, SCHEMA_VERSION):
                connection.execute(_UPGRADES[step].encode())
            connection.execute(f"UPDATE {MARKER_TABLE} SET schema_version = %s", (SCHEMA_VERSION,))

    def _marked(self, connection: psycopg.Connection[Any], tables: list[str]) -> int | None:
        """The schema version of Ratchet's marker if `tables` (the current schema's) hold it;
        `StoreUnavailable` if a newer Ratchet made it."""
        if MARKER_TABLE not in tables:
            return None
        row = connection.execute(f"SELECT max(schema_version) FROM {MARKER_TABLE}").fetchone()
        version = row[0] if row else None
        if version is None or version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"{self.url.where} holds a Ratchet store of schema {version}, which this Ratchet "
                f"(schema {SCHEMA_VERSION}) cannot read: upgrade Ratchet"
            )
        return int(version)

    @contextmanager
    def write(self) -> Iterator[psycopg.Connection[Any]]:
        """One transaction on a connection of the pool: committed when the block ends, rolled
        back (nothing written) if it raises."""
        with self._errors(), self.pool.connection() as connection:
            _begin_as(connection, isolation=None, read_only=None)
            with connection.transaction():
                yield connection

    @contextmanager
    def read(self) -> Iterator[psycopg.Connection[Any]]:
        """One read-only transaction whose statements all see the same snapshot (a head and
        the records of its window)."""
        with self._errors(), self.pool.connection() as connection:
            _begin_as(
                connection, isolation=self._psycopg.IsolationLevel.REPEATABLE_READ, read_only=True
            )
            with connection.transaction():
                yield connection

    @contextmanager
    def autocommit(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool outside any transaction: each statement sent on it is a
        transaction of its own, committed before its answer comes back. One round trip,
        where a `write()` of one statement takes three (its BEGIN, the statement, its
        COMMIT): for a write that is one statement, or a read that needs one snapshot only.
        Two statements in one block are two transactions: the second sees what committed
        between them, as a new statement at READ COMMITTED does in a `write()`."""
        with self._errors(), self.pool.connection() as connection:
            yield connection

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Postgres's failures as Ratchet's: a lost connection, a pool with none free or a
        transaction Postgres broke off (a deadlock, a serialization failure) is `StoreBusy`:
        the transaction rolled back, nothing partial was written, and retrying is safe."""
        from psycopg_pool import PoolTimeout

        psycopg = self._psycopg
        try:
            yield
        except (psycopg.OperationalError, PoolTimeout) as error:
            said = f"the Postgres store {self.url.where} did not answer: {_first_line(error)}"
            if self._lost(error):
                raise StoreUnreachable(said) from None
            raise StoreBusy(said) from None
        except psycopg.DataError as error:
            raise InvalidInput(
                f"the Postgres store refused a value: {_first_line(error)}"
            ) from None
        except psycopg.errors.UndefinedTable as error:
            # A command that only reads opened an older store as it is (`_make_or_check`),
            # and reads a table a later version added.
            older = self.found_version is not None and self.found_version < SCHEMA_VERSION
            raise StoreUnavailable(
                f"the Postgres store {self.url.where} is of schema {self.found_version}, older "
                f"than this Ratchet's ({SCHEMA_VERSION}): run `ratchet migrate` to upgrade it"
                if older
                else f"the Postgres store {self.url.where} lacks a table: {_first_line(error)}"
            ) from None
        except psycopg.errors.InsufficientPrivilege as error:
            raise StoreUnavailable(
                f"the Postgres store {self.url.where} cannot be used: {_first_line(error)}"
            ) from None

    def _lost(self, error: Exception) -> bool:
        """Whether `error` says the database is out of reach, not that it turned one
        transaction away (a deadlock, a serialization failure, a lock or statement timeout)."""
        from psycopg_pool import PoolTimeout

        if isinstance(error, PoolTimeout):
            # No connection came in time: every one busy in this process's other threads, or
            # none can be made. One try of its own tells the two apart.
            try:
                self._psycopg.connect(self.url.conninfo, connect_timeout=_CONNECT_SECONDS).close()
            except self._psycopg.OperationalError:
                return True
            return False
        code = getattr(error, "sqlstate", None)
        # No SQLSTATE: libpq's own failure (the socket closed, no server there).
        if code is not None and not code.startswith(_LOST_CONNECTION):
            return False
        # The pool's idle connections were cut too, and it learns that of each only as it is
        # next used: were those kept, each would fail once more after the database is back,
        # and a worker would say its store went away again. Test and drop them now.
        self.pool.check()
        return True

    def close(self) -> None:
        self.pool.close()


def notify_work(tx: psycopg.Connection[Any], run_id: str) -> None:
    """Tell the listening workers that `run_id` may be worked, in `tx`: Postgres sends the
    notification when the transaction commits, and never if it rolls back, so no worker is
    woken for a write that did not land, nor misses one that did (unless it was not listening
    then: its fallback poll finds the run)."""
    tx.execute("SELECT pg_notify(%s, %s)", (WORK_CHANNEL, run_id))


def _begin_as(
    connection: psycopg.Connection[Any],
    *,
    isolation: psycopg.IsolationLevel | None,
    read_only: bool | None,
) -> None:
    """How the next `transaction()` on `connection` begins. psycopg writes these into its
    BEGIN (`BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`), so a read's isolation costs no
    `SET TRANSACTION` round trip of its own; setting them sends nothing. Set by every
    transaction, as the pool hands its connections to reads and writes alike."""
    if connection.isolation_level != isolation:
        connection.isolation_level = isolation
    if connection.read_only != read_only:
        connection.read_only = read_only


def _configure(connection: psycopg.Connection[Any]) -> None:
    """Each new connection of the pool reads times in UTC, as Ratchet writes them. A setting of
    the session, not `options` in the URL, which stays the user's (a `search_path`, say)."""
    connection.execute("SET TIME ZONE 'UTC'")


def _tables(connection: psycopg.Connection[Any]) -> list[str]:
    """The tables (and views) of the connection's current schema, by name."""
    return [
        str(name)
        for (name,) in connection.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() ORDER BY table_name"
        )
    ]
