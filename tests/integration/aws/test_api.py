"""The runs API on the deployed shape (moto, the state machine executing): starting is
idempotent, reading answers the documented shapes, deciding resumes the execution, and every
refusal is a JSON 4xx that names the field, quotes nothing and changes nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ratchet.adapters.stepfunctions import execution_name
from ratchet.runs import MAX_BATCHES, MAX_STEPS, MAX_TOOL_LATENCY_MS
from ratchet.state import PersonDecided, RunStatus
from ratchet.web.runs import MAX_BODY_CHARS
from tests.integration.aws import agents
from tests.integration.aws.harness import AGENTS, APP_TABLE, FakeContext, Stack, api_event

ROWS = "rows"
"""Registered by the deployment (`RATCHET_AGENTS`) as `tests.integration.aws.agents:rows`."""
MIGRATION = {"scenario": "migration", "batches": 3}
CALLER = "arn:aws:sts::123456789012:assumed-role/release-bot/build-42"
"""Who signs the requests: API Gateway's IAM authorizer puts it in the request context."""


def call(
    method: str,
    path: str,
    body: dict[str, Any] | str | None = None,
    *,
    query: dict[str, str] | None = None,
    caller: str | None = CALLER,
) -> tuple[int, dict[str, Any]]:
    from ratchet.handlers import api

    event = api_event(method, path, body, query={k: [v] for k, v in (query or {}).items()} or None)
    if caller is not None:
        event["requestContext"]["identity"].update(userArn=caller, caller="AROAEXAMPLE:build-42")
    response = api.handler(event, FakeContext("ratchet-api", "arn:ratchet-api"))
    headers = {**response.get("headers", {}), **response.get("multiValueHeaders", {})}
    assert headers["Content-Type"] in ("application/json", ["application/json"])
    return response["statusCode"], json.loads(response["body"])


def _runs(stack: Stack) -> list[str]:
    return [summary.run_id for summary in _store(stack).list_runs()]


def _store(stack: Stack) -> Any:
    from ratchet.handlers import _wiring

    return _wiring.runtime().store


# --- starting ------------------------------------------------------------------------------------


def test_a_duplicate_start_answers_with_the_existing_run_and_starts_nothing(stack: Stack):
    """The same request again is a no-op; another under the taken id is a 409 naming what
    differs. Neither starts an execution."""
    status, first = stack.post_run({"agent": ROWS, "run_id": "dup"})
    assert (status, first["created"]) == (201, True)
    assert stack.finished(first["execution_name"])["status"] == "SUCCEEDED"

    status, again = stack.post_run({"agent": ROWS, "run_id": "dup"})
    conflict, refused = stack.post_run({"agent": ROWS, "run_id": "dup", "goal": "something else"})

    assert (conflict, [p["field"] for p in refused["problems"]]) == (409, ["goal"])
    assert status == 200
    assert again == {
        "run_id": "dup",
        "status": "done",
        "step": 3,
        "execution_name": execution_name("dup", 0),
        "created": False,
    }
    assert [e["name"] for e in stack.executions()] == [execution_name("dup", 0)]
    assert stack.head("dup").goal == "Write 3 rows, one per step."


def test_a_registered_name_is_stored_as_what_every_step_can_load(stack: Stack):
    _, started = stack.post_run({"agent": ROWS, "run_id": "named", "batches": 2})

    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"
    # The step function loaded it from the state alone, in every step.
    assert stack.head("named").agent == AGENTS[ROWS]
    assert agents.WORLD.rows_of("named") == {"named/step-1": 1, "named/step-2": 2}


def test_a_run_whose_execution_never_started_gets_it_on_the_next_request(stack: Stack):
    # Given a run created by a request that died before it started the execution
    stack.monkeypatch.setenv("RATCHET_STATE_MACHINE_ARN", "")
    stack.configure()
    with pytest.raises(RuntimeError, match="RATCHET_STATE_MACHINE_ARN"):
        stack.post_run({"agent": ROWS, "run_id": "half"})
    assert stack.executions() == []
    stack.configure(state_machine_arn=stack.state_machine_arn)

    status, started = stack.post_run({"agent": ROWS, "run_id": "half"})

    assert (status, started["created"]) == (200, False)
    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"
    assert stack.head("half").status.value == "done"


BAD_STARTS: list[tuple[dict[str, Any] | str, str, list[str]]] = [
    ("{not json", "invalid request body", ["(body)"]),
    ("[1, 2]", "invalid request body", ["(body)"]),
    ({"scenario": "migration", "batchez": 3}, "invalid request body", ["batchez"]),
    ({"scenario": "migration", "max_steps": "many"}, "invalid request body", ["max_steps"]),
    ({}, "give a goal, a scenario or an agent", ["goal", "scenario", "agent"]),
    ({"scenario": "migration", "agent": ROWS}, "not both", ["scenario", "agent"]),
    ({"scenario": "nope-nope"}, "unknown scenario: use one of", ["scenario"]),
    ({"scenario": "migration", "run_id": "../etc"}, "invalid request body", ["run_id"]),
    ({"goal": "  "}, "the goal is empty", ["goal"]),
    ({"goal": "\N{EURO SIGN}" * 21846}, "the goal is over 64 KB", ["goal"]),
    ({"scenario": "migration", "model": "claude-x"}, "no Anthropic API key configured", ["model"]),
    (
        {"scenario": "migration", "notify": {"email": ["not-an-address"]}},
        "invalid",
        ["notify.email.0"],
    ),
    (
        {"scenario": "migration", "notify": {"email": ["a@b.example"] * 11}},
        "invalid",
        ["notify.email"],
    ),
    ({"scenario": "migration", "notify": {"sms": "+1555"}}, "invalid", ["notify.sms"]),
    # Deeper than `json` recurses (a RecursionError, a 500, before it was bounded).
    (
        '{"scenario": "migration", "input": {"batches": ' + "[" * 60_000 + "]" * 60_000 + "}}",
        "the body is nested too deep",
        ["input"],
    ),
    # The same after a string holding an escaped quote, which does not end the string.
    (
        '{"scenario": "migration", "input": {"note": "\\"", "batches": '
        + "[" * 60_000
        + "]" * 60_000
        + "}}",
        "the body is nested too deep",
        ["input"],
    ),
]


@pytest.mark.parametrize(("body", "error", "fields"), BAD_STARTS)
def test_a_bad_start_is_a_400_naming_the_field_that_quotes_nothing_and_changes_nothing(
    stack: Stack, body: dict[str, Any] | str, error: str, fields: list[str]
):
    before = stack.items()

    status, answer = stack.post_run(body)

    assert status == 400
    assert error in answer["error"]
    assert [p["field"] for p in answer["problems"]] == fields
    said = json.dumps(answer)
    for quoted in ("../etc", "not-an-address", "claude-x", "nope-nope", "+1555", "Traceback"):
        assert quoted not in said
    assert "--" not in said, "the API names fields, not the CLI's flags"
    assert stack.executions() == []
    assert stack.items() == before


def test_a_body_over_a_megabyte_is_a_413_and_changes_nothing(stack: Stack):
    before = stack.items()

    status, answer = stack.post_run('{"goal": "' + "g" * MAX_BODY_CHARS + '"}')

    assert (status, [p["field"] for p in answer["problems"]]) == (413, ["(body)"])
    assert stack.executions() == []
    assert stack.items() == before


def test_the_api_never_sends_callers_to_an_environment_variable(stack: Stack):
    _, answer = stack.post_run({"scenario": "migration", "model": "claude-sonnet-4-5"})

    assert "ANTHROPIC_API_KEY" not in json.dumps(answer)
    assert answer["problems"] == [
        {
            "field": "model",
            "message": "this deployment has no Anthropic API key configured: use model "
            "'scripted' (the agent's own policy), or ask its operator to configure a key",
        }
    ]


NUMBER_BOUNDS = [
    ("max_steps", 0, "greater than or equal to 1"),
    ("max_steps", MAX_STEPS + 1, f"less than or equal to {MAX_STEPS}"),
    ("batches", 0, "greater than or equal to 1"),
    ("batches", MAX_BATCHES + 1, f"less than or equal to {MAX_BATCHES}"),
    ("batches", 1_000_000, f"less than or equal to {MAX_BATCHES}"),
    ("tool_latency_ms", -1, "greater than or equal to 0"),
    ("tool_latency_ms", MAX_TOOL_LATENCY_MS + 1, f"less than or equal to {MAX_TOOL_LATENCY_MS}"),
]


@pytest.mark.parametrize(("field", "value", "message"), NUMBER_BOUNDS)
def test_every_number_is_bounded_by_what_the_runtime_can_honour(
    stack: Stack, field: str, value: int, message: str
):
    status, answer = stack.post_run({"scenario": "migration", field: value})

    assert status == 400
    assert answer["problems"] == [{"field": field, "message": f"Input should be {message}"}]
    assert _runs(stack) == []


def test_the_largest_migration_allowed_is_prepared_well_inside_the_api_timeout(stack: Stack):
    # API Gateway gives up at 29 s. Unloaded, this takes about 2 s on moto (3.4-4.6 ms a
    # batch); the bound is the gateway's own, so a loaded CI machine cannot fail it by luck.
    import time

    began = time.monotonic()
    status, started = stack.post_run(
        {"scenario": "migration", "run_id": "big", "batches": MAX_BATCHES, "max_steps": 1}
    )
    took = time.monotonic() - began

    assert (status, started["created"]) == (201, True)
    assert took < 29, f"starting a {MAX_BATCHES}-batch migration took {took:.1f} s"
    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"


# --- registered agents only --------------------------------------------------------------------


@pytest.fixture
def tripwire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable module whose import leaves a file behind: the proof of an import."""
    marker = tmp_path / "imported"
    (tmp_path / "ratchet_tripwire.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nagent = None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


@pytest.mark.parametrize(
    "body",
    [
        {"agent": "ratchet_tripwire:agent"},
        {"scenario": "ratchet_tripwire:agent"},
        {"agent": "ratchet_tripwire:agent", "goal": "anything"},
    ],
)
def test_an_unregistered_agent_is_refused_without_importing_anything(
    stack: Stack, tripwire: Path, body: dict[str, str]
):
    modules = set(sys.modules)

    status, answer = stack.post_run(body)

    assert status == 400
    (field,) = body.keys() - {"goal"}
    assert answer["problems"][0]["field"] == field
    known = (
        "bounded, events, failing, fanout, flaky, gated, helper, migration, notebook, quick, "
        "rows, sleeper, twice, wires"
        if field == "agent"
        else "migration, notebook"
    )
    assert f"unknown {field}: use one of {known}" in answer["error"]
    assert "ratchet_tripwire" not in json.dumps(answer)
    assert not tripwire.exists(), "the module was imported"
    assert "ratchet_tripwire" not in sys.modules
    assert {m for m in set(sys.modules) - modules if "tripwire" in m or m == "this"} == set()
    assert _runs(stack) == []


def test_the_zen_of_python_is_not_an_agent(stack: Stack, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delitem(sys.modules, "this", raising=False)

    status, answer = stack.post_run({"agent": "this:s"})

    assert (status, answer["problems"][0]["field"]) == (400, "agent")
    assert "this" not in sys.modules, "the module ran (it prints the Zen of Python)"


def test_a_registered_agent_that_cannot_be_loaded_is_the_deployments_fault(stack: Stack):
    stack.configure(agents=json.dumps({**AGENTS, "broken": "ratchet_not_deployed:agent"}))

    status, answer = stack.post_run({"agent": "broken"})

    assert status == 500
    assert answer == {
        "error": "the agent is registered but cannot be loaded; the deployment must be fixed",
        "problems": [],
    }
    assert _runs(stack) == []


# --- reading -----------------------------------------------------------------------------------


def test_reading_runs_answers_the_documented_shapes(stack: Stack):
    _, done = stack.post_run({"agent": ROWS, "run_id": "read-1"})
    stack.finished(done["execution_name"])
    stack.post_run({**MIGRATION, "run_id": "read-2"})
    stack.parked("read-2")

    status, listed = call("GET", "/runs")
    assert status == 200
    assert [r["run_id"] for r in listed["runs"]] == ["read-2", "read-1"], "recent first"
    fields = {"run_id", "status", "step", "version", "updated_at", "damage", "agent"}
    assert set(listed["runs"][0]) == {*fields, "concurrency_key"}
    assert {r["damage"] for r in listed["runs"]} == {None}, "no run is damaged"
    assert listed["runs"][0]["agent"] == "migration"
    assert listed["next"] is None
    assert call("GET", "/runs", query={"status": "done"})[1]["runs"][0]["run_id"] == "read-1"
    first = call("GET", "/runs", query={"limit": "1"})[1]
    assert [r["run_id"] for r in first["runs"]] == ["read-2"]
    rest = call("GET", "/runs", query={"limit": "1", "after": first["next"]})[1]
    assert ([r["run_id"] for r in rest["runs"]], rest["next"]) == (["read-1"], None)

    status, run = call("GET", "/runs/read-2")
    assert status == 200
    assert (run["status"], run["step"], run["agent"], run["model"]) == (
        "waiting",
        5,
        "migration",
        "scripted",
    )
    assert run["waiting"]["step"] == 5
    assert run["waiting"]["prompt"].startswith("Drop legacy_orders")
    assert run["waiting"]["details"]["reason"].startswith("All 3 batches")

    status, history = call("GET", "/runs/read-1/history")
    assert status == 200
    rows = history["checkpoints"]
    assert [r["event"] for r in rows] == ["created", "step", "step", "step", "finished"]
    assert [r["version"] for r in rows] == sorted(r["version"] for r in rows)
    assert {"version", "step", "status", "event", "worker", "bytes", "time"} <= set(rows[0])
    assert rows[0]["worker"].startswith("lambda:")
    # The rows `ratchet history --json` prints: the write in words, the call, the attempt.
    step = rows[1]
    assert (step["explanation"], step["attempt"]) == ("step committed", 1)
    assert step["tool"]
    assert step["arguments"] is not None
    assert step["result"]

    status, at_two = call("GET", "/runs/read-1/checkpoints/2")
    assert status == 200
    assert (at_two["step"], at_two["status"]) == (2, "running")
    assert [r["text"] for r in at_two["tool_results"]] == ["row 1 written", "row 2 written"]


@pytest.mark.parametrize(
    ("path", "query", "status", "field"),
    [
        ("/runs/ghost", None, 404, "run_id"),
        ("/runs/ghost/history", None, 404, "run_id"),
        ("/runs/ghost/checkpoints/1", None, 404, "run_id"),
        ("/runs/known/checkpoints/99", None, 404, "step"),
        ("/runs/known/checkpoints/-1", None, 400, "step"),
        ("/runs/known/checkpoints/one", None, 400, "step"),
        ("/runs/not..ok%2Fid", None, 400, "run_id"),
        ("/runs", {"limit": "0"}, 400, "limit"),
        ("/runs", {"limit": "101"}, 400, "limit"),
        ("/runs", {"status": "sleeping"}, 400, "status"),
    ],
)
def test_reading_what_is_not_there_is_a_json_error_naming_the_field(
    stack: Stack, path: str, query: dict[str, str] | None, status: int, field: str
):
    stack.post_run({"agent": ROWS, "run_id": "known"})

    answered, answer = call("GET", path, query=query)

    assert answered == status
    assert [p["field"] for p in answer["problems"]] == [field]
    assert "sleeping" not in json.dumps(answer)


# --- deciding ----------------------------------------------------------------------------------


def _decisions(stack: Stack, run_id: str) -> list[PersonDecided]:
    checkpoints = _store(stack).list_checkpoints(run_id)
    return [c.event for c in checkpoints if isinstance(c.event, PersonDecided)]


def test_an_approval_through_the_api_resumes_the_execution(stack: Stack):
    _, started = stack.post_run({**MIGRATION, "run_id": "api-yes"})
    approval = stack.parked("api-yes")

    status, decided = call("POST", "/runs/api-yes/approve", {"comment": "go ahead"})

    assert status == 200
    assert decided == {
        "run_id": "api-yes",
        "step": approval.step,
        "decision": "approved",
        "by": CALLER,
        "comment": "go ahead",
        "run_status": "waiting",
    }
    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"
    final = stack.head("api-yes")
    assert final.status is RunStatus.DONE
    assert "legacy_orders was dropped" in (final.summary or "")
    assert [(d.approved, d.by, d.comment) for d in _decisions(stack, "api-yes")] == [
        (True, CALLER, "go ahead")
    ]
    (settled,) = stack.approvals("api-yes")
    assert (settled.status.value, settled.channel) == ("approved", "api")
    assert all("task_token" not in item for item in stack.approval_items("api-yes"))


def test_a_rejection_through_the_api_resumes_the_run_which_keeps_the_table(stack: Stack):
    _, started = stack.post_run({**MIGRATION, "run_id": "api-no"})
    stack.parked("api-no")

    status, decided = call("POST", "/runs/api-no/reject", {"reason": "not before the audit"})

    assert (status, decided["decision"]) == (200, "rejected")
    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"
    assert [(d.approved, d.by, d.comment) for d in _decisions(stack, "api-no")] == [
        (False, CALLER, "not before the audit")
    ]
    assert "legacy_orders was kept" in (stack.head("api-no").summary or "")


def test_a_body_is_optional_and_a_second_decision_changes_nothing(stack: Stack):
    _, started = stack.post_run({**MIGRATION, "run_id": "api-twice"})
    stack.parked("api-twice")
    assert call("POST", "/runs/api-twice/approve")[0] == 200
    stack.finished(started["execution_name"])
    before = stack.items()

    for route, body in (("approve", {"comment": "again"}), ("reject", {"reason": "too late"})):
        status, answer = call("POST", f"/runs/api-twice/{route}", body)
        assert status == 409
        assert answer["problems"] == [
            {"field": "run_id", "message": "the run is not waiting for a decision"}
        ]
    assert stack.items() == before


def test_an_answer_its_question_refuses_is_a_400_naming_the_answers_field(stack: Stack):
    # Given a run asking whether an at-most-once call ran: its step died after the call began
    stack.fault("kill:after_call_started@1")
    _, started = stack.post_run({"agent": "wires", "run_id": "api-ran"})
    stack.parked("api-ran")
    before = stack.items()

    refusals = [
        call("POST", "/runs/api-ran/approve", {"answer": answer})
        for answer in ({"ran": "maybe"}, {"ran": True, "result": 42}, {"result": "ref 42"})
    ]
    after_refusals = stack.items()
    status, _ = call("POST", "/runs/api-ran/approve", {"answer": {"ran": False}})

    assert refusals == [
        (400, {"error": "invalid request body", "problems": [{"field": f, "message": m}]})
        for f, m in (
            ("answer.ran", "must be true or false"),
            ("answer.result", "must be text"),
            ("answer.ran", "required (true or false)"),
        )
    ]
    assert after_refusals == before
    assert status == 200
    assert stack.finished(started["execution_name"], timeout=120)["status"] == "SUCCEEDED"


def test_the_notify_field_chooses_who_is_asked(stack: Stack):
    who = "carol@example.test"
    stack.post_run({**MIGRATION, "run_id": "api-carol", "notify": {"email": [who]}})

    stack.parked("api-carol")

    assert stack.head("api-carol").options.notify.email == [who]
    assert [e.to for e in stack.emails_about("api-carol")] == [[who]]


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/runs/ghost/approve", {}, 404, "run_id"),
        ("/runs/ghost/reject", {}, 404, "run_id"),
        ("/runs/settled/approve", {"comment": "x" * 10_001}, 400, "comment"),
        ("/runs/settled/reject", {"reason": "x" * 10_001}, 400, "reason"),
        # Steering is bounded as deciding is (the caller, never the body, says who).
        ("/runs/settled/cancel", {"reason": "x" * 10_001}, 400, "reason"),
        ("/runs/settled/cancel", {"by": "mallory"}, 400, "by"),
        ("/runs/settled/reject", {"because": "no"}, 400, "because"),
        ("/runs/settled/approve", {"by": "mallory"}, 400, "by"),
        ("/runs/settled/approve", {}, 409, "run_id"),
    ],
)
def test_a_decision_that_cannot_be_taken_is_refused_and_changes_nothing(
    stack: Stack, path: str, body: dict[str, str], status: int, field: str
):
    _, started = stack.post_run({"agent": ROWS, "run_id": "settled"})
    stack.finished(started["execution_name"])
    before = stack.items()

    answered, answer = call("POST", path, body)

    assert answered == status
    assert [p["field"] for p in answer["problems"]] == [field]
    assert "mallory" not in json.dumps(answer)
    assert stack.items() == before


def test_an_unsigned_decision_is_refused(stack: Stack):
    stack.post_run({**MIGRATION, "run_id": "api-anon"})
    stack.parked("api-anon")

    status, answer = call("POST", "/runs/api-anon/approve", {}, caller=None)

    assert status == 403
    assert answer["problems"][0]["field"] == "Authorization"
    assert stack.head("api-anon").status is RunStatus.WAITING
    assert [a.status.value for a in stack.approvals("api-anon")] == ["pending"]


# --- forking ---------------------------------------------------------------------------------


def test_a_fork_through_the_api_runs_on_data_that_matches_its_state(stack: Stack):
    # Given a migration finished through the API (3 batches copied at steps 2-4)
    _, started = stack.post_run({**MIGRATION, "run_id": "api-src"})
    stack.parked("api-src")
    call("POST", "/runs/api-src/approve", {})
    stack.finished(started["execution_name"])

    # When it is forked after its second copy, and the fork's own execution is approved
    status, forked = call("POST", "/runs/api-src/fork", {"from_step": 3, "run_id": "api-fork"})
    assert status == 201, forked
    stack.parked("api-fork")
    call("POST", "/runs/api-fork/approve", {})
    assert stack.finished(forked["execution_name"])["status"] == "SUCCEEDED"

    # Then the fork is done with every row copied once: the agent's fork hook gave it the
    # source's first two copies in its own partition of the app table
    assert stack.head("api-fork").status is RunStatus.DONE
    assert _verified(stack, "api-fork")["ok"] is True


def test_approving_a_fork_of_a_waiting_run_through_the_api_reaches_the_fork(stack: Stack):
    # Given a migration parked for a person, forked from the step that asked
    stack.post_run({**MIGRATION, "run_id": "api-ask"})
    asked = stack.parked("api-ask")
    status, forked = call(
        "POST", "/runs/api-ask/fork", {"from_step": asked.step, "run_id": "api-ask-2"}
    )
    assert status == 201, forked
    assert stack.parked("api-ask-2").step == asked.step

    # When a person approves the fork
    call("POST", "/runs/api-ask-2/approve", {"comment": "go"})

    # Then the fork drops the table: the decision reached its next step (issue 22)
    assert stack.finished(forked["execution_name"])["status"] == "SUCCEEDED"
    assert "legacy_orders was dropped" in (stack.head("api-ask-2").summary or "")
    assert _verified(stack, "api-ask-2")["ok"] is True
    assert stack.head("api-ask").status is RunStatus.WAITING


def test_a_fork_the_agent_refuses_is_a_409_with_its_reason_and_changes_nothing(stack: Stack):
    stack.post_run({**MIGRATION, "run_id": "api-old"})
    stack.parked("api-old")
    # Data written by an older Ratchet does not say what a key did
    stack.dynamodb.update_item(
        TableName=APP_TABLE,
        Key={"pk": {"S": "migration#api-old"}, "sk": {"S": "APPLIED#api-old/step-2"}},
        UpdateExpression="REMOVE effect, args",
    )
    before = stack.items()

    status, answer = call("POST", "/runs/api-old/fork", {"from_step": 4, "run_id": "api-new"})

    assert status == 409
    assert answer["error"] == "the agent refuses this fork"
    [problem] = answer["problems"]
    assert problem["field"] == "from_step"
    assert "does not record what api-old/step-2 did" in problem["message"]
    assert stack.items() == before
    assert "api-new" not in _runs(stack)


def _verified(stack: Stack, run_id: str) -> dict[str, Any]:
    from ratchet.handlers import _wiring
    from ratchet.scenarios import migration

    state = stack.head(run_id)
    return migration.verify(_wiring.runtime().context(run_id, state.options), state)


def test_a_model_the_deployment_registers_is_started_by_name_and_runs(stack: Stack):
    status, started = stack.post_run(
        {"scenario": "notebook", "goal": "Say hi", "run_id": "house-1", "model": "house"}
    )

    assert status == 201, started
    assert stack.finished(started["execution_name"], timeout=60)["status"] == "SUCCEEDED"
    head = stack.head("house-1")
    assert head.options.model == "tests.fixtures.house_model:model"
    assert head.summary == "decided by the house model"
    refused, answer = stack.post_run(
        {"scenario": "notebook", "goal": "g", "model": "tests.fixtures.house_model:other"}
    )
    assert refused == 400
    assert answer["problems"][0]["field"] == "model"
