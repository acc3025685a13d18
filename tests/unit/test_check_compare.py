"""How `ratchet check` tells a crash schedule's end from the baseline's (`ratchet.testing`'s
comparison, pure): a decision asked of the model again is paid twice, but for the one a crash
at `after_model` lost; words that read otherwise are notes, the world is what differs."""

from __future__ import annotations

from typing import Any

import pytest

from ratchet.testing import Crash, Outcome
from ratchet.testing.outcome import StepTaken, compare


def outcome(**changed: Any) -> Outcome:
    fields: dict[str, Any] = {
        "status": "done",
        "summary": "refunded",
        "error": None,
        "steps": [
            StepTaken(step=1, tool="refund", arguments={"amount": 30}, result="refunded 30"),
        ],
        "data": {"refunds/r/step-1": "30"},
        "verified": None,
        "effects": {"payments": 1},
        "model_calls": {1: 1, 2: 1},
        "asked_whether_ran": [],
    }
    return Outcome(**{**fields, **changed})


def crash(point: str, step: int = 1) -> Crash:
    return Crash(step=step, point=point, kind="kill")


@pytest.mark.parametrize(
    ("point", "paid_twice"), [("after_model", False), ("after_decision", True)]
)
def test_a_decision_asked_again_is_paid_twice_unless_the_crash_lost_its_answer(point, paid_twice):
    verdict = compare(
        outcome(),
        outcome(model_calls={1: 2, 2: 1}),
        crash(point),
        reached=True,
        side_effects={"refund"},
    )

    assert (verdict.differences != []) is paid_twice
    if paid_twice:
        assert verdict.differences == [
            "step 1 asked the model 2 times, not 1: a recorded decision was asked again "
            "(paid twice)"
        ]


def test_a_doubled_effect_names_the_tool_the_crashed_step_ran():
    verdict = compare(
        outcome(),
        outcome(effects={"payments": 2}),
        crash("after_tool"),
        reached=True,
        side_effects={"refund"},
    )

    assert verdict.differences == ["`refund` applied twice (effects differ: payments 2 ≠ 1)"]


def test_already_done_words_are_notes_and_the_summary_that_echoes_them_too():
    verdict = compare(
        outcome(),
        outcome(
            summary="already refunded",
            steps=[StepTaken(step=1, tool="refund", arguments={"amount": 30}, result="already")],
        ),
        crash("after_tool"),
        reached=True,
        side_effects={"refund"},
    )

    assert verdict.ok
    assert verdict.notes == [
        "step 1's result reads otherwise: 'already' ≠ 'refunded 30'",
        "the summary differs: 'already refunded' ≠ 'refunded'",
    ]


def test_a_summary_that_differs_with_every_result_alike_is_a_difference():
    verdict = compare(
        outcome(),
        outcome(summary="refund failed"),
        crash("after_commit"),
        reached=True,
        side_effects={"refund"},
    )

    assert verdict.differences == ["the summary differs: 'refund failed' ≠ 'refunded'"]
