"""The marks of wakes owed, on the items that keep the parked executions' tokens (moto): a waker
marks a wait item before it settles; keeping a token never drops a mark; the answer drops the
mark with its token; a decision marks its approval item in the write that settles it; the
sweep lists only the marks older than its cutoff and clears only the mark it read."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from ratchet.adapters.dynamodb.approvals import AwsApprovals
from ratchet.adapters.dynamodb.waits import AwsWaitTokens
from ratchet.adapters.dynamodb.wakes import AwsOwedWakes
from ratchet.state import utcnow
from ratchet.waits import Approval, Verdict
from tests.dynamodb_support import SETTINGS, moto_tables

TABLE = SETTINGS.checkpoints_table


@pytest.fixture
def client() -> Iterator[Any]:
    with moto_tables() as client:
        yield client


def _owed(client: Any, *, older_than: timedelta = timedelta(0)) -> list[tuple[str, str, str]]:
    marks = AwsOwedWakes(client, TABLE).older_than(utcnow() - older_than, limit=100)
    return [(m.run_id, m.sk, m.how) for m in marks]


def test_a_token_kept_after_the_mark_keeps_it_and_the_answer_drops_both(client):
    tokens = AwsWaitTokens(client, TABLE)
    now = utcnow()

    # A waker marks the wait before the execution has kept its token (open_wait is slower).
    tokens.owe("run-1", 3, "event", at=now)
    tokens.keep("run-1", 3, "token-1", at=now)

    looked = tokens.look("run-1", 3)
    assert (looked.token, looked.owed) == ("token-1", True)
    assert _owed(client, older_than=timedelta(seconds=-1)) == [
        ("run-1", "WAIT#0000000003", "event")
    ]

    tokens.forget("run-1", 3, "token-1")  # answered

    looked = tokens.look("run-1", 3)
    assert (looked.token, looked.owed) == (None, False)
    assert _owed(client, older_than=timedelta(seconds=-1)) == []


def test_a_park_dropped_drops_its_mark_and_a_mark_without_a_token_clears(client):
    tokens = AwsWaitTokens(client, TABLE)
    now = utcnow()
    tokens.keep("run-1", 3, "token-1", at=now)
    tokens.owe("run-1", 3, "children", at=now)
    tokens.owe("run-2", 5, "event", at=now)

    tokens.drop("run-1", 3)  # the park timed out, or the run was cancelled
    tokens.clear_owed("run-2", 5)  # no token to answer: nothing parked there

    assert _owed(client, older_than=timedelta(seconds=-1)) == []


def test_the_sweep_reads_marks_older_than_its_cutoff_and_clears_only_the_one_it_read(client):
    tokens = AwsWaitTokens(client, TABLE)
    marks = AwsOwedWakes(client, TABLE)
    old, young = utcnow() - timedelta(minutes=5), utcnow()
    tokens.owe("run-old", 1, "event", at=old)
    tokens.owe("run-young", 1, "event", at=young)

    (listed,) = marks.older_than(utcnow() - timedelta(minutes=1), limit=100)
    assert listed.run_id == "run-old"

    # A waker marks the item again meanwhile: that mark is its own, and stays.
    tokens.owe("run-old", 1, "event", at=young)
    assert marks.clear(listed) is False
    assert sorted(m[0] for m in _owed(client, older_than=timedelta(seconds=-1))) == [
        "run-old",
        "run-young",
    ]
    (again,) = [
        m
        for m in marks.older_than(utcnow() + timedelta(seconds=1), limit=9)
        if m.run_id == "run-old"
    ]
    assert marks.clear(again) is True
    assert [m[0] for m in _owed(client, older_than=timedelta(seconds=-1))] == ["run-young"]


def _approval(approval_id: str = "a" * 22) -> Approval:
    now = utcnow()
    return Approval(
        approval_id=approval_id,
        run_id="run-1",
        step=2,
        created_at=now,
        expires_at=now + timedelta(hours=1),
    )


def test_a_decision_marks_its_wake_in_the_write_that_settles_it(client):
    book = AwsApprovals(client, TABLE)
    opened = book.open(_approval(), task_token="token-1")

    settled = book.settle(opened, Verdict(approved=True, by="dana"), channel="link", at=utcnow())

    assert _owed(client, older_than=timedelta(seconds=-1)) == [
        ("run-1", f"APPROVAL#{opened.approval_id}", "decided")
    ]
    book.forget_token("run-1", settled.approval_id)  # answered
    assert _owed(client, older_than=timedelta(seconds=-1)) == []


def test_a_decision_undone_owes_nothing(client):
    book = AwsApprovals(client, TABLE)
    opened = book.open(_approval(), task_token="token-1")
    settled = book.settle(opened, Verdict(approved=False, by="dana"), channel="api", at=utcnow())

    book.reopen(settled)  # not delivered for now: the person may try again

    assert _owed(client, older_than=timedelta(seconds=-1)) == []
    assert book.has_token("run-1", opened.approval_id)
