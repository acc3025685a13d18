"""Expiring leases: which local worker is working on which run, and which worker ids are live.

A lease is a scheduling hint, not the safety net: a worker whose lease lapsed while it was
mid-step can still try to commit, and the checkpoint's version check rejects it. Leases only
keep two healthy workers from picking the same run, and let a dead worker's runs be picked up
once its lease lapses.

A worker id is registered with the same kind of expiry, renewed on the same heartbeat, so two
live workers never share an id (a shared id would let both hold the same lease) while the id of
a worker that died can be taken again once its registration lapses.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.errors import InvalidInput
from ratchet.ports import Beat, ConcurrencyBound, check_lease_seconds
from ratchet.state import PRIORITY_AGING_SECONDS, RunStatus

WORKERS_SCHEMA = """
-- ratchet.adapters.sqlite.leases registers the live local workers here.
CREATE TABLE IF NOT EXISTS workers (
    worker_id  TEXT PRIMARY KEY,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    token      TEXT NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
"""


_AGENT = (
    "coalesce(CASE WHEN json_valid(s.state) THEN json_extract(s.state, '$.agent') END, "
    "CASE WHEN json_valid(r.state) THEN json_extract(r.state, '$.agent') END)"
)
"""A run's stored agent reference, from its static part (or, for a run made before there was
one, its head); SQL over `runs AS r LEFT JOIN run_static AS s`. NULL for a damaged row: the
run is claimed as if unbounded, and the worker that reads it skips it, saying why."""
_HELD_AGENT = _AGENT.replace("s.state", "hs.state").replace("r.state", "hr.state")
_KEY = "CASE WHEN json_valid(s.state) THEN json_extract(s.state, '$.concurrency_key') END"
"""A run's `concurrency_key`, from its static part (in clear when sealed); NULL for none."""
_HELD_KEY = _KEY.replace("s.state", "hs.state")
_PRIORITY = "CASE WHEN json_valid(s.state) THEN json_extract(s.state, '$.priority') END"
"""A run's `priority`, from its static part; NULL for the default (0), which is not stored."""


class WorkerIdInUse(InvalidInput):
    """Another live worker holds this worker id; nothing was claimed."""

    def __init__(self, worker_id: str, holder: LiveWorker, now: float) -> None:
        lapses_in = max(holder.expires_at - now, 0)
        super().__init__(
            f"worker id {worker_id!r} is in use by a live worker (pid {holder.pid} on "
            f"{holder.host}); pick another worker id, or wait {lapses_in:.0f} s for its "
            "heartbeat to lapse if that worker is gone"
        )
        self.worker_id = worker_id


@dataclass(frozen=True)
class LiveWorker:
    host: str
    pid: int
    expires_at: float


class SqliteLeases:
    """`ratchet.ports.Leases` in the `leases` and `workers` tables of a local store."""

    def __init__(self, db: SqliteDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._clock = clock
        self._workers_table_checked = False

    def on_own_connection(self) -> SqliteLeases:
        """The same leases on a new connection to the same file, for use by the thread that
        calls this (a sqlite3 connection belongs to the thread that made it). Close it after."""
        return SqliteLeases(SqliteDatabase(self._db.path, create=False), clock=self._clock)

    def close(self) -> None:
        self._db.close()

    # --- runs ------------------------------------------------------------------------------

    def claim(
        self,
        owner: str,
        seconds: float,
        *,
        run_id: str | None = None,
        skip: Collection[str] = (),
        limit_of: Callable[[str], ConcurrencyBound | None] | None = None,
    ) -> str | None:
        """Lease the running run (or `run_id`) of highest effective priority (its `priority`
        grown by the time since it was last written, `effective_priority`; of two alike, the
        longest idle) that nobody holds, leaving out the runs in `skip`, and those whose agent
        (by `limit_of` its stored reference) already has as many runs under a live lease as
        its bound, or whose key as many of its agent's runs as the agent's bound per key; None
        if there is none."""
        check_lease_seconds(seconds)
        agents, bounds, per_key = self._bounds(limit_of) if limit_of is not None else ({}, {}, {})
        now = self._clock()
        with self._write() as tx:
            # Find and take in one write transaction: SQLite's write lock makes the pair
            # atomic, so two workers can never both see the same run as free, and never both
            # take an agent's (or a key's) last slot (a live lease on one of its runs is a
            # slot). The runs counted are those of the agent, by its name (`agent.value`),
            # not of the reference this run stores: two references to one agent share its
            # slots.
            bounded = (
                f"LEFT JOIN json_each(?) AS agent ON agent.key = {_AGENT} "
                "LEFT JOIN json_each(?) AS bound ON bound.key = agent.value "
                "LEFT JOIN json_each(?) AS per_key ON per_key.key = agent.value "
                if agents
                else ""
            )
            held = (
                "(SELECT count(*) FROM leases h JOIN runs hr ON hr.run_id = h.run_id "
                "LEFT JOIN run_static hs ON hs.run_id = h.run_id "
                f"JOIN json_each(?) AS held ON held.key = {_HELD_AGENT} "
                "WHERE h.expires_at > ? AND hr.status = ? AND h.run_id != r.run_id "
                "AND held.value = agent.value"
            )
            within = (
                f"AND (bound.value IS NULL OR {held}) < bound.value) "
                f"AND (per_key.value IS NULL OR {_KEY} IS NULL OR {held} "
                f"AND {_HELD_KEY} = {_KEY}) < per_key.value) "
                if agents
                else ""
            )
            bound_parameters = (
                (json.dumps(agents), json.dumps(bounds), json.dumps(per_key)) if agents else ()
            )
            counted = (json.dumps(agents), now, RunStatus.RUNNING.value)
            within_parameters = (*counted, *counted) if agents else ()
            row = tx.execute(
                "SELECT r.run_id FROM runs r LEFT JOIN leases l ON l.run_id = r.run_id "
                "LEFT JOIN run_static s ON s.run_id = r.run_id "
                f"{bounded}"
                "WHERE r.status = ? AND (? IS NULL OR r.run_id = ?) "
                "AND r.run_id NOT IN (SELECT value FROM json_each(?)) "
                "AND (l.run_id IS NULL OR l.expires_at <= ? OR l.owner = ?) "
                f"{within}"
                # `ratchet.state.effective_priority`, in SQL: the freed slot goes to the
                # highest, and a run of low priority gains on the others while it waits.
                f"ORDER BY coalesce({_PRIORITY}, 0) + (julianday(?) - julianday(r.updated_at)) "
                "* 86400.0 / ? DESC, r.updated_at LIMIT 1",
                (
                    *bound_parameters,
                    RunStatus.RUNNING.value,
                    run_id,
                    run_id,
                    json.dumps(list(skip)),
                    now,
                    owner,
                    *within_parameters,
                    datetime.fromtimestamp(now, UTC).isoformat(),
                    PRIORITY_AGING_SECONDS,
                ),
            ).fetchone()
            if row is None:
                return None
            tx.execute(
                "INSERT INTO leases (run_id, owner, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, "
                "expires_at = excluded.expires_at",
                (row[0], owner, now + seconds),
            )
            return str(row[0])

    def _bounds(
        self, limit_of: Callable[[str], ConcurrencyBound | None]
    ) -> tuple[dict[str, str], dict[str, int], dict[str, int]]:
        """The agent (by name) of each stored reference of a running run whose agent is
        bounded, and each such agent's bound and bound per key: of every running run, not
        only those the claim may take, since the runs held under any reference to an agent
        count against its bound (read outside the write transaction: loading an agent the
        first time imports its module)."""
        references = self._db.connection.execute(
            f"SELECT DISTINCT {_AGENT} FROM runs r LEFT JOIN run_static s "
            "ON s.run_id = r.run_id WHERE r.status = ?",
            (RunStatus.RUNNING.value,),
        ).fetchall()
        agents: dict[str, str] = {}
        bounds: dict[str, int] = {}
        per_key: dict[str, int] = {}
        for (reference,) in references:
            bound = limit_of(reference) if isinstance(reference, str) else None
            if bound is None:
                continue
            agents[reference] = bound.agent
            # Two agents of one name are one agent here; the tighter bound holds for both.
            if bound.limit is not None:
                bounds[bound.agent] = min(bounds.get(bound.agent, bound.limit), bound.limit)
            if bound.per_key is not None:
                per_key[bound.agent] = min(per_key.get(bound.agent, bound.per_key), bound.per_key)
        return agents, bounds, per_key

    def renew(self, run_id: str, owner: str, seconds: float) -> bool:
        """Extend our lease; False if it lapsed and another worker took the run."""
        check_lease_seconds(seconds)
        with self._write() as tx:
            return self._renew(tx, run_id, owner, self._clock() + seconds)

    def release(self, run_id: str, owner: str) -> None:
        with self._write() as tx:
            # Only our own lease: after ours lapsed, the run may already be another worker's.
            tx.execute("DELETE FROM leases WHERE run_id = ? AND owner = ?", (run_id, owner))

    def holder(self, run_id: str) -> tuple[str, float] | None:
        row = self._db.connection.execute(
            "SELECT owner, expires_at FROM leases WHERE run_id = ?", (run_id,)
        ).fetchone()
        return (str(row[0]), float(row[1])) if row else None

    def held_by_others(
        self, owner: str, run_id: str | None = None, *, skip: Collection[str] = ()
    ) -> list[tuple[str, str, float]]:
        """Running runs (or `run_id`) that another worker's unexpired lease keeps from
        `owner`, as (run id, holder, expires_at): what a worker finding nothing to claim waits
        for."""
        rows = self._db.connection.execute(
            "SELECT r.run_id, l.owner, l.expires_at FROM runs r JOIN leases l "
            "ON l.run_id = r.run_id WHERE r.status = ? AND (? IS NULL OR r.run_id = ?) "
            "AND r.run_id NOT IN (SELECT value FROM json_each(?)) "
            "AND l.owner != ? AND l.expires_at > ? ORDER BY r.run_id",
            (
                RunStatus.RUNNING.value,
                run_id,
                run_id,
                json.dumps(list(skip)),
                owner,
                self._clock(),
            ),
        ).fetchall()
        return [(str(r[0]), str(r[1]), float(r[2])) for r in rows]

    def running_runs(self, run_id: str | None = None, *, skip: Collection[str] = ()) -> int:
        """Runs a worker could still advance (leased or not), leaving out the runs in `skip`.
        Waiting runs do not count."""
        (count,) = self._db.connection.execute(
            "SELECT count(*) FROM runs WHERE status = ? AND (? IS NULL OR run_id = ?) "
            "AND run_id NOT IN (SELECT value FROM json_each(?))",
            (RunStatus.RUNNING.value, run_id, run_id, json.dumps(list(skip))),
        ).fetchone()
        return int(count)

    # --- live workers ----------------------------------------------------------------------

    def register_worker(
        self,
        worker_id: str,
        token: str,
        seconds: float,
        *,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        """Register this process (`token`) as the live holder of `worker_id` for `seconds`.
        Raises `WorkerIdInUse` if another registration of that id has not lapsed."""
        check_lease_seconds(seconds)
        now = self._clock()
        with self._write() as tx:
            holder = self._live_holder(tx, worker_id, token, now)
            if holder is not None:
                raise WorkerIdInUse(worker_id, holder, now)
            tx.execute(
                "INSERT INTO workers (worker_id, host, pid, token, expires_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET "
                "host = excluded.host, pid = excluded.pid, token = excluded.token, "
                "expires_at = excluded.expires_at",
                (
                    worker_id,
                    host or socket.gethostname(),
                    os.getpid() if pid is None else pid,
                    token,
                    now + seconds,
                ),
            )

    def unregister_worker(self, worker_id: str, token: str) -> None:
        with self._write() as tx:
            tx.execute("DELETE FROM workers WHERE worker_id = ? AND token = ?", (worker_id, token))

    def beat(self, worker_id: str, token: str, seconds: float, run_id: str | None) -> Beat:
        """One heartbeat, in one transaction: renew this worker's registration and, if it
        works on `run_id`, its lease on that run."""
        check_lease_seconds(seconds)
        expires_at = self._clock() + seconds
        with self._write() as tx:
            # Conditional on our token: a registration that lapsed and was taken by another
            # live worker of the same id stays theirs, and this worker learns it must stop.
            registered = tx.execute(
                "UPDATE workers SET expires_at = ? WHERE worker_id = ? AND token = ?",
                (expires_at, worker_id, token),
            ).rowcount
            holds = run_id is not None and self._renew(tx, run_id, worker_id, expires_at)
        return Beat(registered=bool(registered), holds_lease=holds)

    def _live_holder(
        self, tx: sqlite3.Connection, worker_id: str, token: str, now: float
    ) -> LiveWorker | None:
        row = tx.execute(
            "SELECT host, pid, token, expires_at FROM workers WHERE worker_id = ?", (worker_id,)
        ).fetchone()
        if row is None or row[2] == token or float(row[3]) <= now:
            return None
        return LiveWorker(host=str(row[0]), pid=int(row[1]), expires_at=float(row[3]))

    # --- plumbing --------------------------------------------------------------------------

    @staticmethod
    def _renew(tx: sqlite3.Connection, run_id: str, owner: str, expires_at: float) -> bool:
        changed = tx.execute(
            "UPDATE leases SET expires_at = ? WHERE run_id = ? AND owner = ?",
            (expires_at, run_id, owner),
        ).rowcount
        return bool(changed)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; a store made before live workers were registered gets their
        table in the first one."""
        with self._db.write() as tx:
            if not self._workers_table_checked:
                tx.execute(WORKERS_SCHEMA)
            yield tx
        self._workers_table_checked = True
