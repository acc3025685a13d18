"""Child runs on a local store, worked in this process: a parent that starts 10 children and
waits for all of them ends done with 10 results; a failing child is reported as failed;
`wait="first"` goes on at the first end, `wait="none"` at once; a step retried after the
children were started (before its commit) starts none twice; cancelling the parent cancels
the children it waits for, one waiting for a person among them; a child created after its
parent's cancel looked for the step's children ends cancelled at its first step, without
working, and the step creates no more; a spec no run can start from fails the parent at once
with nothing started, and so does a fan-out over the bound; two parents whose long ids share
their start each start and wait for children of their own."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from pathlib import Path

import pytest

from ratchet.children import children_ended
from ratchet.client import Client
from ratchet.errors import InjectedFault, StaleVersion
from ratchet.faults import FaultPlan
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import (
    MAX_CHILD_DEPTH,
    RUN_ID_PATTERN,
    ChildrenWait,
    RunOptions,
    RunState,
    RunStatus,
    WaitSettled,
    child_run_id,
)
from ratchet.waits import ApprovalStatus
from tests.children_agent import CHILD, PARENT, parent

LOG = logging.getLogger("ratchet.tests.children")


@pytest.fixture
def client(tmp_path):
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db"))
    client = Client(runtime, worker_id="test", logger=LOG)
    yield client
    client.close()


def _settled(client: Client, run_id: str) -> WaitSettled:
    (settled,) = [
        c.event
        for c in client.runtime.store.list_checkpoints(run_id)
        if isinstance(c.event, WaitSettled)
    ]
    return settled


def _worked(log: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in log.read_text().splitlines())


def test_a_parent_waiting_for_ten_children_ends_done_with_ten_results(client, tmp_path):
    log = tmp_path / "work.log"
    run = client.run(run_id="p", agent=PARENT, input={"children": 10, "log": str(log)})

    assert run.status is RunStatus.DONE
    children = [child_run_id("p", 1, i) for i in range(10)]
    settled = _settled(client, "p")
    assert settled.how == "children"
    assert settled.children is not None
    assert [o.run_id for o in settled.children] == children
    assert [o.status for o in settled.children] == [RunStatus.DONE] * 10
    assert [o.summary for o in settled.children] == [f"child {i} done" for i in range(10)]
    assert run.summary is not None
    assert run.summary.startswith("All 10 child runs ended: 10 done.")
    assert _worked(log) == dict.fromkeys(children, 1)
    assert {client.get(c).parent for c in children} == {"p"}


def test_a_failing_child_is_reported_as_failed(client):
    run = client.run(run_id="p", agent=PARENT, input={"children": 3, "failing": [1]})

    assert run.status is RunStatus.DONE
    outcomes = _settled(client, "p").children
    assert outcomes is not None
    assert [o.status for o in outcomes] == [RunStatus.DONE, RunStatus.FAILED, RunStatus.DONE]
    assert outcomes[1].error is not None
    assert "child 1 cannot do it" in outcomes[1].error
    assert run.summary is not None
    assert "All 3 child runs ended: 2 done, 1 failed." in run.summary
    assert "p.step-1.1 (tests.children_agent:child) failed" in run.summary


def test_wait_first_goes_on_at_the_first_end_and_lists_the_rest_as_running(client):
    run = client.run(run_id="p", agent=PARENT, input={"children": 3, "wait": "first"})

    assert run.status is RunStatus.DONE
    outcomes = _settled(client, "p").children
    assert outcomes is not None
    assert [o.status for o in outcomes] == [RunStatus.DONE, RunStatus.RUNNING, RunStatus.RUNNING]
    assert run.summary is not None
    assert "2 still running" in run.summary


def test_wait_none_goes_straight_on_and_names_the_children(client):
    run = client.run(run_id="p", agent=PARENT, input={"children": 2, "wait": "none"})

    assert run.status is RunStatus.DONE
    assert run.summary == (
        "Started 2 child runs (tests.children_agent:child); not waiting. "
        "Their ids: p.step-1.0, p.step-1.1."
    )
    assert [client.get(c).status for c in ("p.step-1.0", "p.step-1.1")] == [RunStatus.RUNNING] * 2


def test_a_step_retried_after_its_children_started_starts_none_twice(client, tmp_path):
    log = tmp_path / "work.log"
    client.start(run_id="p", agent=PARENT, input={"children": 4, "log": str(log)})
    faults = FaultPlan.parse("raise:after_children_started@1")
    crashing = client.runtime.engine(worker_id="crasher", logger=LOG, faults=faults)
    with pytest.raises(InjectedFault):
        crashing.advance("p")
    children = [child_run_id("p", 1, i) for i in range(4)]
    created = {c: client.runtime.store.load_head(c) for c in children}
    assert all(head is not None and head.version == 1 for head in created.values())

    run = client.work("p")

    assert run.status is RunStatus.DONE
    assert _worked(log) == dict.fromkeys(children, 1)
    for child in children:  # each child's first checkpoint is the one the first try wrote
        (first, *_) = client.runtime.store.list_checkpoints(child)
        assert first.worker_id == "crasher"
        assert first.version == 1


LONG_PARENTS = ("x" * 110 + "-parent-one", "x" * 110 + "-parent-two")
"""Two run ids of 121 characters sharing their first 118: their children's ids would run over
128 characters, so each keeps its start and ends in a hash of the whole."""


def test_children_of_parents_whose_long_ids_share_their_start_have_ids_of_their_own():
    first, second = ([child_run_id(p, 1, i) for i in range(3)] for p in LONG_PARENTS)

    assert set(first).isdisjoint(second)
    assert len(set(first)) == 3
    assert all(RUN_ID_PATTERN.fullmatch(child) for child in first + second)
    assert first == [child_run_id(LONG_PARENTS[0], 1, i) for i in range(3)]  # derived, again


def test_parents_whose_long_ids_share_their_start_each_wait_for_a_child_of_their_own(
    client, tmp_path
):
    # Given the same request from both: a child id they shared would be taken for one child
    log = tmp_path / "work.log"
    runs = [
        client.run(run_id=p, agent=PARENT, input={"children": 1, "log": str(log)})
        for p in LONG_PARENTS
    ]

    waited = [[o.run_id for o in _settled(client, p).children or []] for p in LONG_PARENTS]
    assert [r.status for r in runs] == [RunStatus.DONE] * 2
    assert waited == [[child_run_id(p, 1, 0)] for p in LONG_PARENTS]
    (first,), (second,) = waited
    assert first != second
    assert [client.get(c).parent for c in (first, second)] == list(LONG_PARENTS)
    assert _worked(log) == {first: 1, second: 1}


def test_cancelling_the_parent_cancels_its_children_one_waiting_for_a_person_too(client):
    client.start(run_id="p", agent=PARENT, input={"children": 2, "ask": True})
    client.work("p")  # the children park for a person, so the parent waits
    assert client.get("p").status is RunStatus.WAITING
    children = ["p.step-1.0", "p.step-1.1"]
    assert [client.get(c).status for c in children] == [RunStatus.WAITING] * 2
    desk = client.runtime.approval_desk(worker_id="test", logger=LOG)
    for child in children:  # as `ratchet worker` asks when a run parks for a person
        desk.open(child, timeout_seconds=3600)

    client.cancel("p", by="dana", reason="not needed")

    assert client.get("p").status is RunStatus.CANCELLED
    for child in children:
        cancelled = client.get(child)
        assert cancelled.status is RunStatus.CANCELLED
        assert cancelled.summary == "Cancelled by dana: its parent run p was cancelled"
        assert [a.status for a in client.runtime.approvals.of_run(child)] == [ApprovalStatus.CLOSED]


def test_a_child_created_after_its_parents_cancel_looked_for_it_ends_at_its_first_step(
    client, tmp_path
):
    # Given a fan-out step that read its parent (still running) before creating its first
    # child, and a cancel of the parent that lands right then, before the child exists: the
    # cancel finds none of the step's children, and the child is created after it
    log = tmp_path / "work.log"
    client.start(run_id="p", agent=PARENT, input={"children": 2, "log": str(log)})
    engine = client.runtime.engine(worker_id="w1", logger=LOG)
    desk = client.runtime.child_runs(engine, worker_id="w1", logger=LOG)

    def cancel_then_create(state: RunState) -> None:
        if client.get("p").status is RunStatus.RUNNING:
            client.cancel("p", by="dana")
        desk.create(state)

    engine.attach_children(dataclasses.replace(desk, create=cancel_then_create))

    # When the step goes on, and the child is worked
    with pytest.raises(StaleVersion):  # the step ends as its commit would have
        engine.advance("p")
    first, second = child_run_id("p", 1, 0), child_run_id("p", 1, 1)
    assert client.get(first).status is RunStatus.RUNNING  # created after the cancel's look
    assert client.runtime.store.load_head(second) is None  # the step created no more
    run = client.work(first)

    # Then the child ends cancelled at its first step, its tool never called
    assert run.status is RunStatus.CANCELLED
    assert run.step == 0
    assert run.summary == "Cancelled by test: its parent run p was cancelled"
    assert not log.exists()


def test_a_child_cancelled_alone_is_reported_to_its_parent_as_cancelled(client):
    client.start(run_id="p", agent=PARENT, input={"children": 1, "ask": True})
    client.work("p")

    client.cancel("p.step-1.0", by="dana")

    assert client.get("p").status is RunStatus.RUNNING
    outcomes = _settled(client, "p").children
    assert outcomes is not None
    assert [o.status for o in outcomes] == [RunStatus.CANCELLED]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"agent": "no_such.module:agent"}, "start_runs: run 1: "),
        ({"agent": CHILD, "input": {"i": "many"}}, "start_runs: run 1: bad input for agent"),
        ({"agent": CHILD, "max_steps": 0}, "start_runs: run 1: max_steps"),
    ],
)
def test_a_spec_no_run_starts_from_fails_the_parent_at_once_and_starts_nothing(client, spec, said):
    specs = [{"agent": CHILD, "input": {"i": 0}}, spec]
    run = client.run(run_id="p", agent=PARENT, input={"specs": specs})

    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert said in run.error
    assert client.runtime.store.load_head("p.step-1.0") is None  # checked before any start


def test_a_fan_out_over_the_bound_fails_the_parent_with_nothing_started(client):
    run = client.run(run_id="p", agent=PARENT, input={"children": 101})

    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "start_runs: start 1 to 100 runs at a step, not 101" in run.error
    assert [r.run_id for r in client.runs()] == ["p"]


def test_runs_nest_at_most_five_deep(client):
    engine = client.runtime.engine(worker_id="test", logger=LOG)
    options = RunOptions(params=parent.default_params)
    deep = RunState(run_id="deep", agent=PARENT, goal="g", options=options, depth=MAX_CHILD_DEPTH)
    assert engine.start(deep)

    run = client.work("deep")

    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "is 5 runs deep, and runs nest at most 5 deep" in run.error


def test_the_settled_text_is_bounded_and_every_outcome_is_kept():
    children = [f"p.step-1.{i}" for i in range(100)]
    heads = [
        RunState(run_id=c, agent="a", goal="g", status=RunStatus.DONE, summary="x" * 5000)
        for c in children
    ]
    settled = children_ended(ChildrenWait(children=children), 1, list(heads))

    assert len(settled.text) <= 4000
    assert settled.text.endswith("more (the step's record has each).")
    assert settled.children is not None
    assert len(settled.children) == 100
    assert all(o.summary is not None and len(o.summary) == 1000 for o in settled.children)


def test_the_dashboard_shows_a_runs_parent_and_its_children(client):
    from werkzeug.test import Client as Http

    from ratchet.web.dashboard import local_app
    from ratchet.web.serve import wsgi_app

    client.run(run_id="p", agent=PARENT, input={"children": 2, "failing": [1]})
    runtime = client.runtime
    desk = runtime.approval_desk(worker_id="serve:test", logger=LOG)
    http = Http(wsgi_app([("/dashboard", local_app(client, desk, operator="dana"))]))

    parent_page = http.get("/dashboard/runs/p").get_data(as_text=True)
    child_page = http.get("/dashboard/runs/p.step-1.1").get_data(as_text=True)

    table = parent_page.split("<table id='children'>", 1)[1].split("</table>", 1)[0]
    assert table.count("<tr><td><a href='/dashboard/runs/p.step-1.") == 2
    assert "<span class='status s-done'>done</span>" in table
    assert "child 1 cannot do it" in table
    assert "<a id='parent' href='/dashboard/runs/p'>p</a>" in child_page
    assert [c.run_id for c in client.children("p")] == ["p.step-1.0", "p.step-1.1"]


def test_the_fan_out_bench_measures_a_parent_of_ten_children(tmp_path):
    from bench.fan_out import fan_out

    measured = fan_out(10, tmp_path)

    assert measured.all_done
    assert measured.worked_twice == 0
    assert 0 < measured.to_resumption <= measured.to_end
