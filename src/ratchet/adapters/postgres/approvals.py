"""Approvals in a Postgres store, beside the runs they belong to (`ratchet.ports.ApprovalBook`,
as the local SQLite store keeps them: a parked step has one pending request, whoever opens it).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.errors import ApprovalDecided, ApprovalExpired, ApprovalNotFound
from ratchet.sealing import PayloadCodec
from ratchet.state import RunStatus
from ratchet.stored import open_record_text, sealed_record_text
from ratchet.waits import Approval, ApprovalStatus, Verdict

if TYPE_CHECKING:
    import psycopg


class PostgresApprovalBook:
    def __init__(self, db: PostgresDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        # Seals each request's record: its question, the answer and comment a person gives.
        self._codec = codec

    def open(self, approval: Approval, *, task_token: str | None = None) -> Approval:
        with self._db.write() as tx:
            # Opens for one run take turns (a lock on the run's requests, to the end of the
            # transaction): two workers, or `ratchet link` twice, seeing the same parked step
            # open one request, the second finding the first's.
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"ratchet:approvals:{approval.run_id}",),
            )
            row = tx.execute(
                "SELECT record FROM approvals WHERE run_id = %s AND step = %s AND status = %s "
                "ORDER BY expires_at DESC LIMIT 1",
                (approval.run_id, approval.step, ApprovalStatus.PENDING.value),
            ).fetchone()
            if row is not None:
                return self._approval(row[0])
            self._put(tx, approval)
        return approval

    def get(self, run_id: str, approval_id: str) -> Approval | None:
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT record FROM approvals WHERE approval_id = %s AND run_id = %s",
                (approval_id, run_id),
            ).fetchone()
        return self._approval(row[0]) if row else None

    def of_run(self, run_id: str) -> list[Approval]:
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT record FROM approvals WHERE run_id = %s", (run_id,)
            ).fetchall()
        return sorted((self._approval(r[0]) for r in rows), key=lambda a: a.created_at)

    def pending(self) -> list[Approval]:
        """Every request still waiting for a decision, in every run, oldest first."""
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT record FROM approvals WHERE status = %s", (ApprovalStatus.PENDING.value,)
            ).fetchall()
        return sorted((self._approval(r[0]) for r in rows), key=lambda a: a.created_at)

    def undelivered(self, *, decided_before: datetime) -> list[Approval]:
        """Requests a person approved or rejected before `decided_before` whose run still
        waits at their step: decided, and the decision never reached the run."""
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT a.record FROM runs AS r JOIN approvals AS a "
                "ON a.run_id = r.run_id AND a.step = r.step "
                "WHERE r.status = %s AND a.status IN (%s, %s)",
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
            # Read locked: of two deciders, the second's read waits for the first's commit and
            # finds the request decided; one decision stands, and the second is told whose.
            current = tx.execute(
                "SELECT record FROM approvals WHERE approval_id = %s AND run_id = %s FOR UPDATE",
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
                "SELECT status FROM approvals WHERE approval_id = %s AND run_id = %s FOR UPDATE",
                (approval.approval_id, approval.run_id),
            ).fetchone()
            if current is not None and current[0] == approval.status.value:
                self._put(tx, reopened)

    def close(self, run_id: str, step: int, status: ApprovalStatus, *, at: datetime) -> None:
        with self._db.write() as tx:
            rows = tx.execute(
                "SELECT record FROM approvals WHERE run_id = %s AND step = %s AND status = %s "
                "FOR UPDATE",
                (run_id, step, ApprovalStatus.PENDING.value),
            ).fetchall()
            for (record,) in rows:
                closed = self._approval(record).model_copy(
                    update={"status": status, "decided_at": at}
                )
                self._put(tx, closed)

    def _approval(self, record: str) -> Approval:
        return Approval.model_validate_json(open_record_text(record, self._codec, part="approval"))

    def _put(self, tx: psycopg.Connection[Any], approval: Approval) -> None:
        tx.execute(
            "INSERT INTO approvals (approval_id, run_id, step, status, expires_at, record) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (approval_id) DO UPDATE SET "
            "status = excluded.status, record = excluded.record",
            (
                approval.approval_id,
                approval.run_id,
                approval.step,
                approval.status.value,
                approval.expires_at,
                sealed_record_text(
                    approval.model_dump_json(),
                    self._codec,
                    part="approval",
                    run_id=approval.run_id,
                ),
            ),
        )
