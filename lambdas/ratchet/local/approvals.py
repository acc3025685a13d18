"""Approvals on the local runtime: a decision is recorded by the engine, and the next free
worker picks the run up, as `ratchet approve` does."""

from __future__ import annotations

from ratchet.approvals.model import Approval, Verdict
from ratchet.engine.core import Engine
from ratchet.errors import ApprovalClosed, NotWaiting


class LocalResumer:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def resume(self, approval: Approval, verdict: Verdict) -> None:
        try:
            self._engine.decide_waiting(
                approval.run_id,
                approved=verdict.approved,
                by=verdict.by,
                comment=verdict.comment,
                step=approval.step,
            )
        except NotWaiting as stopped:
            raise ApprovalClosed(str(stopped)) from None
