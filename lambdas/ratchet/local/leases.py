"""Expiring leases: which local worker is working on which run.

A lease is a scheduling hint, not the safety net: a worker whose lease lapsed while it was
mid-step can still try to commit, and the checkpoint's version check rejects it. Leases only
keep two healthy workers from picking the same run, and let a dead worker's runs be picked up
once its lease lapses.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ratchet.adapters.sqlite import SqliteDatabase
from ratchet.state import RunStatus


class Leases:
    def __init__(self, db: SqliteDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._clock = clock

    def claim(self, owner: str, seconds: float, *, run_id: str | None = None) -> str | None:
        """Lease the longest-idle running run (or `run_id`) that nobody holds; None if none."""
        now = self._clock()
        with self._db.write() as tx:
            # Find and take in one write transaction: SQLite's write lock makes the pair
            # atomic, so two workers can never both see the same run as free.
            row = tx.execute(
                "SELECT r.run_id FROM runs r LEFT JOIN leases l ON l.run_id = r.run_id "
                "WHERE r.status = ? AND (? IS NULL OR r.run_id = ?) "
                "AND (l.run_id IS NULL OR l.expires_at <= ? OR l.owner = ?) "
                "ORDER BY r.updated_at LIMIT 1",
                (RunStatus.RUNNING.value, run_id, run_id, now, owner),
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

    def renew(self, run_id: str, owner: str, seconds: float) -> bool:
        """Extend our lease; False if it lapsed and another worker took the run."""
        with self._db.write() as tx:
            changed = tx.execute(
                "UPDATE leases SET expires_at = ? WHERE run_id = ? AND owner = ?",
                (self._clock() + seconds, run_id, owner),
            ).rowcount
        return bool(changed)

    def release(self, run_id: str, owner: str) -> None:
        with self._db.write() as tx:
            tx.execute("DELETE FROM leases WHERE run_id = ? AND owner = ?", (run_id, owner))

    def holder(self, run_id: str) -> tuple[str, float] | None:
        row = self._db.connection.execute(
            "SELECT owner, expires_at FROM leases WHERE run_id = ?", (run_id,)
        ).fetchone()
        return (str(row[0]), float(row[1])) if row else None

    def running_runs(self, run_id: str | None = None) -> int:
        """Runs a worker could still advance (leased or not). Waiting runs do not count."""
        (count,) = self._db.connection.execute(
            "SELECT count(*) FROM runs WHERE status = ? AND (? IS NULL OR run_id = ?)",
            (RunStatus.RUNNING.value, run_id, run_id),
        ).fetchone()
        return int(count)
