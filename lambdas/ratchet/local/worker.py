"""`ratchet worker`: claim runnable runs, advance them step by step, survive anything.

A worker holds an expiring lease on the run it works on and renews it as it goes. If it dies
(SIGKILL, a lost machine) the lease lapses and any other worker resumes the run from its last
checkpoint. Waiting, done and failed runs are never claimed: a parked run costs nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ratchet.engine.core import Engine, Outcome
from ratchet.errors import StaleVersion, StepAttemptFailed
from ratchet.local.leases import Leases

DEFAULT_LEASE_SECONDS = 30.0
POLL_SECONDS = 0.1


@dataclass
class Worker:
    engine: Engine
    leases: Leases
    logger: Any
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    poll_seconds: float = POLL_SECONDS
    stop: threading.Event = field(default_factory=threading.Event)
    sleep: Callable[[float], None] = time.sleep
    on_park: Callable[[str], None] | None = None
    """Called with the run id when a step of this worker parks a run for a person."""

    @property
    def worker_id(self) -> str:
        return self.engine.worker_id

    def run(self, *, until_idle: bool = False, run_id: str | None = None) -> None:
        """Work until stopped; with `until_idle`, until no run (or `run_id`) is running."""
        while not self.stop.is_set():
            claimed = self.leases.claim(self.worker_id, self.lease_seconds, run_id=run_id)
            if claimed is None:
                if until_idle and not self.leases.running_runs(run_id):
                    return
                self.stop.wait(self.poll_seconds)
                continue
            self._work_on(claimed)

    def _work_on(self, run_id: str) -> None:
        self.logger.info("run claimed", extra={"run_id": run_id, "worker_id": self.worker_id})
        renew_at = time.monotonic() + self.lease_seconds / 2
        try:
            while not self.stop.is_set():
                if time.monotonic() >= renew_at:
                    if not self.leases.renew(run_id, self.worker_id, self.lease_seconds):
                        self.logger.warning(
                            "lease lost", extra={"run_id": run_id, "worker_id": self.worker_id}
                        )
                        return
                    renew_at = time.monotonic() + self.lease_seconds / 2
                if not self._step(run_id):
                    return
        finally:
            self.engine.release(run_id)
            self.leases.release(run_id, self.worker_id)

    def _step(self, run_id: str) -> bool:
        """One step; True if the worker should go on with this run."""
        try:
            outcome = self.engine.advance(run_id, count_next_attempt=True)
        except StaleVersion as stale:
            # Another worker advanced the run under us (our lease had lapsed): it owns the run
            # now and our write changed nothing. Let go.
            self.logger.warning(
                "stale write rejected",
                extra={"run_id": run_id, "worker_id": self.worker_id, "error": str(stale)},
            )
            return False
        except StepAttemptFailed:
            # Recorded and counted by the engine; the next attempt (or the third strike) is
            # the next advance.
            self.sleep(min(self.poll_seconds, 0.05))
            return True
        except Exception:
            # An unexpected crash in a step (a bug, a lost disk, an injected fault) counts like
            # a killed process: the attempt is already on record, the next advance retries.
            self.logger.exception(
                "step crashed", extra={"run_id": run_id, "worker_id": self.worker_id}
            )
            self.sleep(min(self.poll_seconds, 0.05))
            return True
        if outcome.outcome is Outcome.WAITING and outcome.bytes_written and self.on_park:
            try:
                self.on_park(run_id)
            except Exception:
                # The run is parked and durable; `ratchet link RUN` can ask again later.
                self.logger.exception(
                    "could not open the approval request",
                    extra={"run_id": run_id, "worker_id": self.worker_id},
                )
        if outcome.outcome is not Outcome.CONTINUE:
            self.logger.info(
                "run left",
                extra={
                    "run_id": run_id,
                    "worker_id": self.worker_id,
                    "outcome": outcome.outcome.value,
                    "step": outcome.step,
                },
            )
            return False
        return True
