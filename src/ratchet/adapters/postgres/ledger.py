"""The idempotency ledger on Postgres: one row per step's key in `idempotency`, beside the
runs (so a commit completes its key in its own transaction). A completed key's `decision` is
NULL: the step's record holds it (`COMPLETION_SQL`). A `called` key, whose at-most-once call
has no result yet, keeps its `CallStart` (JSON) in `result` until the completion writes the
result there, as the SQLite ledger does.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.sqlite.database import check_size
from ratchet.adapters.sqlite.ledger import LEDGER_RETENTION
from ratchet.errors import IdempotencyConflict
from ratchet.ports import CallStart, LedgerEntry, LedgerStatus
from ratchet.sealing import PayloadCodec
from ratchet.state import utcnow
from ratchet.stored import open_sealed_text, opened_args_hash, sealed_args_hash, sealed_text

if TYPE_CHECKING:
    import psycopg

COMPLETION_SQL = (
    "UPDATE idempotency SET status = %(ledger_status)s, result = %(ledger_result)s, "
    "decision = NULL WHERE key = %(ledger_key)s"
)
"""Completes a key, with the step's commit (`PostgresCheckpointStore.commit`, in its statement)
or alone: the decision leaves the ledger, as the record written in the same transaction holds
it."""


def completion(key: str, result: str | None) -> dict[str, object]:
    """`COMPLETION_SQL`'s parameters."""
    return {
        "ledger_status": LedgerStatus.COMPLETED.value,
        "ledger_result": None if result is None else result.encode(),
        "ledger_key": key,
    }


class PostgresLedger:
    def __init__(
        self,
        db: PostgresDatabase,
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
        with self._db.autocommit() as tx:
            # Insert-if-absent: of two workers deciding the same step, the second's insert
            # waits for the first's transaction, does nothing, and reads the first's record
            # back below (a new statement, which sees what committed meanwhile). The insert
            # is a transaction of its own, committed before its answer comes back: the
            # decision is committed before this returns, so before the step's tool runs.
            inserted = tx.execute(
                "INSERT INTO idempotency (key, run_id, step, status, args_hash, decision, "
                "created_at, expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (key) DO NOTHING",
                (
                    entry.key,
                    entry.run_id,
                    entry.step,
                    LedgerStatus.IN_PROGRESS.value,
                    sealed_args_hash(entry.args_hash, self._codec, run_id=entry.run_id),
                    decision_json,
                    now,
                    expires_at,
                ),
            ).rowcount
            if inserted:
                return entry.model_copy(
                    update={"status": LedgerStatus.IN_PROGRESS, "expires_at": expires_at}
                )
            found = self._read(tx, entry.key)
        assert found is not None
        if found.args_hash != entry.args_hash:
            raise IdempotencyConflict(entry.key)
        return found

    def get(self, key: str) -> LedgerEntry | None:
        # One statement sees one snapshot: no transaction of its own needed.
        with self._db.autocommit() as tx:
            return self._read(tx, key)

    def complete(self, key: str, result: str) -> None:
        check_size(f"ledger result of {key}", result)
        with self._db.autocommit() as tx:
            changed = tx.execute(COMPLETION_SQL, completion(key, result)).rowcount
        if not changed:
            raise KeyError(f"no idempotency record for {key!r}")

    def start_call(self, key: str, call: CallStart) -> bool:
        with self._db.autocommit() as tx:
            # Only from in progress: of two callers, the second's update waits for the first,
            # finds the key called, and changes nothing. A transaction of its own, committed
            # before this returns: the call starts only once its record says so.
            moved = tx.execute(
                "UPDATE idempotency SET status = %s, result = %s WHERE key = %s AND status = %s",
                (
                    LedgerStatus.CALLED.value,
                    call.model_dump_json().encode(),
                    key,
                    LedgerStatus.IN_PROGRESS.value,
                ),
            ).rowcount
            if moved:
                return True
            if self._read(tx, key) is None:
                raise KeyError(f"no idempotency record for {key!r}")
        return False

    def _read(self, tx: psycopg.Connection[Any], key: str) -> LedgerEntry | None:
        row = tx.execute(
            "SELECT key, run_id, step, status, args_hash, decision, result, expires_at "
            "FROM idempotency WHERE key = %s",
            (key,),
        ).fetchone()
        if row is None:
            return None
        key, run_id, step, status, args_hash, decision, stored_result, expires_at = row
        result = None if stored_result is None else bytes(stored_result).decode()
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
            expires_at=expires_at,
            call=CallStart.model_validate_json(result) if called and result else None,
        )
