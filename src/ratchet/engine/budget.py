"""Several steps in one go, within a budget: what one invocation of the step Lambda takes.

A state machine that invokes a function for every step pays a state transition or two per
step, most of a scripted run's bill. So one invocation takes steps one after another while the
run keeps running, up to a cap, and only while the time it has left would still hold another
step of the agent's longest (its step time limit, plus `STEP_MARGIN_SECONDS` for the engine's
own reads and writes): an agent with long steps gets fewer steps per invocation, down to one,
and no step is started that the invocation's timeout could cut short.

Nothing about a step changes: each one is `Engine.advance`, committed before the next begins,
so a crash costs the step it is in and no more. Each step counts its own attempt as it begins,
as in a local worker's loop: an invocation that dies between two steps leaves no strike on the
next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Read by the stack's tests from here, beside the budget it sizes.
from ratchet.engine.deadline import STEP_MARGIN_SECONDS as STEP_MARGIN_SECONDS
from ratchet.engine.outcome import Outcome, StepOutcome
from ratchet.engine.step import Engine
from ratchet.tools import MAX_STEP_TIMEOUT_SECONDS


@dataclass
class StepBudget:
    """How far one invocation may go: at most `max_steps` steps, and another one only while
    `seconds_left()` holds the agent's step time limit plus `margin_seconds`."""

    max_steps: int
    seconds_left: Callable[[], float]
    margin_seconds: float = STEP_MARGIN_SECONDS
    taken: int = 0
    """Steps taken so far (`take_steps` counts them)."""

    def goes_on(self, step_limit: float | None) -> bool:
        """Whether another step follows the one just taken: `taken` counts it, and
        `step_limit` is its agent's step time limit (None: no limit of its own, so the longest
        any agent may have)."""
        longest = MAX_STEP_TIMEOUT_SECONDS if step_limit is None else step_limit
        return self.taken < self.max_steps and self.seconds_left() >= longest + self.margin_seconds


def take_steps(
    engine: Engine,
    run_id: str,
    budget: StepBudget,
    on_step: Callable[[StepOutcome], None] | None = None,
) -> StepOutcome:
    """Advance the run step by step within `budget`; the last step's outcome. It stops at any
    outcome but `continue` (waiting, done, failed, queued, ...), at the cap, or when the time
    left would not hold another step; an error ends it as it ends one step (raised, every step
    before it committed). `on_step` is told of each step's outcome."""
    while True:
        outcome = engine.advance(run_id)
        budget.taken += 1
        if on_step is not None:
            on_step(outcome)
        if outcome.outcome is not Outcome.CONTINUE or not budget.goes_on(outcome.step_limit):
            return outcome
