"""The runs API on the local runtime, mounted as `ratchet serve` mounts it: HTTP requests (a
WSGI test client, no socket) become API Gateway events for the same app the Lambda function
serves, over SQLite, with a worker doing the steps."""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client

from ratchet.agents import AgentRegistry
from ratchet.engine import Outcome
from ratchet.faults import FaultPlan
from ratchet.runs import MAX_BATCHES
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.services import local_runs_services
from ratchet.state import PersonDecided, RunStatus
from ratchet.untrusted import MAX_JSON_DEPTH
from ratchet.web.runs import build_app
from ratchet.web.serve import wsgi_app
from ratchet.worker import Worker
from tests.integration.test_at_most_once import _advance_until_stopped, _start

OPERATOR = "dana"
DEEP = "[" * 60_000 + "]" * 60_000
"""JSON nested 60,000 levels deep: `json.loads` recurses, and would end in a RecursionError."""
LOG = logging.getLogger("ratchet.tests.runs_api")
ROWS_AGENT = "tests.integration.aws.agents:rows"


@dataclass
class Served:
    runtime: LocalRuntime
    http: Client

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | str | None = None,
        *,
        content_type: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        data = body if isinstance(body, str) or body is None else json.dumps(body)
        response = self.http.open(path, method=method, data=data, content_type=content_type)
        assert response.mimetype == "application/json"
        return response.status_code, json.loads(response.get_data(as_text=True))

    def work(self) -> None:
        """One worker, until no run is runnable; it opens the approval of a run it parks,
        as `ratchet worker` does."""
        desk = self.runtime.approval_desk(worker_id="w1", logger=LOG)
        engine = self.runtime.engine(worker_id="w1", logger=LOG)

        def ask(run_id: str) -> None:
            desk.open(run_id, timeout_seconds=3600, operator=OPERATOR)

        Worker(engine, self.runtime.leases, LOG, poll_seconds=0, on_park=ask).run(until_idle=True)

    def rows(self) -> dict[str, list[Any]]:
        """Every row of the store, to show that a refusal changed nothing."""
        connection = self.runtime.db.connection
        tables = [
            name
            for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        return {t: connection.execute(f"SELECT * FROM {t}").fetchall() for t in tables}


@contextmanager
def _served(tmp_path: Path, agents: AgentRegistry | None = None) -> Iterator[Served]:
    settings = LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db")
    runtime = LocalRuntime.open(settings)
    services = local_runs_services(
        runtime, worker_id="serve:test", logger=LOG, agents=agents, operator=OPERATOR
    )
    # The line `ratchet serve` has for it:
    routes = [("/runs", build_app(lambda: services))]
    try:
        yield Served(runtime, Client(wsgi_app(routes)))
    finally:
        runtime.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with _served(tmp_path) as serving:
        yield serving


def test_a_run_started_through_the_api_is_worked_and_decided_through_it(served: Served):
    status, started = served.call(
        "POST", "/runs", {"scenario": "migration", "batches": 2, "run_id": "m1"}
    )
    assert (status, started) == (
        201,
        {"run_id": "m1", "status": "running", "step": 0, "execution_name": None, "created": True},
    )
    again = {"scenario": "migration", "batches": 2, "run_id": "m1"}
    assert served.call("POST", "/runs", again)[0] == 200
    status, conflict = served.call("POST", "/runs", {"scenario": "migration", "run_id": "m1"})
    assert status == 409
    assert [p["field"] for p in conflict["problems"]] == ["goal", "input"]

    served.work()
    status, run = served.call("GET", "/runs/m1")
    assert (status, run["status"], run["waiting"]["prompt"]) == (
        200,
        "waiting",
        "Drop legacy_orders. All 2 batches (2,000 rows) are copied into orders",
    )

    status, decided = served.call("POST", "/runs/m1/approve", {"comment": "fine"})
    assert (status, decided["by"], decided["decision"]) == (200, OPERATOR, "approved")
    served.work()

    status, run = served.call("GET", "/runs/m1")
    assert (run["status"], run["waiting"]) == ("done", None)
    assert "legacy_orders was dropped" in run["summary"]
    _, history = served.call("GET", "/runs/m1/history")
    assert "decided" in [row["event"] for row in history["checkpoints"]]
    decisions = [
        c.event
        for c in served.runtime.store.list_checkpoints("m1")
        if isinstance(c.event, PersonDecided)
    ]
    assert [(d.approved, d.by, d.comment) for d in decisions] == [(True, OPERATOR, "fine")]
    # The step's last checkpoint is the decision: the run as the next step found it.
    _, then = served.call("GET", f"/runs/m1/checkpoints/{decided['step']}")
    assert (then["step"], then["status"], then["waiting"]) == (decided["step"], "running", None)
    assert then["last_result"].startswith("Approved by dana")


def test_a_rejection_through_the_api_lets_the_run_go_on_without_the_drop(served: Served):
    served.call("POST", "/runs", {"scenario": "migration", "batches": 1, "run_id": "m2"})
    served.work()

    status, decided = served.call("POST", "/runs/m2/reject", {"reason": "audit first"})
    served.work()

    assert (status, decided["decision"]) == (200, "rejected")
    assert served.runtime.store.load_head("m2").status is RunStatus.DONE  # type: ignore[union-attr]
    assert "kept" in (served.runtime.store.load_head("m2").summary or "")  # type: ignore[union-attr]
    assert served.call("POST", "/runs/m2/reject", {})[0] == 409


def test_the_runs_are_listed_recent_first_and_by_status(served: Served):
    for run_id in ("a", "b", "c"):
        served.call("POST", "/runs", {"goal": "take notes", "run_id": run_id})
    served.call("POST", "/runs", {"scenario": "migration", "batches": 1, "run_id": "d"})
    served.work()

    _, listed = served.call("GET", "/runs")
    _, waiting = served.call("GET", "/runs?status=waiting")
    _, two = served.call("GET", "/runs?limit=2")

    assert len(listed["runs"]) == 4
    stamps = [r["updated_at"] for r in listed["runs"]]
    assert stamps == sorted(stamps, reverse=True)
    assert [r["run_id"] for r in waiting["runs"]] == ["d"]
    assert two["runs"] == listed["runs"][:2]
    assert {r["agent"] for r in listed["runs"]} == {"notebook", "migration"}
    assert listed["next"] is None
    _, rest = served.call("GET", f"/runs?limit=2&after={two['next']}")
    assert rest["runs"] == listed["runs"][2:]
    assert rest["next"] is None


@pytest.mark.parametrize("token", ["nonsense", "W10", "x" * 513])
def test_a_page_token_no_page_gave_is_refused_naming_after(served: Served, token: str):
    status, refused = served.call("GET", f"/runs?after={token}")
    assert (status, [p["field"] for p in refused["problems"]]) == (400, ["after"])


@pytest.fixture
def tripwire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    marker = tmp_path / "imported"
    (tmp_path / "ratchet_local_tripwire.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nagent = None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"agent": "ratchet_local_tripwire:agent"}, 400, "agent"),
        ({"scenario": "ratchet_local_tripwire:agent"}, 400, "scenario"),
        ({"scenario": "migration", "batches": MAX_BATCHES + 1}, 400, "batches"),
        ({"scenario": "migration", "model": "claude-sonnet-4-5"}, 400, "model"),
        (
            {"scenario": "migration", "notify": {"slack_channel": "#no spaces"}},
            400,
            "notify.slack_channel",
        ),
        ({"scenario": "migration", "concurrency_key": "acme corp"}, 400, "concurrency_key"),
        ({"scenario": "migration", "concurrency_key": "k" * 65}, 400, "concurrency_key"),
        ({"scenario": "migration", "concurrency_key": ""}, 400, "concurrency_key"),
        ({"scenario": "migration", "priority": 10}, 400, "priority"),
        ({"scenario": "migration", "priority": -1}, 400, "priority"),
        ("{", 400, "(body)"),
        # Nested deeper than json can recurse: refused before it is parsed, naming the field.
        ('{"scenario": "migration", "input": ' + DEEP + "}", 400, "input"),
        (DEEP, 400, "(body)"),
        # The same after a string holding an escaped quote, which does not end the string.
        (
            '{"scenario": "migration", "input": {"note": "\\"", "batches": ' + DEEP + "}}",
            400,
            "input",
        ),
    ],
)
def test_a_refused_start_changes_nothing_and_imports_nothing(
    served: Served, tripwire: Path, body: dict[str, Any] | str, status: int, field: str
):
    before = served.rows()

    answered, answer = served.call("POST", "/runs", body)

    assert answered == status
    assert [p["field"] for p in answer["problems"]] == [field]
    assert "ANTHROPIC_API_KEY" not in json.dumps(answer)
    assert not tripwire.exists()
    assert "ratchet_local_tripwire" not in sys.modules
    assert served.rows() == before


@pytest.mark.parametrize(
    ("path", "body", "content_type"),
    [
        ("/runs", "scenario=migration&run_id=page", "application/x-www-form-urlencoded"),
        ("/runs/m3/approve", "", "application/x-www-form-urlencoded"),
        ("/runs/m3/approve", "comment=sure", "application/x-www-form-urlencoded"),
        ("/runs/m3/approve", None, "text/plain"),
        ("/runs/m3/reject", None, ""),
    ],
)
def test_no_web_page_can_start_or_decide_a_run_on_localhost(
    served: Served, path: str, body: str | None, content_type: str
):
    # A page in the user's browser may send a form, a text/plain body or a bodiless POST to
    # 127.0.0.1 without CORS asking first; none of them claims to be JSON, so none is read.
    served.call("POST", "/runs", {"scenario": "migration", "batches": 1, "run_id": "m3"})
    served.work()
    before = served.rows()

    response = served.http.open(path, method="POST", data=body, content_type=content_type)

    assert response.status_code in (400, 415)
    assert served.rows() == before


def test_agents_registered_for_serve_can_be_started_by_name(tmp_path: Path):
    registry = AgentRegistry.deployment(json.dumps({"rows": ROWS_AGENT}))
    with _served(tmp_path, agents=registry) as served:
        status, _ = served.call("POST", "/runs", {"agent": "rows", "run_id": "r1"})
        served.work()
        head = served.runtime.store.load_head("r1")

    assert status == 201
    assert head is not None
    assert (head.agent, head.status) == (ROWS_AGENT, RunStatus.DONE)


def test_a_structured_question_is_answered_through_the_api(tmp_path: Path):
    registry = AgentRegistry.deployment(
        json.dumps({"refunds": "tests.fixtures.refund_agent:agent"})
    )
    with _served(tmp_path, agents=registry) as served:
        served.call("POST", "/runs", {"agent": "refunds", "run_id": "q1"})
        served.work()
        before = served.rows()
        # An approval without the answer the question asks for, or with one its schema
        # refuses, is a 400 naming the field, and changes nothing
        missing, refused = served.call("POST", "/runs/q1/approve", {"comment": "ok"})
        bad, too_much = served.call(
            "POST", "/runs/q1/approve", {"answer": {"amount": 600, "reason": "late"}}
        )
        after_refusals = served.rows()
        status, decided = served.call(
            "POST", "/runs/q1/approve", {"answer": {"amount": 120, "reason": "late"}}
        )
        served.work()
        head = served.runtime.store.load_head("q1")

    assert (missing, bad) == (400, 400)
    assert refused["problems"] == [
        {
            "field": "answer",
            "message": "this request needs an answer to approve "
            '(amount: a whole number from 1 to 500; reason: one of "damaged", "late")',
        }
    ]
    assert too_much == {
        "error": "invalid request body",
        "problems": [{"field": "answer.amount", "message": "must be at most 500"}],
    }
    assert after_refusals == before
    assert (status, decided["decision"]) == (200, "approved")
    assert head is not None
    assert head.status is RunStatus.DONE
    assert '{"amount": 120, "reason": "late"}' in (head.summary or "")


@pytest.mark.parametrize(
    ("answer", "field", "message"),
    [
        ({"ran": "maybe"}, "answer.ran", "must be true or false"),
        ({"ran": True, "result": 42}, "answer.result", "must be text"),
        ({"result": "ref 42"}, "answer.ran", "required (true or false)"),
        (
            {"ran": True, "by": "mallory"},
            "answer.by",
            "not a field of this answer (it has: ran, result)",
        ),
    ],
)
def test_an_answer_its_question_refuses_is_a_400_naming_the_answers_field(
    tmp_path: Path, answer: dict[str, Any], field: str, message: str
):
    # Given a run asking whether an at-most-once call ran: its step died after the call began
    _start(tmp_path)
    _advance_until_stopped(tmp_path, FaultPlan.parse("raise:after_call_started@1"))
    assert _advance_until_stopped(tmp_path, FaultPlan()) is Outcome.WAITING
    with _served(tmp_path) as served:
        desk = served.runtime.approval_desk(worker_id="w1", logger=LOG)
        desk.open("pay", timeout_seconds=3600, operator=OPERATOR)
        before = served.rows()

        status, refused = served.call("POST", "/runs/pay/approve", {"answer": answer})
        after_refusal = served.rows()
        status_then, _ = served.call("POST", "/runs/pay/approve", {"answer": {"ran": False}})

    assert (status, refused) == (
        400,
        {"error": "invalid request body", "problems": [{"field": field, "message": message}]},
    )
    assert after_refusal == before
    assert status_then == 200


def test_a_step_without_a_record_is_404_and_one_past_retention_is_410_naming_the_field(
    served: Served,
):
    served.call("POST", "/runs", {"scenario": "migration", "batches": 2, "run_id": "old"})
    served.work()

    assert _refused(served.call("GET", "/runs/old/checkpoints/99")) == (404, "step")
    assert _refused(served.call("GET", "/runs/old/steps/99/prompt")) == (404, "step")
    # The first records gone, as a TTL takes them on AWS: no earlier state can be rebuilt.
    served.runtime.db.connection.execute(
        "DELETE FROM checkpoints WHERE run_id = 'old' AND version = 1"
    )
    before = served.rows()

    answers = [
        served.call("GET", "/runs/old/checkpoints/2"),
        served.call("GET", "/runs/old/steps/2/prompt"),
        served.call("POST", "/runs/old/fork", {"from_step": 2, "run_id": "new"}),
    ]

    assert [_refused(a) for a in answers] == [(410, "step"), (410, "step"), (410, "from_step")]
    assert {a[1]["problems"][0]["message"] for a in answers} == {
        "the state as of this step can no longer be rebuilt",
        "the prompt can no longer be rebuilt",
    }
    assert served.rows() == before


def test_an_answer_nested_too_deep_is_refused_naming_it_and_decides_nothing(tmp_path: Path):
    with _served(tmp_path) as served:
        served.call("POST", "/runs", {"scenario": "migration", "batches": 1, "run_id": "m4"})
        served.work()
        before = served.rows()

        status, answer = served.call("POST", "/runs/m4/approve", '{"answer": ' + DEEP + "}")

        assert (status, answer["problems"]) == (
            400,
            [{"field": "answer", "message": f"nested more than {MAX_JSON_DEPTH} levels deep"}],
        )
        assert served.rows() == before


def _refused(answer: tuple[int, dict[str, Any]]) -> tuple[int, str]:
    status, body = answer
    return status, body["problems"][0]["field"]


def test_history_after_a_version_is_what_was_written_since(served: Served):
    served.call("POST", "/runs", {"scenario": "migration", "batches": 2, "run_id": "tail"})
    served.work()
    _, every = served.call("GET", "/runs/tail/history")
    versions = [c["version"] for c in every["checkpoints"]]

    status, since = served.call("GET", f"/runs/tail/history?after={versions[2]}")
    assert status == 200
    assert since["checkpoints"] == every["checkpoints"][3:]
    assert served.call("GET", f"/runs/tail/history?after={versions[-1]}")[1]["checkpoints"] == []
    assert _refused(served.call("GET", "/runs/tail/history?after=-1")) == (400, "after")


def test_a_fork_of_a_fork_from_before_its_fork_point_is_404_naming_from_step(served: Served):
    served.call("POST", "/runs", {"scenario": "migration", "batches": 2, "run_id": "src"})
    served.work()
    assert served.call("POST", "/runs/src/fork", {"from_step": 3, "run_id": "f1"})[0] == 201
    before = served.rows()

    answer = served.call("POST", "/runs/f1/fork", {"from_step": 1, "run_id": "f2"})

    assert _refused(answer) == (404, "from_step")
    assert served.rows() == before


def test_a_fork_the_agent_refuses_is_409_naming_from_step_with_its_reason(served: Served):
    served.call("POST", "/runs", {"scenario": "migration", "batches": 2, "run_id": "src"})
    served.work()
    state = served.runtime.store.load_head("src")
    assert state is not None
    # Data written by an older Ratchet does not say what its copies did
    app = sqlite3.connect(served.runtime.context("src", state.options).workdir / "app.db")
    with app:
        app.execute("DELETE FROM effects")
    app.close()
    before = served.rows()

    status, answer = served.call("POST", "/runs/src/fork", {"from_step": 3, "run_id": "f1"})

    assert (status, answer["error"]) == (409, "the agent refuses this fork")
    assert _refused((status, answer)) == (409, "from_step")
    assert "does not record what src/step-2 did" in answer["problems"][0]["message"]
    assert served.rows() == before


def test_runs_started_with_a_key_and_a_priority_say_them_and_are_listed_by_key(served: Served):
    for run_id, key, priority in [("a-1", "acme", 9), ("a-2", "acme", 0), ("g-1", "globex", 3)]:
        body = {"scenario": "migration", "run_id": run_id, "concurrency_key": key}
        status, started = served.call("POST", "/runs", {**body, "priority": priority})
        assert status == 201, started
    served.call("POST", "/runs", {"scenario": "migration", "run_id": "none"})

    status, run = served.call("GET", "/runs/a-1")
    assert (status, run["concurrency_key"], run["priority"]) == (200, "acme", 9)
    status, listed = served.call("GET", "/runs?key=acme")
    assert status == 200
    assert sorted((r["run_id"], r["concurrency_key"]) for r in listed["runs"]) == [
        ("a-1", "acme"),
        ("a-2", "acme"),
    ]
    status, first = served.call("GET", "/runs?key=acme&limit=1")
    status, rest = served.call("GET", f"/runs?key=acme&limit=1&after={first['next']}")
    assert {first["runs"][0]["run_id"], rest["runs"][0]["run_id"]} == {"a-1", "a-2"}
    assert rest["next"] is None

    status, refused = served.call("GET", "/runs?key=acme%20corp")
    assert (status, [p["field"] for p in refused["problems"]]) == (400, ["key"])
