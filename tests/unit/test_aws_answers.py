"""The answer's schema, both sides (`ratchet.adapters.stepfunctions`): what the approval
desk sends with SendTaskSuccess or SendTaskFailure, and the decision RecordDecision reads from
whatever arrived at `$.decision`, in the shape Step Functions delivers it (the output parsed; a
caught error as `{Error, Cause}`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ratchet.adapters.stepfunctions import (
    REJECTED_ERROR,
    UNNAMED,
    VerdictKind,
    task_failure,
    task_success_output,
    verdict_from_answer,
)
from ratchet.waits import MAX_BY_CHARS, MAX_COMMENT_CHARS, Verdict

TIMEOUT = 3600


def _read(kind: VerdictKind, answer: Any) -> tuple[bool, str, str]:
    verdict = verdict_from_answer(kind, answer, timeout_seconds=TIMEOUT)
    return verdict.approved, verdict.by, verdict.comment


@pytest.mark.parametrize(
    "verdict",
    [
        Verdict(approved=True, by="alice@example.test", comment="go ahead"),
        Verdict(approved=True, by="@dana"),
        Verdict(approved=True, by="x" * MAX_BY_CHARS, comment="é\n" * (MAX_COMMENT_CHARS // 2)),
    ],
)
def test_what_the_desk_sends_on_approval_reads_back_as_the_same_verdict(verdict: Verdict):
    arrived = json.loads(task_success_output(verdict))

    assert verdict_from_answer("approved", arrived, timeout_seconds=TIMEOUT) == verdict


@pytest.mark.parametrize(
    "verdict",
    [
        Verdict(approved=False, by="bob@example.test", comment="not before the audit"),
        Verdict(approved=False, by="@erin"),
        Verdict(approved=False, by="b", comment="r" * MAX_COMMENT_CHARS),
    ],
)
def test_what_the_desk_sends_on_rejection_reads_back_as_the_same_verdict(verdict: Verdict):
    error, cause = task_failure(verdict)

    assert error == REJECTED_ERROR
    assert len(cause) <= 32_768, "SendTaskFailure caps the cause"
    caught = {"Error": error, "Cause": cause}
    assert verdict_from_answer("rejected", caught, timeout_seconds=TIMEOUT) == verdict


def test_an_expiry_is_a_rejection_by_nobody_whatever_the_timeout_error_says():
    caught = {"Error": "States.Timeout", "Cause": "by: mallory"}

    assert _read("expired", caught) == (False, "nobody", f"approval expired after {TIMEOUT} s")
    assert _read("expired", None) == _read("expired", caught)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"by": "alice"}, (True, "alice", "")),
        ({"by": "alice", "comment": None}, (True, "alice", "")),
        ({"by": "", "comment": "fine"}, (True, UNNAMED, "fine")),
        ({"by": "   ", "comment": "fine"}, (True, UNNAMED, "fine")),
        ({"by": "  ann\n  lee "}, (True, "ann lee", "")),
        ({"by": 42}, (True, "42", "")),
        ({"by": ["alice"]}, (True, UNNAMED, "")),
        ({"by": None}, (True, UNNAMED, "")),
        ({}, (True, UNNAMED, "")),
        ({"comment": "ok", "extra": 1}, (True, UNNAMED, "ok")),
        ({"by": "a", "comment": {"why": "ok"}}, (True, "a", '{"why": "ok"}')),
        ({"by": "a", "comment": "x" * (MAX_COMMENT_CHARS + 1)}, (True, "a", "x" * 9_999 + "…")),
        ({"by": "a", "comment": "x" * MAX_COMMENT_CHARS}, (True, "a", "x" * MAX_COMMENT_CHARS)),
        ({"by": "b" * (MAX_BY_CHARS + 5)}, (True, "b" * MAX_BY_CHARS, "")),
        ([], (True, UNNAMED, "[]")),
        (["alice", "ok"], (True, UNNAMED, '["alice", "ok"]')),
        (42, (True, UNNAMED, "42")),
        (True, (True, UNNAMED, "true")),
        (None, (True, UNNAMED, "")),
        ('{"by": "carol", "comment": "as a string"}', (True, "carol", "as a string")),
        ("just words", (True, UNNAMED, "just words")),
        ("", (True, UNNAMED, "")),
    ],
    ids=repr,
)
def test_an_approval_of_any_shape_becomes_a_valid_verdict(
    answer: Any, expected: tuple[bool, str, str]
):
    assert _read("approved", answer) == expected


@pytest.mark.parametrize(
    ("caught", "expected"),
    [
        ({"Error": REJECTED_ERROR, "Cause": '{"by": "bob"}'}, (False, "bob", "")),
        ({"Error": REJECTED_ERROR, "Cause": '{"by": "bob", "reason": "no"}'}, (False, "bob", "no")),
        (
            {"Error": REJECTED_ERROR, "Cause": '{"by": "bob", "comment": "no"}'},
            (False, "bob", "no"),
        ),
        ({"Error": REJECTED_ERROR, "Cause": '{"reason": "no"}'}, (False, UNNAMED, "no")),
        ({"Error": REJECTED_ERROR, "Cause": '{"by": "", "reason": "no"}'}, (False, UNNAMED, "no")),
        ({"Error": REJECTED_ERROR, "Cause": "no, not today"}, (False, UNNAMED, "no, not today")),
        ({"Error": REJECTED_ERROR, "Cause": "[1, 2]"}, (False, UNNAMED, "[1, 2]")),
        ({"Error": REJECTED_ERROR, "Cause": "42"}, (False, UNNAMED, "42")),
        ({"Error": REJECTED_ERROR, "Cause": ""}, (False, UNNAMED, "")),
        ({"Error": REJECTED_ERROR}, (False, UNNAMED, "")),
        ({"Error": REJECTED_ERROR, "Cause": None}, (False, UNNAMED, "")),
        (
            {"Error": REJECTED_ERROR, "Cause": "y" * (MAX_COMMENT_CHARS + 1)},
            (False, UNNAMED, "y" * 9_999 + "…"),
        ),
        ("not an object", (False, UNNAMED, "")),
        (None, (False, UNNAMED, "")),
    ],
    ids=repr,
)
def test_a_rejection_of_any_shape_becomes_a_valid_verdict(
    caught: Any, expected: tuple[bool, str, str]
):
    assert _read("rejected", caught) == expected
