"""The idempotency ledger on SQLite: one row per step's key in `idempotency`, beside the runs
in the file `SqliteDatabase` opens (so a commit can complete its key in the same transaction).
A completed key's `decision` is NULL: the step's record holds it (`COMPLETION_SQL`). A `called`
key, whose at-most-once call has no result yet, keeps its `CallStart` (JSON) in `result` until
the completion writes the result there: no column of its own, so a store of any age takes it.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta

from ratchet.adapters.sqlite.database import SqliteDatabase, check_size
from ratchet.errors import IdempotencyConflict
from ratchet.ports import CallStart, LedgerEntry, LedgerStatus
from ratchet.sealing import PayloadCodec
from ratchet.state import utcnow
from ratchet.stored import open_sealed_text, opened_args_hash, sealed_args_hash, sealed_text

LEDGER_RETENTION = timedelta(days=30)
COMPLETION_SQL = "UPDATE idempotency SET status = ?, result = ?, decision = NULL WHERE key = ?"
"""Completes a key, with the step's commit (`SqliteCheckpointStore.commit`) or alone: the
decision leaves the ledger, as the record written in the same transaction holds it, so a
step's arguments are stored once. A retry before the commit still finds it here."""


class SqliteLedger:
    def __init__(
        self,
        db: SqliteDatabase,
        *,
        retention: timedelta = LEDGER_RETENTION,
        codec: PayloadCodec | None = None,
    ) -> None:
        self._db = db
        self._retention = retention
        self._codec = codec  # seals a decision's arguments until its step's record holds them

    def begin(self, entry: LedgerEntry) -> LedgerEntry:
        decision_json = sealed_text(
            json.dumps(entry.decision, sort_keys=True, separators=(",", ":")),
            self._codec,
            part="decision",
            run_id=entry.run_id,
        )
        check_size(f"ledger decision of {entry.key}", decision_json)
        now = utcnow()
        expires_at = entry.expires_at or now + self._retention
        with self._db.write() as tx:
            # Insert-if-absent under the write lock: of two workers deciding the same step,
            # the first record stands and the second reads it back below.
            inserted = tx.execute(
                "INSERT INTO idempotency (key, run_id, step, status, args_hash, decision, "
                "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key) DO NOTHING",
                (
                    entry.key,
                    entry.run_id,
                    entry.step,
                    LedgerStatus.IN_PROGRESS.value,
                    sealed_args_hash(entry.args_hash, self._codec, run_id=entry.run_id),
                    decision_json,
                    now.isoformat(),
                    expires_at.isoformat(),
                ),
            ).rowcount
            if inserted:
                return entry.model_copy(
                    update={"status": LedgerStatus.IN_PROGRESS, "expires_at": expires_at}
                )
            stored = self._read(tx, entry.key)
        assert stored is not None
        if stored.args_hash != entry.args_hash:
            raise IdempotencyConflict(entry.key)
        return stored

    def get(self, key: str) -> LedgerEntry | None:
        return self._read(self._db.connection, key)

    def complete(self, key: str, result: str) -> None:
        check_size(f"ledger result of {key}", result)
        with self._db.write() as tx:
            self._db.completing(tx)
            changed = tx.execute(
                COMPLETION_SQL, (LedgerStatus.COMPLETED.value, result, key)
            ).rowcount
        if not changed:
            raise KeyError(f"no idempotency record for {key!r}")

    def start_call(self, key: str, call: CallStart) -> bool:
        with self._db.write() as tx:
            moved = tx.execute(
                "UPDATE idempotency SET status = ?, result = ? WHERE key = ? AND status = ?",
                (
                    LedgerStatus.CALLED.value,
                    call.model_dump_json(),
                    key,
                    LedgerStatus.IN_PROGRESS.value,
                ),
            ).rowcount
            if moved:
                return True
            if self._read(tx, key) is None:
                raise KeyError(f"no idempotency record for {key!r}")
        return False

    def _read(self, connection: sqlite3.Connection, key: str) -> LedgerEntry | None:
        row = connection.execute(
            "SELECT key, run_id, step, status, args_hash, decision, result, expires_at "
            "FROM idempotency WHERE key = ?",
            (key,),
        ).fetchone()
        if row is None:
            return None
        key, run_id, step, status, args_hash, decision, result, expires_at = row
        called = status == LedgerStatus.CALLED.value
        return LedgerEntry(
            key=key,
            run_id=run_id,
            step=step,
            status=LedgerStatus(status),
            args_hash=opened_args_hash(args_hash, self._codec, run_id=run_id),
            decision=None
            if decision is None
            else json.loads(
                open_sealed_text(decision, self._codec, part="decision", run_id=run_id)
            ),
            result=None if called else result,
            expires_at=datetime.fromisoformat(expires_at) if expires_at else None,
            call=CallStart.model_validate_json(result) if called and result else None,
        )
