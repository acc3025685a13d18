"""What a step of the engine returns: the run's outcome (continue, waiting, done, ...) with the
head the step left, for whoever drives the engine (a worker, the step Lambda) to act on."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ratchet.state import RunState, RunStatus


class Outcome(StrEnum):
    CONTINUE = "continue"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"
    QUEUED = "queued"
    """The run's agent had no free slot (`Agent.max_concurrent`), the deployment's model calls
    of the minute are used up, or the step's at-most-once call may still be running: nothing
    was done or written, no attempt used; the step is to be tried again a little later."""


_OUTCOME_OF_STATUS = {
    RunStatus.RUNNING: Outcome.CONTINUE,
    RunStatus.WAITING: Outcome.WAITING,
    RunStatus.DONE: Outcome.DONE,
    RunStatus.FAILED: Outcome.FAILED,
    RunStatus.STOPPED: Outcome.STOPPED,
    RunStatus.CANCELLED: Outcome.CANCELLED,
}


@dataclass(frozen=True)
class StepOutcome:
    outcome: Outcome
    run_id: str
    step: int
    version: int
    bytes_written: int = 0
    """What the step's checkpoint commit wrote (head, record, ledger); 0 if nothing was."""
    head: RunState | None = field(default=None, compare=False, repr=False)
    """The head the step left, as committed (what a reader of the store would load)."""
    retry_after: float | None = None
    """For a queued step held back by the model-call rate limit, or by an at-most-once call
    that may still be running: the seconds until it may go (None: as soon as a slot of its
    agent frees)."""
    why: str | None = None
    """For a queued step, what holds it back, when it is not a slot or the rate limit."""
    step_limit: float | None = None
    """For a step that committed a tool call: its agent's step time limit, which it ran under
    (None: none), so that a caller going straight on knows how long the next step may take
    (`ratchet.engine.budget`)."""

    @classmethod
    def queued(
        cls, state: RunState, *, retry_after: float | None = None, why: str | None = None
    ) -> StepOutcome:
        return cls(
            Outcome.QUEUED, state.run_id, state.step, state.version, 0, state, retry_after, why
        )

    @classmethod
    def of(
        cls, state: RunState, *, bytes_written: int = 0, step_limit: float | None = None
    ) -> StepOutcome:
        return cls(
            _OUTCOME_OF_STATUS[state.status],
            state.run_id,
            state.step,
            state.version,
            bytes_written,
            state,
            step_limit=step_limit,
        )
