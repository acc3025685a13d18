"""Expiring leases in a Postgres store: which worker, on whichever machine, works on which run,
and which worker ids are live (`ratchet.ports.Leases`, as `ratchet.adapters.sqlite.leases`).

A lease is a scheduling hint, not the safety net: a worker whose lease lapsed mid-step can
still try to commit, and the checkpoint's version check rejects it. Leases keep two healthy
workers from picking the same run, and let a dead worker's runs be picked up once its lease
lapses. Times are the workers' clocks (seconds since the epoch), as SQLite's leases keep them:
workers on several machines must keep their clocks in step (NTP) within a lease's margin.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.sqlite.leases import LiveWorker, WorkerIdInUse
from ratchet.ports import Beat, ConcurrencyBound, check_lease_seconds
from ratchet.state import RunStatus, effective_priority

if TYPE_CHECKING:
    import psycopg

_T = TypeVar("_T")

_BOUNDED_CLAIMS_LOCK = 0x52744368_00000002
"""The advisory lock (transaction-scoped) that claims bounded by an agent's concurrency take in
turn: a bound is a count over many runs' leases, which no one row's lock covers."""

_RUNNABLE = (
    "r.status = %(running)s AND (%(run_id)s::text IS NULL OR r.run_id = %(run_id)s) "
    "AND r.run_id <> ALL(%(skip)s::text[])"
)
_FREE = "(l.run_id IS NULL OR l.expires_at <= %(now)s OR l.owner = %(owner)s)"
_TAKE = (
    "INSERT INTO leases AS held (run_id, owner, expires_at) VALUES (%(taken)s, %(owner)s, "
    "%(expires_at)s) ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, "
    "expires_at = excluded.expires_at "
    "WHERE held.expires_at <= %(now)s OR held.owner = %(owner)s RETURNING run_id"
)
"""Take (or renew) the lease of run `taken`, only if it is free: never over another worker's
live lease, whatever the claim's snapshot said."""


class PostgresLeases:
    """`ratchet.ports.Leases` in the `leases` and `workers` tables of a Postgres store."""

    def __init__(self, db: PostgresDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._clock = clock

    def on_own_connection(self) -> PostgresLeases:
        """The same leases: every call takes a connection of its own from the pool, so any
        thread (the heartbeat's) may use them."""
        return self

    def close(self) -> None:
        """Nothing of its own to close: the store's pool outlives the heartbeat's thread."""

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
        """Lease the longest-idle running run (or `run_id`) that nobody holds, leaving out the
        runs in `skip`, and those whose agent (by `limit_of` its stored reference) already has
        as many runs under a live lease as its bound; None if there is none."""
        check_lease_seconds(seconds)
        now = self._clock()
        given = {
            "running": RunStatus.RUNNING.value,
            "run_id": run_id,
            "skip": list(skip),
            "now": now,
            "owner": owner,
            "expires_at": now + seconds,
        }
        bounds = self._bounds(given, limit_of) if limit_of is not None else {}
        with self._db.write() as tx:
            if bounds:
                # A bound is a count over many runs' leases, which no one row's lock covers:
                # bounded claims read the leases and take one in turn, so two workers never
                # both take an agent's (or a key's) last slot.
                tx.execute("SELECT pg_advisory_xact_lock(%s)", (_BOUNDED_CLAIMS_LOCK,))
            candidates = tx.execute(
                "SELECT r.run_id, s.state, r.updated_at FROM runs AS r "
                "LEFT JOIN run_static AS s ON s.run_id = r.run_id "
                f"LEFT JOIN leases AS l ON l.run_id = r.run_id WHERE {_RUNNABLE} AND {_FREE}",
                given,
            ).fetchall()
            held = self._held(tx, given, bounds) if bounds else []
            # `ratchet.state.effective_priority`: the freed slot goes to the highest, and a
            # run of low priority gains on the others while it waits; of two alike, the
            # longest idle. Each take is conditional (_TAKE), so a run another worker took
            # since this read is passed over for the next.
            candidates.sort(
                key=lambda row: (
                    -effective_priority(
                        _field(row[1], "priority", int) or 0, now - row[2].timestamp()
                    ),
                    row[2],
                )
            )
            for candidate, static, _ in candidates:
                if bounds and not _within(str(candidate), static, bounds, held):
                    continue
                taken = tx.execute(_TAKE, {**given, "taken": candidate}).fetchone()
                if taken:
                    return str(taken[0])
        return None

    def _bounds(
        self, given: dict[str, Any], limit_of: Callable[[str], ConcurrencyBound | None]
    ) -> dict[str, ConcurrencyBound]:
        """The bound of each stored agent reference of a running run, where it has one: of
        every running run, not only those the claim may take, since the runs held under any
        reference to an agent count against its bound (read outside the write transaction:
        loading an agent the first time imports its module). Two agents of one name are one
        agent here; the tighter bounds hold for both."""
        with self._db.read() as tx:
            statics = tx.execute(
                "SELECT DISTINCT s.state FROM runs AS r JOIN run_static AS s "
                "ON s.run_id = r.run_id WHERE r.status = %(running)s",
                given,
            ).fetchall()
        bounds: dict[str, ConcurrencyBound] = {}
        for (static,) in statics:
            reference = _field(static, "agent", str)
            bound = limit_of(reference) if reference is not None else None
            if reference is not None and bound is not None:
                bounds[reference] = bound
        tightest: dict[str, ConcurrencyBound] = {}
        for bound in bounds.values():
            was = tightest.get(bound.agent, bound)
            tightest[bound.agent] = ConcurrencyBound(
                bound.agent, _least(was.limit, bound.limit), _least(was.per_key, bound.per_key)
            )
        return {reference: tightest[bound.agent] for reference, bound in bounds.items()}

    @staticmethod
    def _held(
        tx: psycopg.Connection[Any], given: dict[str, Any], bounds: dict[str, ConcurrencyBound]
    ) -> list[tuple[str, str | None, str | None]]:
        """The runs under a live lease, each as (run id, its bounded agent's name or None,
        its key or None): each is a slot of its agent, and of its key."""
        held = []
        for run, static in tx.execute(
            "SELECT h.run_id, s.state FROM leases AS h JOIN runs AS r ON r.run_id = h.run_id "
            "LEFT JOIN run_static AS s ON s.run_id = h.run_id "
            "WHERE h.expires_at > %(now)s AND r.status = %(running)s",
            given,
        ).fetchall():
            reference = _field(static, "agent", str)
            bound = bounds.get(reference) if reference is not None else None
            held.append(
                (
                    str(run),
                    bound.agent if bound is not None else None,
                    _field(static, "concurrency_key", str),
                )
            )
        return held

    def renew(self, run_id: str, owner: str, seconds: float) -> bool:
        """Extend our lease; False if it lapsed and another worker took the run."""
        check_lease_seconds(seconds)
        with self._db.write() as tx:
            return _renew(tx, run_id, owner, self._clock() + seconds)

    def release(self, run_id: str, owner: str) -> None:
        with self._db.write() as tx:
            # Only our own lease: after ours lapsed, the run may already be another worker's.
            tx.execute("DELETE FROM leases WHERE run_id = %s AND owner = %s", (run_id, owner))

    def holder(self, run_id: str) -> tuple[str, float] | None:
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT owner, expires_at FROM leases WHERE run_id = %s", (run_id,)
            ).fetchone()
        return (str(row[0]), float(row[1])) if row else None

    def held_by_others(
        self, owner: str, run_id: str | None = None, *, skip: Collection[str] = ()
    ) -> list[tuple[str, str, float]]:
        """Running runs (or `run_id`) that another worker's unexpired lease keeps from
        `owner`, as (run id, holder, expires_at)."""
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT r.run_id, l.owner, l.expires_at FROM runs AS r JOIN leases AS l "
                f"ON l.run_id = r.run_id WHERE {_RUNNABLE} "
                "AND l.owner <> %(owner)s AND l.expires_at > %(now)s ORDER BY r.run_id",
                {
                    "running": RunStatus.RUNNING.value,
                    "run_id": run_id,
                    "skip": list(skip),
                    "owner": owner,
                    "now": self._clock(),
                },
            ).fetchall()
        return [(str(r[0]), str(r[1]), float(r[2])) for r in rows]

    def running_runs(self, run_id: str | None = None, *, skip: Collection[str] = ()) -> int:
        """Runs a worker could still advance (leased or not), leaving out the runs in `skip`.
        Waiting runs do not count."""
        with self._db.read() as tx:
            row = tx.execute(
                f"SELECT count(*) FROM runs AS r WHERE {_RUNNABLE}",
                {"running": RunStatus.RUNNING.value, "run_id": run_id, "skip": list(skip)},
            ).fetchone()
        return int(row[0]) if row else 0

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
        with self._db.write() as tx:
            # The upsert changes the row only if it is ours or lapsed; one that another live
            # process holds is read back (locked by the upsert's attempt) and named.
            registered = tx.execute(
                "INSERT INTO workers AS w (worker_id, host, pid, token, expires_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (worker_id) DO UPDATE SET "
                "host = excluded.host, pid = excluded.pid, token = excluded.token, "
                "expires_at = excluded.expires_at WHERE w.token = excluded.token "
                "OR w.expires_at <= %s",
                (
                    worker_id,
                    host or socket.gethostname(),
                    os.getpid() if pid is None else pid,
                    token,
                    now + seconds,
                    now,
                ),
            ).rowcount
            if not registered:
                row = tx.execute(
                    "SELECT host, pid, expires_at FROM workers WHERE worker_id = %s",
                    (worker_id,),
                ).fetchone()
                assert row is not None
                holder = LiveWorker(host=str(row[0]), pid=int(row[1]), expires_at=float(row[2]))
                raise WorkerIdInUse(worker_id, holder, now)

    def unregister_worker(self, worker_id: str, token: str) -> None:
        with self._db.write() as tx:
            tx.execute(
                "DELETE FROM workers WHERE worker_id = %s AND token = %s", (worker_id, token)
            )

    def beat(self, worker_id: str, token: str, seconds: float, run_id: str | None) -> Beat:
        """One heartbeat, in one transaction: renew this worker's registration and, if it
        works on `run_id`, its lease on that run."""
        check_lease_seconds(seconds)
        expires_at = self._clock() + seconds
        with self._db.write() as tx:
            # Conditional on our token: a registration that lapsed and was taken by another
            # live worker of the same id stays theirs, and this worker learns it must stop.
            registered = tx.execute(
                "UPDATE workers SET expires_at = %s WHERE worker_id = %s AND token = %s",
                (expires_at, worker_id, token),
            ).rowcount
            holds = run_id is not None and _renew(tx, run_id, worker_id, expires_at)
        return Beat(registered=bool(registered), holds_lease=holds)


def _renew(tx: psycopg.Connection[Any], run_id: str, owner: str, expires_at: float) -> bool:
    changed = tx.execute(
        "UPDATE leases SET expires_at = %s WHERE run_id = %s AND owner = %s",
        (expires_at, run_id, owner),
    ).rowcount
    return bool(changed)


def _field(static: str | None, name: str, kind: type[_T]) -> _T | None:
    """A field of a run's static part (its agent reference, `concurrency_key`, `priority`:
    in clear when the codec seals the rest); None if it holds none of that kind."""
    if static is None:
        return None
    try:
        parsed = json.loads(static)
    except ValueError:
        return None
    value = parsed.get(name) if isinstance(parsed, dict) else None
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _within(
    run: str,
    static: str | None,
    bounds: dict[str, ConcurrencyBound],
    held: list[tuple[str, str | None, str | None]],
) -> bool:
    """Whether `run` may take a slot: its agent (None: unbounded, or a damaged row its worker
    reports) has fewer runs under a live lease than its bound, and its key fewer of the
    agent's runs than its bound per key (a live lease on one of them is a slot)."""
    reference = _field(static, "agent", str)
    bound = bounds.get(reference) if reference is not None else None
    if bound is None:
        return True
    others = [key for other, agent, key in held if agent == bound.agent and other != run]
    if bound.limit is not None and len(others) >= bound.limit:
        return False
    key = _field(static, "concurrency_key", str)
    if bound.per_key is None or key is None:
        return True
    return sum(1 for other in others if other == key) < bound.per_key
