"""Structured answers and approval timeouts through the real `ratchet` process (issue 10,
"Richer answers"): `approve --answer` is checked as the page checks a form, and
`--approval-timeout` sets how long the run's request stays open."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import datetime, timedelta

from tests.e2e.test_cli_contract import _run_until_waiting, assert_rejected, fresh, snapshot
from tests.fixtures import refund_agent
from tests.processes import clean_env


def test_approve_takes_an_answer_the_question_accepts(tmp_path):
    # Given a run of the refund agent waiting for how much to refund
    cli = fresh(tmp_path)
    shutil.copy(refund_agent.__file__, tmp_path / "refunds.py")
    cli.ok("run", "--agent", "refunds:agent", "--run-id", "r1")
    assert cli.json("status", "r1")["status"] == "waiting"
    before = snapshot(tmp_path / "store")

    # When approved without an answer, with a bad one, or with one that is not JSON
    # Then each is refused in one line naming what is wrong, and nothing changes
    assert_rejected(cli("approve", "r1"), "needs an answer to approve", "amount")
    assert_rejected(
        cli("approve", "r1", "--answer", '{"amount": 900, "reason": "late"}'),
        "amount: must be at most 500, not 900",
    )
    assert_rejected(cli("approve", "r1", "--answer", "{amount: 9}"), "--answer is not JSON")
    assert snapshot(tmp_path / "store") == before

    # When approved with a good answer
    cli.ok("approve", "r1", "--answer", '{"amount": 120, "reason": "damaged"}', "--by", "dana")

    # Then the run goes on with the answer as the asking step's result
    cli.ok("run", "--run-id", "r1")
    status = cli.json("status", "r1")
    assert status["status"] == "done"
    assert status["summary"] == (
        'refund decided: Approved by dana: {"amount": 120, "reason": "damaged"}'
    )


def test_a_rejection_needs_no_answer_and_a_yes_or_no_question_takes_none(tmp_path):
    cli = fresh(tmp_path)
    shutil.copy(refund_agent.__file__, tmp_path / "refunds.py")
    cli.ok("run", "--agent", "refunds:agent", "--run-id", "r1")
    _run_until_waiting(cli, "r2")

    cli.ok("reject", "r1", "--reason", "not ours", "--by", "dana")
    assert_rejected(
        cli("approve", "r2", "--answer", '{"amount": 1}'), "asks for a yes or no, not an answer"
    )

    cli.ok("run", "--run-id", "r1")
    assert cli.json("status", "r1")["summary"] == "refund decided: Rejected by dana: not ours"
    assert cli.json("status", "r2")["status"] == "waiting"


def test_approval_timeout_sets_how_long_the_request_stays_open(tmp_path):
    cli = fresh(tmp_path)
    shutil.copy(refund_agent.__file__, tmp_path / "refunds.py")

    out = cli.ok(
        "run", "--agent", "refunds:agent", "--run-id", "r1", "--approval-timeout", "90", "--json"
    )

    link = json.loads(out.splitlines()[-1])["approval_link"]
    expires = int(link.split("exp=")[1].split("&")[0])
    opened = datetime.now().timestamp()
    assert abs(expires - (opened + 90)) < timedelta(seconds=30).total_seconds()
    assert_rejected(
        cli("start", "--agent", "refunds:agent", "--approval-timeout", "0"), "--approval-timeout"
    )


QUICK_CLI = [sys.executable, "-c", "import sys; from ratchet.cli.quick import main; main()"]
"""The console script `ratchet` (its write path answers `approve`), in a process of its own."""


def test_approve_without_an_answer_says_how_to_give_it_on_both_paths(tmp_path):
    # Given a run waiting for how much to refund
    cli = fresh(tmp_path)
    shutil.copy(refund_agent.__file__, tmp_path / "refunds.py")
    cli.ok("run", "--agent", "refunds:agent", "--run-id", "r1")

    # When approved without an answer, through the full CLI and through the console script
    full = cli("approve", "r1")
    quick = subprocess.run(
        [*QUICK_CLI, "--store", str(cli.db), "approve", "r1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )

    # Then each says what the answer holds and how to give it, in the same line
    for done in (full, quick):
        assert_rejected(done)
        assert done.stderr == (
            "ratchet: this request needs an answer to approve (amount: a whole number from 1 "
            'to 500; reason: one of "damaged", "late"): give it as '
            """--answer '{"amount": N, "reason": "damaged"}'\n"""
        )
