"""The dashboard of `ratchet serve` on a run that waits for an event or a time: what it waits
for, until when, the events its mailbox holds and how to settle it, escaped; never the banner
of a person's missing request; and reading the page writes nothing."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from werkzeug.test import Client

from ratchet.client import Run, Wait
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.services import local_runs_services
from ratchet.state import RunOptions, RunState, RunStatus
from ratchet.web.dashboard import Timeline, local_app, run_page
from ratchet.web.serve import wsgi_app
from ratchet.worker import Worker
from tests.waits_agent import AGENT, agent

LOG = logging.getLogger("ratchet.tests.dashboard_waits")
PASSED = {"conclusion": "success"}
EVIL = "<script>alert('x')</script>"


class Dashboard:
    def __init__(self, root: Path) -> None:
        self.runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{root}/ratchet.db"))
        runs = local_runs_services(self.runtime, worker_id="serve:test", logger=LOG)
        desk = self.runtime.approval_desk(worker_id="serve:test", logger=LOG)
        app = local_app(runs.client, desk, operator="dana", mailbox=self.runtime.mailbox)
        self.http = Client(wsgi_app([("/dashboard", app)]))
        self.engine = self.runtime.engine(worker_id="test", logger=LOG)
        self.desk = self.runtime.event_desk(self.engine)

    def start(self, run_id: str, **params: object) -> None:
        options = RunOptions(params=params)
        assert self.engine.start(
            RunState(run_id=run_id, agent=AGENT, goal=agent.goal, options=options)
        )

    def work(self) -> None:
        Worker(
            self.engine,
            self.runtime.leases,
            LOG,
            poll_seconds=0,
            settle_waits=self.runtime.wait_settler(self.engine),
        ).run(until_idle=True)

    def page(self, run_id: str) -> str:
        response = self.http.get(f"/dashboard/runs/{run_id}")
        assert response.status_code == 200
        return str(response.get_data(as_text=True))

    def rows(self) -> dict[str, list[object]]:
        db = self.runtime.db.connection
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: db.execute(f'SELECT * FROM "{n}"').fetchall() for n in names}


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Dashboard]:
    served = Dashboard(tmp_path)
    yield served
    served.runtime.close()


def _banner(page: str) -> str:
    found = re.search(r"<div class='banner info' id='waiting'.*?</div>", page)
    assert found is not None, page
    return found.group(0)


def test_a_sleeping_run_shows_until_when_the_events_its_mailbox_holds_and_how_to_wake_it(
    dashboard,
):
    dashboard.start("w1", nap=True)
    dashboard.work()
    first = dashboard.desk.send("w1", "ci-finished", PASSED, event_id="first")
    dashboard.desk.send("w1", "ci-finished", PASSED, event_id="second")  # queued: no wait
    assert first.status == "delivered"
    dashboard.work()  # now it sleeps, "second" still in the mailbox
    head = dashboard.runtime.store.load_head("w1")
    assert head is not None
    assert head.waiting is not None
    before = dashboard.rows()

    banner = _banner(dashboard.page("w1"))

    assert dashboard.rows() == before
    assert "data-kind='timer'" in banner
    assert f"until <b>{head.waiting.due:%Y-%m-%d %H:%M:%S} UTC</b>" in banner
    assert "<p id='mailbox'>1 event in its mailbox not taken by a wait yet.</p>" in banner
    assert "<code>ratchet wake w1</code>" in banner


def test_an_event_wait_shows_the_event_until_when_and_how_to_send_it(dashboard):
    dashboard.start("w1")
    dashboard.work()
    head = dashboard.runtime.store.load_head("w1")
    assert head is not None
    assert head.waiting is not None

    before = dashboard.rows()

    page = dashboard.page("w1")
    banner = _banner(page)

    assert dashboard.rows() == before, "reading the page writes nothing"
    assert "data-kind='event'" in banner
    assert "Step 1 waits for the event <b>ci-finished</b> until " in banner
    assert f"<b>{head.waiting.due:%Y-%m-%d %H:%M:%S} UTC</b>" in banner
    assert "0 events in its mailbox" in banner
    assert "<code>ratchet send w1 ci-finished --data JSON</code>" in banner
    assert "<code>POST /runs/w1/events/ci-finished</code>" in banner
    assert "waits for a person" not in page, "an event wait has no approval request to open"
    assert "Open the approval page" not in page


def test_what_a_wait_shows_is_escaped():
    state = RunState(run_id="r1", agent="a", goal="g", status=RunStatus.WAITING)
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    wait = Wait(
        kind="event",
        step=3,
        since=at,
        prompt=EVIL,
        name=EVIL,
        until=None,
        answer_schema=None,
    )
    run = Run.of(state).model_copy(update={"run_id": f"r1{EVIL}", "wait": wait})
    timeline = Timeline(run=run, checkpoints=[], attempts={}, gaps=[], approvals=[], pending=None)

    banner = _banner(run_page(timeline))

    assert "<script" not in banner
    assert "&lt;script&gt;" in banner
    assert "with no timeout" in banner
    assert "id='mailbox'" not in banner, "not counted: nothing said"


def test_the_runs_page_reads_the_runs_in_one_query_and_no_step_record(dashboard):
    for number in range(12):
        dashboard.start(f"run-{number:02d}")
    statements: list[str] = []
    dashboard.runtime.db.connection.set_trace_callback(statements.append)
    try:
        page = dashboard.http.get("/dashboard").get_data(as_text=True)
    finally:
        dashboard.runtime.db.connection.set_trace_callback(None)

    reads = [s for s in statements if re.search(r"\bFROM runs\b", s)]
    assert len(reads) == 1, statements
    assert not [s for s in statements if "checkpoints" in s], statements
    assert page.count(f"<td>{AGENT}</td>") == 12
