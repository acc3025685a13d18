"""How far one invocation of the step function goes (`ratchet.engine.budget.StepBudget`)."""

from __future__ import annotations

import pytest

from ratchet.engine.budget import STEP_MARGIN_SECONDS, StepBudget
from ratchet.tools import MAX_STEP_TIMEOUT_SECONDS


def _budget(seconds_left: float, *, max_steps: int = 100, taken: int = 0) -> StepBudget:
    return StepBudget(max_steps=max_steps, seconds_left=lambda: seconds_left, taken=taken)


@pytest.mark.parametrize(
    ("seconds_left", "step_limit", "goes_on"),
    [
        (120 + STEP_MARGIN_SECONDS, 120.0, True),
        (120 + STEP_MARGIN_SECONDS - 0.001, 120.0, False),
        (0.5 + STEP_MARGIN_SECONDS, 0.5, True),
        # No limit of its own: the longest any agent may have, which one 900 s invocation
        # holds once.
        (MAX_STEP_TIMEOUT_SECONDS + STEP_MARGIN_SECONDS, None, True),
        (MAX_STEP_TIMEOUT_SECONDS + STEP_MARGIN_SECONDS - 1, None, False),
    ],
)
def test_another_step_follows_only_while_the_time_left_holds_the_step_limit_and_the_margin(
    seconds_left: float, step_limit: float | None, goes_on: bool
):
    budget = _budget(seconds_left)

    assert budget.goes_on(step_limit) is goes_on


@pytest.mark.parametrize(
    ("max_steps", "taken", "goes_on"), [(1, 1, False), (10, 9, True), (10, 10, False)]
)
def test_the_step_that_reaches_the_cap_is_the_last(max_steps: int, taken: int, goes_on: bool):
    assert _budget(900.0, max_steps=max_steps, taken=taken).goes_on(1.0) is goes_on
