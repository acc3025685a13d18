"""Approvals in the local SQLite store, in the same file as the runs they belong to."""

from __future__ import annotations

from datetime import datetime

from ratchet.adapters.sqlite.database import APPROVALS_SCHEMA, SqliteDatabase
from ratchet.errors import ApprovalDecided, ApprovalExpired, ApprovalNotFound
from ratchet.sealing import PayloadCodec
from ratchet.state import RunStatus
from ratchet.stored import open_record_text, sealed_record_text
from ratchet.waits import Approval, ApprovalStatus, Verdict


class SqliteApprovalBook:
    def __init__(self, db: SqliteDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        # Seals each request's record: its question, the answer and comment a person gives.
        self._codec = codec
        # A store made before approvals existed gets the table on first use.
        exists = db.connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'approvals'"
        ).fetchone()
        if not exists:
            db.connection.executescript(APPROVALS_SCHEMA)

    def open(self, approval: Approval, *, task_token: str | None = None) -> Approval:
        with self._db.write() as tx:
            # Under the write lock: two workers seeing the same parked step open one request.
            row = tx.execute(
                "SELECT record FROM approvals WHERE run_id = ? AND step = ? AND status = ? "
                "ORDER BY expires_at DESC LIMIT 1",
                (approval.run_id, approval.step, ApprovalStatus.PENDING.value),
            ).fetchone()
            if row is not None:
                return self._approval(row[0])
            self._put(tx, approval)
        return approval

    def get(self, run_id: str, approval_id: str) -> Approval | None:
        row = self._db.connection.execute(
            "SELECT record FROM approvals WHERE approval_id = ? AND run_id = ?",
            (approval_id, run_id),
        ).fetchone()
        return self._approval(row[0]) if row else None

    def of_run(self, run_id: str) -> list[Approval]:
        rows = self._db.connection.execute(
            "SELECT record FROM approvals WHERE run_id = ?", (run_id,)
        ).fetchall()
        return sorted((self._approval(r[0]) for r in rows), key=lambda a: a.created_at)

    def pending(self) -> list[Approval]:
        """Every request still waiting for a decision, in every run, oldest first."""
        rows = self._db.connection.execute(
            "SELECT record FROM approvals WHERE status = ?", (ApprovalStatus.PENDING.value,)
        ).fetchall()
        return sorted((self._approval(r[0]) for r in rows), key=lambda a: a.created_at)

    def undelivered(self, *, decided_before: datetime) -> list[Approval]:
        """Requests a person approved or rejected before `decided_before` whose run still
        waits at their step: decided, and the decision never reached the run (its decider
        died in between). Read from the waiting runs, so it costs what they number."""
        rows = self._db.connection.execute(
            "SELECT a.record FROM runs AS r JOIN approvals AS a "
            "ON a.run_id = r.run_id AND a.step = r.step "
            "WHERE r.status = ? AND a.status IN (?, ?)",
            (
                RunStatus.WAITING.value,
                ApprovalStatus.APPROVED.value,
                ApprovalStatus.REJECTED.value,
            ),
        ).fetchall()
        found = (self._approval(r[0]) for r in rows)
        return sorted(
            (a for a in found if a.decided_at is not None and a.decided_at < decided_before),
            key=lambda a: a.created_at,
        )

    def settle(
        self, approval: Approval, verdict: Verdict, *, channel: str, at: datetime
    ) -> Approval:
        settled = approval.settled(verdict, channel=channel, at=at)
        with self._db.write() as tx:
            current = tx.execute(
                "SELECT record FROM approvals WHERE approval_id = ? AND run_id = ?",
                (approval.approval_id, approval.run_id),
            ).fetchone()
            if current is None:
                raise ApprovalNotFound("no such approval request")
            stored = self._approval(current[0])
            if stored.status.is_decided:
                raise ApprovalDecided(f"already {stored.status.value} by {stored.decided_by}")
            if stored.is_expired(at):
                raise ApprovalExpired("this request has expired")
            self._put(tx, settled)
        return settled

    def reopen(self, approval: Approval) -> None:
        reopened = approval.reopened()
        with self._db.write() as tx:
            # Only the decision being undone: a request closed meanwhile stays closed.
            current = tx.execute(
                "SELECT status FROM approvals WHERE approval_id = ? AND run_id = ?",
                (approval.approval_id, approval.run_id),
            ).fetchone()
            if current is not None and current[0] == approval.status.value:
                self._put(tx, reopened)

    def close(self, run_id: str, step: int, status: ApprovalStatus, *, at: datetime) -> None:
        with self._db.write() as tx:
            rows = tx.execute(
                "SELECT record FROM approvals WHERE run_id = ? AND step = ? AND status = ?",
                (run_id, step, ApprovalStatus.PENDING.value),
            ).fetchall()
            for (record,) in rows:
                closed = self._approval(record).model_copy(
                    update={"status": status, "decided_at": at}
                )
                self._put(tx, closed)

    def _approval(self, record: str) -> Approval:
        return Approval.model_validate_json(open_record_text(record, self._codec, part="approval"))

    def _put(self, tx: object, approval: Approval) -> None:
        tx.execute(  # type: ignore[attr-defined]
            "INSERT INTO approvals (approval_id, run_id, step, status, expires_at, record) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (approval_id) DO UPDATE SET "
            "status = excluded.status, record = excluded.record",
            (
                approval.approval_id,
                approval.run_id,
                approval.step,
                approval.status.value,
                approval.expires_at.isoformat(),
                sealed_record_text(
                    approval.model_dump_json(),
                    self._codec,
                    part="approval",
                    run_id=approval.run_id,
                ),
            ),
        )
