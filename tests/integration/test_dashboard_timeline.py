"""The run page's timeline of runs worked by a real engine on a real SQLite store: a row for
each attempt that failed or was abandoned, and none for the attempt every step counts before
its work starts, once that attempt committed (bookkeeping, not news)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel
from werkzeug.test import Client

from ratchet.engine import Outcome
from ratchet.errors import ToolFailed
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.services import local_runs_services
from ratchet.state import RunOptions, RunState, RunStatus
from ratchet.tools import Agent, Done, StepView, Tool, ToolCall, ToolContext
from ratchet.web.dashboard import local_app
from ratchet.web.serve import wsgi_app

LOG = logging.getLogger("ratchet.tests.dashboard_timeline")
STEPS = 3


class Note(BaseModel):
    text: str
    fail_first: bool = False


def note(args: Note, ctx: ToolContext) -> str:
    """Notes a fact; its first attempt fails where the call says so."""
    if args.fail_first and ctx.attempt == 1:
        raise ConnectionError("the notes service dropped the connection")
    return f"noted: {args.text}"


def three_notes(view: StepView) -> ToolCall | Done:
    """Three notes, the one at step `params.fail_at` failing its first attempt."""
    if view.step <= STEPS:
        fail = view.step == view.params.get("fail_at")
        return ToolCall(name="note", arguments={"text": f"fact {view.step}", "fail_first": fail})
    return Done(summary=f"noted {STEPS} facts")


agent = Agent(
    name="notes",
    tools=[Tool("note", "Note a fact.", Note, note)],
    goal="Note three facts",
    policy=three_notes,
)
AGENT = f"{__name__}:agent"


class Dashboard:
    def __init__(self, root: Path) -> None:
        self.runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{root}/ratchet.db"))
        runs = local_runs_services(self.runtime, worker_id="serve:test", logger=LOG)
        desk = self.runtime.approval_desk(worker_id="serve:test", logger=LOG)
        self.client = runs.client
        app = local_app(runs.client, desk, operator="dana")
        self.http = Client(wsgi_app([("/dashboard", app)]))
        self.engine = self.runtime.engine(worker_id="w1", logger=LOG)

    def run(self, run_id: str, **params: object) -> None:
        """Start the run and work it to its end, each failed attempt retried at once."""
        options = RunOptions(model="scripted", params=params)
        state = RunState(run_id=run_id, agent=AGENT, goal=agent.goal, options=options)
        assert self.engine.start(state)
        for _ in range(4 * STEPS):
            try:
                if self.engine.advance(run_id).outcome is not Outcome.CONTINUE:
                    break
            except ToolFailed:
                continue
        head = self.runtime.store.load_head(run_id)
        assert head is not None
        assert head.status is RunStatus.DONE

    def rows(self, run_id: str) -> list[str]:
        """The timeline's rows, as text, one a row."""
        response = self.http.get(f"/dashboard/runs/{run_id}")
        assert response.status_code == 200
        page = response.get_data(as_text=True)
        body = re.search(r"<table id='timeline'>.*?<tbody>(.*?)</tbody>", page)
        assert body is not None
        return [
            " ".join(re.sub(r"<[^>]+>", " ", row).split())
            for row in re.findall(r"<tr.*?</tr>", body[1])
        ]

    def unrecorded(self, run_id: str) -> list[int]:
        """The run's versions that wrote no checkpoint record (each counted an attempt)."""
        recorded = {c.version for c in self.client.history(run_id)}
        return [v for v in range(1, self.client.head(run_id).version + 1) if v not in recorded]


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Dashboard]:
    served = Dashboard(tmp_path)
    yield served
    served.runtime.close()


def test_a_run_with_no_failed_attempt_shows_no_attempt_rows(dashboard):
    # Given a run whose every step committed on its first attempt, each attempt counted first
    dashboard.run("calm")
    records = [c.version for c in dashboard.client.history("calm")]
    assert dashboard.unrecorded("calm") == [2, 4, 6, 8]

    # When its page is read
    rows = dashboard.rows("calm")

    # Then its timeline has a row per record, and none for the attempts counted
    assert [row.split()[0] for row in rows] == [str(v) for v in records]
    assert not [row for row in rows if "counted" in row]


def test_a_failed_attempt_and_its_retry_keep_their_rows(dashboard):
    # Given a run whose step 2 failed on its first attempt and committed on its second
    dashboard.run("bumpy", fail_at=2)
    assert dashboard.unrecorded("bumpy") == [2, 4, 6, 8, 10]

    # When its page is read
    rows = {row.split()[0]: row for row in dashboard.rows("bumpy")}

    # Then step 2's two attempts keep their rows: each counted, the first failed, the second
    # committed; the attempts counted for steps 1 and 3 and the run's end have none
    assert list(rows) == ["1", "3", "4", "5", "6", "7", "9", "11"]
    assert rows["4"].startswith("4 Attempt 1 at step 2 counted before its work started")
    assert rows["5"].startswith("5 1 attempt 1 at step 2 failed: note raised ConnectionError")
    assert rows["6"].startswith("6 Attempt 2 at step 2 counted before its work started")
    assert "2 (retried after 1 failed attempt)" in rows["7"]
