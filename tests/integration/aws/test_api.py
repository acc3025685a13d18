"""`POST /runs`: validation like the CLI's, idempotent by run id, never a stack trace."""

from __future__ import annotations

import pytest

from ratchet.aws.naming import execution_name
from tests.integration.aws.harness import Stack

ROWS = "tests.integration.aws.agents:rows"


def test_a_duplicate_start_answers_with_the_existing_run_and_starts_nothing(stack: Stack):
    status, first = stack.post_run({"agent": ROWS, "run_id": "dup"})
    assert (status, first["created"]) == (201, True)
    stack.finished(first["execution_name"])

    status, again = stack.post_run({"agent": ROWS, "run_id": "dup", "goal": "something else"})

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


@pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")  # it failed
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


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("{not json", "invalid request body"),
        ({"scenario": "migration", "batchez": 3}, "invalid request body"),
        ({"scenario": "migration", "max_steps": 0}, "invalid request body"),
        ({}, "give --goal TEXT or --scenario NAME"),
        ({"scenario": "migration", "agent": ROWS}, "give --scenario or --agent, not both"),
        ({"scenario": "nope"}, "unknown scenario or agent 'nope'"),
        ({"scenario": "migration", "run_id": "../etc"}, "malformed run id '../etc'"),
        ({"scenario": "migration", "model": "claude-x"}, "needs ANTHROPIC_API_KEY"),
        ({"goal": "  "}, "the goal is empty"),
    ],
)
def test_a_bad_request_is_a_400_with_a_json_error_and_changes_nothing(
    stack: Stack, body: dict[str, object] | str, error: str
):
    status, answer = stack.post_run(body)

    assert status == 400
    assert error in answer["error"]
    assert "Traceback" not in str(answer)
    assert stack.executions() == []
    assert _wiring_runs() == []


def test_a_bad_field_is_named_in_the_error(stack: Stack):
    status, answer = stack.post_run({"scenario": "migration", "max_steps": 0})

    assert status == 400
    assert answer["problems"] == [
        {"field": "max_steps", "message": "Input should be greater than or equal to 1"}
    ]


def _wiring_runs() -> list[str]:
    from ratchet.handlers import _wiring

    return [summary.run_id for summary in _wiring.runtime().store.list_runs()]
