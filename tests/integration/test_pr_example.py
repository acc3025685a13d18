"""The pull-request example (examples/pr_agent), end to end offline on the local runtime: CI
fails (an event), the agent sleeps and re-runs it, CI passes, a person approves, it merges
once. The commands a reader types are driven in tests/e2e/test_pr_example_cli.py."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions, RunState, RunStatus, WaitSettled, utcnow
from ratchet.waits import Verdict
from ratchet.worker import Worker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pr_agent" / "src"
LOG = logging.getLogger("ratchet.tests.pr_example")


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    sys.path.insert(0, str(EXAMPLE))
    opened = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/s.db"))
    yield opened
    opened.close()
    sys.path.remove(str(EXAMPLE))


def test_the_pr_agent_waits_for_ci_sleeps_retries_asks_and_merges_once(
    runtime: LocalRuntime,
) -> None:
    from pr_agent.agent import agent

    clock = Clock(utcnow())
    engine = runtime.engine(worker_id="worker", logger=LOG)
    params = agent.params_for({"branch": "fix-login"})
    state = RunState(
        run_id="pr-1",
        agent="pr_agent.agent:agent",
        goal=agent.goal_for(params),
        options=RunOptions(model="scripted", params=params),
    )
    assert engine.start(state)
    desk = runtime.event_desk(engine)

    def work() -> RunState:
        Worker(
            engine, runtime.leases, LOG, clock=clock, settle_waits=runtime.wait_settler(engine)
        ).run(until_idle=True, run_id="pr-1")
        head = runtime.store.load_head("pr-1")
        assert head is not None
        return head

    head = work()
    assert head.waiting is not None
    assert head.waiting.kind == "event"
    assert desk.send("pr-1", "ci-finished", {"conclusion": "failure"}, event_id="ci-1").status == (
        "delivered"
    )
    head = work()
    assert head.waiting is not None
    assert head.waiting.kind == "timer"
    clock.now = utcnow() + timedelta(seconds=61)
    head = work()
    assert head.waiting is not None
    assert head.waiting.kind == "event"  # CI re-run, waiting again
    desk.send("pr-1", "ci-finished", {"conclusion": "success", "url": "https://ci/2"})
    head = work()
    assert head.waiting is not None
    assert head.waiting.kind == "person"
    runtime.decide(
        "pr-1", Verdict(approved=True, by="dana"), channel="cli", worker_id="cli", logger=LOG
    )
    head = work()
    assert head.status is RunStatus.DONE, head.error
    assert head.summary == "Merged pull request #101."
    settled = [
        c.event.how
        for c in runtime.store.list_checkpoints("pr-1")
        if isinstance(c.event, WaitSettled)
    ]
    assert settled == ["event", "due", "event"]
    data = dict(runtime.db.connection.execute("SELECT key, value FROM run_data").fetchall())
    assert [k for k in data if k.startswith("merges/")] == ["merges/pr-1/step-7"]
    assert len([k for k in data if k.startswith("pulls/")]) == 1


def test_the_pr_agent_run_by_the_testing_kit_merges_once_after_every_crash_of_its_merge(
    runtime: LocalRuntime, tmp_path: Path
) -> None:
    # The same story told by `ratchet.testing`, as a project's own test would: the waits
    # answered by a script on a fake clock, the merge's step crashed after the merge ran
    from ratchet.testing import WaitScript, run_agent

    script = WaitScript.of(
        approvals=[{"prompt": "Merge it?", "comment": "ship it"}],
        events={"ci-finished": [{"conclusion": "failure"}, {"conclusion": "success"}]},
    )
    for kind in ("raise", "kill"):
        ran = run_agent(
            "pr_agent.agent:agent",
            tmp_path / kind,
            params={"branch": "fix-login"},
            script=script,
            crash=f"{kind}:after_tool@7",
        )

        assert ran.reached
        assert ran.outcome.status == "done"
        # The merge called again under its key merges nothing, and says so
        assert ran.outcome.summary == "Pull request #101 was merged already."
        assert [w["kind"] for w in ran.waits] == ["event", "timer", "event", "person"]
        assert [key for key in ran.outcome.data if key.startswith("merges/")] == [
            "merges/checked/step-7"
        ]
