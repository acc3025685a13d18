"""`ratchet.testing` in a project's own pytest: an agent run to its end in process on a fake clock
(a week's sleep takes no time), one crash injected, the sweep's report, and the direct test of a
key (`assert_idempotent`). The agent is tests/check_agent.py; its world is `shop.db` and
`emails.txt` in the working directory."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ratchet.faults import STEP_POINTS
from ratchet.testing import Crash, CrashKind, assert_idempotent, check, run_agent
from tests.check_agent import (
    AGENT,
    ORDER,
    REFUND,
    SUMMARY,
    effects,
    refund_ignoring_key,
    refund_on_key,
    setup,
)

WEEK_SECONDS = 7 * 24 * 3600
EFFECTS, SETUP = "tests.check_agent:effects", "tests.check_agent:setup"


def test_a_weeks_sleep_takes_no_time_on_the_fake_clock(tmp_path):
    started = time.perf_counter()
    ran = run_agent(AGENT, tmp_path, params={"nap": WEEK_SECONDS}, effects=EFFECTS, setup=SETUP)
    took = time.perf_counter() - started

    print(f"a run that sleeps a week ran in {took:.2f} s")
    assert ran.outcome.status == "done"
    assert ran.outcome.summary == SUMMARY
    assert [w["kind"] for w in ran.waits] == ["timer"]
    assert [s.tool for s in ran.outcome.steps] == ["nap", "look_up_order", "refund_once"]
    assert ran.outcome.effects == {"payments": {"count": 1, "total": REFUND}, "emails": []}
    assert took < 30


@pytest.mark.parametrize("kind", ["raise", "kill"])
def test_one_crash_after_a_naive_tool_ran_doubles_its_effect(tmp_path, kind):
    ran = run_agent(
        AGENT,
        tmp_path,
        params={"refund": "refund_naive"},
        crash=f"{kind}:after_tool@2",
        effects=EFFECTS,
        setup=SETUP,
    )

    assert ran.reached
    assert ran.outcome.status == "done"
    assert ran.outcome.effects == {"payments": {"count": 2, "total": 2 * REFUND}, "emails": []}


def test_a_tool_that_says_already_done_the_second_time_is_no_double_effect(tmp_path):
    # Given a refund applied once per key, whose second call says "already refunded"
    # (the refund's own step crashed at each of its points, by either kind)
    crashes = [Crash(step=2, point=point, kind=kind) for point in STEP_POINTS for kind in CrashKind]
    report = check(
        AGENT,
        params={"refund": "refund_saying_so"},
        crashes=crashes,
        processes=2,
        effects=EFFECTS,
        setup=SETUP,
    )

    # Then no schedule differs from the baseline: the words are noted, not counted
    assert report.ok, report.differences
    assert report.ran == report.planned == len(crashes)
    assert all(v.reached for v in report.verdicts)
    noted = [n for v in report.verdicts for n in v.notes]
    assert noted
    assert all("result reads otherwise" in n and "already refunded" in n for n in noted)
    assert {(v.crash.step, str(v.crash.point)) for v in report.verdicts if v.notes} == {
        (2, "after_tool"),
        (2, "before_commit"),
    }
    assert [(k.tool, k.ok) for k in report.key_tests] == [("refund_saying_so", True)]


def test_the_direct_test_of_a_key_flags_a_tool_that_ignores_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    setup()
    args = {"order_id": ORDER, "amount": REFUND}

    with pytest.raises(AssertionError, match=r"not idempotent under its key.*payments.count 2"):
        assert_idempotent(refund_ignoring_key, args, effects=effects, key="r1/step-2")
    setup()
    said = assert_idempotent(refund_on_key, args, effects=effects, key="r1/step-2")

    assert said == (f"Refunded {REFUND} on order {ORDER}.", "Refund r1/step-2 was made already.")
    assert effects()["payments"] == {"count": 1, "total": REFUND}


def test_the_checks_own_key_test_flags_the_tool_that_ignores_its_key(tmp_path):
    flagged = check(
        AGENT,
        params={"refund": "refund_ignoring_key"},
        crashes=[],
        processes=1,
        workdir=tmp_path,
        effects=EFFECTS,
        setup=SETUP,
    )
    kept = check(
        AGENT,
        params={"refund": "refund_on_key"},
        crashes=[],
        processes=1,
        workdir=tmp_path,
        effects=EFFECTS,
        setup=SETUP,
    )

    assert [(k.step, k.tool, k.ok) for k in flagged.key_tests] == [
        (2, "refund_ignoring_key", False)
    ]
    assert flagged.differences == [
        "step 2, key checked/step-2: `refund_ignoring_key` is not idempotent under its key: "
        "called again with the same key and arguments, it changed the world "
        "(effects.payments.count 2 ≠ 1; effects.payments.total 60 ≠ 30)"
    ]
    assert [(k.step, k.tool, k.ok) for k in kept.key_tests] == [(2, "refund_on_key", True)]
    assert kept.ok
    assert list(Path(tmp_path).iterdir()) == []  # the scratch folders are gone


def test_a_budget_stops_the_sweep_and_says_how_far_it_got():
    report = check(AGENT, budget=0.01, processes=1, effects=EFFECTS, setup=SETUP)

    assert report.budget_reached
    assert report.ran < report.planned
    assert report.ran == len(report.verdicts)


def test_child_runs_are_worked_in_process_each_by_its_own_agents_policy(tmp_path):
    # Given a parent that starts two children, each of which asks a person first
    params = {"children": 2, "ask": True}
    ran = run_agent("tests.children_agent:parent", tmp_path, params=params)

    assert ran.outcome.status == "done"
    assert (ran.outcome.summary or "").startswith("All 2 child runs ended: 2 done.")
    assert [(w["step"], w["kind"]) for w in ran.waits] == [(1, "children")]

    # And the crashes between starting the children and settling the wait for them
    crashes = [
        Crash(step=1, point=point, kind=kind)
        for point in ("after_children_started", "after_wait_settled")
        for kind in CrashKind
    ]
    report = check("tests.children_agent:parent", params=params, crashes=crashes, processes=2)
    assert report.ok, report.differences
    assert [v.reached for v in report.verdicts] == [True] * len(crashes)
