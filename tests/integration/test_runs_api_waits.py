"""Events and wakes through the runs API on the local runtime, mounted as `ratchet serve`
mounts it (a WSGI test client over SQLite, a real worker doing the steps): an event sent
while the run waits is delivered (200), one sent before is queued (202), a retry answers the
same, and every refusal is JSON naming the field, quoting nothing sent, with nothing
written."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratchet.state import RunOptions, RunState, RunStatus
from ratchet.waits import MAX_MAILBOX_EVENTS
from ratchet.worker import Worker
from tests.integration.test_runs_api_local import OPERATOR, Served, _served
from tests.waits_agent import AGENT, agent

LOG = logging.getLogger("ratchet.tests.runs_api_waits")
PASSED = {"conclusion": "success", "url": "https://ci.example/1"}
SECRET = "hunter2-never-echoed"
"""Put in what is sent where a refusal could quote it: no answer may."""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with _served(tmp_path) as serving:
        yield serving


def start(served: Served, run_id: str = "w1", **params: object) -> str:
    state = RunState(run_id=run_id, agent=AGENT, goal=agent.goal, options=RunOptions(params=params))
    assert served.runtime.engine(worker_id="test", logger=LOG).start(state)
    return run_id


def work(served: Served) -> None:
    """A worker until no run is runnable, settling the waits due (as `ratchet worker`)."""
    engine = served.runtime.engine(worker_id="w1", logger=LOG)
    Worker(
        engine,
        served.runtime.leases,
        LOG,
        poll_seconds=0,
        settle_waits=served.runtime.wait_settler(engine),
    ).run(until_idle=True)


def send(served: Served, run_id: str, name: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    return served.call("POST", f"/runs/{run_id}/events/{name}", body)


def status_of(served: Served, run_id: str) -> dict[str, Any]:
    code, run = served.call("GET", f"/runs/{run_id}")
    assert code == 200
    return run


def test_an_event_sent_while_the_run_waits_is_delivered_once_and_the_run_finishes(served):
    run_id = start(served)
    work(served)
    before = served.rows()
    waiting = status_of(served, run_id)
    assert served.rows() == before, "a GET writes nothing"
    assert waiting["status"] == "waiting"
    assert waiting["wait"]["kind"] == "event"
    assert waiting["wait"]["name"] == "ci-finished"
    assert waiting["wait"]["until"] is not None
    assert waiting["wait"]["answer_schema"]["required"] == ["conclusion"]

    code, sent = send(served, run_id, "ci-finished", {"data": PASSED, "event_id": "gh-1"})
    again_code, again = send(served, run_id, "ci-finished", {"data": PASSED, "event_id": "gh-1"})

    assert (code, sent) == (
        200,
        {
            "run_id": run_id,
            "name": "ci-finished",
            "event_id": "gh-1",
            "status": "delivered",
            "step": 1,
            "duplicate": False,
            "refused": None,
        },
    )
    assert (again_code, again) == (200, {**sent, "duplicate": True})
    assert status_of(served, run_id)["wait"] is None
    work(served)
    done = status_of(served, run_id)
    assert done["status"] == "done"
    assert '"conclusion": "success"' in done["summary"]
    settled = [
        c for c in served.runtime.store.list_checkpoints(run_id) if c.event.kind == "settled"
    ]
    assert len(settled) == 1


def test_an_event_sent_before_the_wait_is_queued_then_taken_by_it(served):
    run_id = start(served)

    code, sent = send(served, run_id, "ci-finished", {"data": PASSED})

    assert code == 202
    assert (sent["status"], sent["step"], sent["duplicate"]) == ("queued", None, False)
    assert sent["event_id"].startswith("ev-")
    work(served)
    assert status_of(served, run_id)["status"] == "done"
    assert served.runtime.mailbox.get(run_id, sent["event_id"]).consumed_step == 1


def test_a_bodyless_event_is_a_null_payload(served):
    run_id = start(served)
    code, sent = send(served, run_id, "ci-finished")
    assert (code, sent["status"]) == (202, "queued")
    assert served.runtime.mailbox.get(run_id, sent["event_id"]).payload is None


def _finished(served: Served) -> str:
    run_id = start(served, "ended")
    served.runtime.engine(worker_id="test", logger=LOG).cancel(run_id, by="dana", reason="")
    return run_id


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/runs/nope/events/ci-finished", {"data": PASSED}, 404, "run_id"),
        ("/runs/ended/events/ci-finished", {"data": PASSED}, 409, "run_id"),
        ("/runs/w1/events/deploy-done", {"data": PASSED}, 404, "name"),
        ("/runs/w1/events/bad%20name", {"data": PASSED}, 400, "name"),
        ("/runs/w1/events/ci-finished", {"event_id": f"a {SECRET}"}, 400, "event_id"),
        ("/runs/w1/events/ci-finished", {"data": PASSED, "event_id": ""}, 400, "event_id"),
        ("/runs/w1/events/ci-finished", {"data": PASSED, "extra": SECRET}, 400, "extra"),
        ("/runs/w1/events/ci-finished", {"data": "x" * 300_000}, 413, "data"),
        ("/runs/w1/events/ci-finished", {"data": {"conclusion": SECRET}}, 422, "data.conclusion"),
        ("/runs/w1/events/ci-finished", {"data": {"url": SECRET}}, 422, "data"),
        ("/runs/w1/events/ci-finished", f'{{"data": "{SECRET}"', 400, "(body)"),
    ],
)
def test_a_refused_event_is_json_naming_the_field_and_writes_nothing(
    served: Served, path: str, body: Any, status: int, field: str
):
    start(served)
    work(served)
    _finished(served)
    before = served.rows()

    code, answer = served.call("POST", path, body)

    assert code == status, answer
    assert [p["field"] for p in answer["problems"]] == [field]
    assert SECRET not in json.dumps(answer)
    assert served.rows() == before


def test_an_event_with_no_json_content_type_is_refused_415(served):
    start(served)
    before = served.rows()
    response = served.http.open(
        "/runs/w1/events/ci-finished", method="POST", data="{}", content_type="text/plain"
    )
    assert response.status_code == 415
    assert served.rows() == before


def test_a_full_mailbox_is_429_naming_the_run_and_keeps_what_it_has(served):
    run_id = start(served)
    for index in range(MAX_MAILBOX_EVENTS):
        assert send(served, run_id, "ci-finished", {"event_id": f"e{index}"})[0] == 202
    before = served.rows()

    code, answer = send(served, run_id, "ci-finished", {"event_id": "one-more"})
    retry_code, retried = send(served, run_id, "ci-finished", {"event_id": "e0"})

    assert (code, [p["field"] for p in answer["problems"]]) == (429, ["run_id"])
    assert served.rows() == before
    assert (retry_code, retried["duplicate"]) == (202, True), "a retry of a kept one answers"


# --- waking ----------------------------------------------------------------------------------


def _sleeping(served: Served) -> str:
    run_id = start(served, nap=True)
    work(served)
    assert send(served, run_id, "ci-finished", {"data": PASSED})[0] == 200
    work(served)
    assert status_of(served, run_id)["wait"]["kind"] == "timer"
    return run_id


def test_a_sleeping_run_is_woken_through_the_api_in_the_callers_name(served):
    run_id = _sleeping(served)
    sleeping = status_of(served, run_id)
    assert sleeping["wait"]["until"] is not None
    assert sleeping["wait"]["name"] is None

    code, woken = served.call("POST", f"/runs/{run_id}/wake", {"by": "the deploy bot"})

    assert (code, woken["status"], woken["wait"]) == (200, "running", None)
    settled = served.runtime.store.list_checkpoints(run_id)[-1].event
    assert settled.kind == "settled"
    assert settled.by == f"the deploy bot (via {OPERATOR})"
    work(served)
    assert status_of(served, run_id)["status"] == RunStatus.DONE.value


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/runs/w1/wake", None, 409, "run_id"),  # it waits for an event, not a time
        ("/runs/nope/wake", None, 404, "run_id"),
        ("/runs/w1/wake", {"by": ""}, 400, "by"),
        ("/runs/w1/wake", {"by": "x" * 1000}, 400, "by"),
        ("/runs/w1/wake", {"who": SECRET}, 400, "who"),
    ],
)
def test_a_refused_wake_names_the_field_and_writes_nothing(
    served: Served, path: str, body: Any, status: int, field: str
):
    start(served)
    work(served)
    before = served.rows()

    code, answer = served.call("POST", path, body)

    assert code == status, answer
    assert [p["field"] for p in answer["problems"]] == [field]
    assert SECRET not in json.dumps(answer)
    assert served.rows() == before


def test_a_run_that_is_not_sleeping_any_more_cannot_be_woken_twice(served):
    run_id = _sleeping(served)
    assert served.call("POST", f"/runs/{run_id}/wake", None)[0] == 200
    before = served.rows()
    code, answer = served.call("POST", f"/runs/{run_id}/wake", None)
    assert (code, answer["problems"][0]["field"]) == (409, "run_id")
    assert served.rows() == before
