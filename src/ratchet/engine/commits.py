"""The engine's writes of a run. Every change is one event, folded into the new head
(`fold.apply_event`) and written with its checkpoint record in one commit, conditional on the
version read. A failed attempt is recorded with its cause and when the next may start; a run is
failed only once no call of it abandoned in this process still runs."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from ratchet.backoff import Backoff
from ratchet.engine.deadline import wait_for_abandoned
from ratchet.engine.failures import cut, describe, terminal_cause
from ratchet.engine.fold import apply_event
from ratchet.engine.outcome import StepOutcome
from ratchet.errors import (
    AbandonedCallRunning,
    InjectedFault,
    StaleVersion,
    StepAttemptFailed,
    is_terminal,
    is_transient,
)
from ratchet.ports import CheckpointStore, Commit, Consumption, LedgerCompletion
from ratchet.state import (
    MAX_ATTEMPTS,
    AttemptFailed,
    CheckpointEvent,
    Finished,
    RunState,
    RunStatus,
    StoredCheckpoint,
    utcnow,
)


class Commits:
    """Writes one engine's changes of runs, each as its worker's checkpoint, and logs each."""

    def __init__(
        self,
        *,
        store: CheckpointStore,
        worker_id: str,
        logger: logging.Logger | Any,
        backoff: Backoff,
        rng: random.Random,
        clock: Callable[[], datetime],
        abandoned_grace_seconds: float,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._log = logger
        self._backoff = backoff
        self._rng = rng
        self._clock = clock
        self._abandoned_grace = abandoned_grace_seconds

    def commit(
        self,
        state: RunState,
        event: CheckpointEvent,
        *,
        step: int,
        completes: LedgerCompletion | None = None,
        consumes: Consumption | None = None,
    ) -> tuple[RunState, int]:
        """Write the event's checkpoint and the new head; returns the head and bytes written."""
        checkpoint_at = utcnow()
        head = apply_event(state, event, version=state.version + 1, at=checkpoint_at)
        checkpoint = StoredCheckpoint(
            run_id=state.run_id,
            version=head.version,
            step=step,
            status=head.status,
            worker_id=self._worker_id,
            created_at=checkpoint_at,
            event=event,
        )
        receipt = self._store.commit(
            Commit(
                head=head,
                checkpoint=checkpoint,
                expected_version=state.version,
                completes=completes,
                consumes=consumes,
            )
        )
        self._log.info(
            "checkpoint written",
            extra={
                "run_id": state.run_id,
                "step": step,
                "version": head.version,
                "status": head.status.value,
                "event": event.kind,
                "worker_id": self._worker_id,
                "bytes": receipt.bytes_written,
                "ms": round(receipt.milliseconds, 3),
            },
        )
        return head, receipt.bytes_written

    def finish(self, state: RunState, event: Finished) -> StepOutcome:
        event = event.model_copy(update={"attempts": state.attempts})
        head, written = self.commit(state, event, step=state.step)
        return StepOutcome.of(head, bytes_written=written)

    def fail_run(self, state: RunState, event: Finished) -> StepOutcome:
        """Fail the run, once no call of it abandoned in this process still runs: a failed
        run must not change after it is failed. Raises `AbandonedCallRunning`, with nothing
        written, if one outlasts the grace."""
        if not wait_for_abandoned(state.run_id, time.monotonic() + self._abandoned_grace):
            raise AbandonedCallRunning(state.run_id, state.next_step, self._abandoned_grace)
        return self.finish(state, event)

    def record_failure(self, state: RunState, error: StepAttemptFailed) -> StepOutcome:
        """Record a failed attempt and raise it; or, if no retry can help (or this was the
        third attempt), fail the run and return the outcome."""
        step = state.next_step
        self._log.warning(
            "step attempt failed",
            extra={
                "run_id": state.run_id,
                "step": step,
                "attempt": state.attempts,
                "worker_id": self._worker_id,
                "error": str(error),
                "error_type": type(error).__name__,
                "transient": is_transient(error),
            },
        )
        # What the attempt's model call used before it failed counts, in the record either way.
        if is_terminal(error):
            cause = terminal_cause(error)
            message = f"step {step} failed and cannot succeed on retry: {describe(cause)}"
            failed_run = Finished(status=RunStatus.FAILED, error=cut(message), usage=error.usage)
            return self.fail_run(state, failed_run)
        if state.attempts >= MAX_ATTEMPTS:
            message = f"step {step} failed {state.attempts} times; last error: {error}"
            failed_run = Finished(status=RunStatus.FAILED, error=cut(message), usage=error.usage)
            return self.fail_run(state, failed_run)
        # The head says when the next attempt may start. A local worker waits until then; on
        # AWS the state machine's Retry (the same figures, its own draw) decides, and an
        # attempt that comes earlier is not refused.
        delay = self._backoff.delay(state.attempts, self._rng)
        not_before = self._clock() + timedelta(seconds=delay)
        error.step, error.attempt = step, state.attempts
        failed = AttemptFailed(
            step=step,
            attempt=state.attempts,
            error=cut(str(error)),
            not_before=not_before,
            usage=error.usage,
        )
        try:
            self.commit(state, failed, step=state.step)
            error.not_before = not_before
        except (StaleVersion, InjectedFault):
            raise
        except Exception as unrecorded:
            # The attempt stays counted (that write came first); only its reason is lost.
            self._log.warning(
                "could not record the failed attempt",
                extra={
                    "run_id": state.run_id,
                    "step": step,
                    "worker_id": self._worker_id,
                    "error": describe(unrecorded),
                },
            )
            if is_transient(unrecorded):
                error.transient = True
        raise error
