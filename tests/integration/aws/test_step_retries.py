"""The state machine retries what can be retried: whatever ends a step's invocation other than
another execution owning the run, on the real definition with the real step handler. Each run
below fails once after its tool ran at step 2 (copying the first batch), and still finishes
with every batch applied once: the retry reuses the recorded decision and idempotency key."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from ratchet import errors
from ratchet.agents import load_agent
from ratchet.handlers import _wiring
from ratchet.state import RunStatus
from tests.integration.aws.harness import Stack, entered_states

MIGRATION = {"scenario": "migration", "batches": 2}
FAULTED_STEP = 2
"""inspect, copy batch 1 (here), copy batch 2, approval (expires), email, DONE."""
ATTEMPT_FAILED = {
    name
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, errors.StepAttemptFailed)
}
"""What the engine may name an exception it recorded as a failed attempt."""

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")


def _step_errors(history: list[dict[str, Any]]) -> list[str]:
    return [e["taskFailedEventDetails"]["error"] for e in history if e["type"] == "TaskFailed"]


def _run_to_the_end(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """Start the migration (nobody answers its approval, so it goes on as rejected) and wait
    for its execution to end; its history."""
    _, started = stack.post_run({**MIGRATION, "run_id": run_id})
    execution = stack.finished(started["execution_name"])
    history = stack.history(started["execution_name"])
    assert execution["status"] == "SUCCEEDED", (execution.get("cause"), _step_errors(history))
    return history


def _assert_done_with_each_batch_applied_once(stack: Stack, run_id: str) -> None:
    state = stack.head(run_id)
    assert state.status is RunStatus.DONE, state.error
    agent = load_agent(state.agent)
    assert agent.verify is not None
    checks = agent.verify(_wiring.runtime().context(run_id, state.options), state)
    assert checks["ok"], checks["problems"]
    assert (checks["duplicate_rows"], checks["missing_rows"]) == (0, 0)
    # The faulted step's tool ran twice under one key and was applied once.
    assert checks["keys_delivered"] == checks["keys_applied"] + 1
    kinds = [c.event.kind for c in _wiring.runtime().store.list_checkpoints(run_id)]
    assert kinds[-1] == "finished"


@pytest.fixture
def migration(stack: Stack) -> Stack:
    stack.configure(approval_timeout_seconds=1)
    return stack


def test_a_python_exception_after_the_tool_is_retried_and_the_batch_applied_once(
    migration: Stack,
):
    """Before: the exception reached the catch-all and MarkFailed failed the run."""
    migration.report_crashes_as(None)
    migration.fault(f"raise:after_tool@{FAULTED_STEP}")

    history = _run_to_the_end(migration, "py-exc")

    (error,) = _step_errors(history)
    assert error in {"InjectedFault", *ATTEMPT_FAILED}
    assert "MarkFailed" not in entered_states(history)
    _assert_done_with_each_batch_applied_once(migration, "py-exc")


def test_a_connection_error_to_dynamodb_is_retried_and_the_batch_applied_once(
    migration: Stack, monkeypatch: pytest.MonkeyPatch
):
    """Before: botocore's EndpointConnectionError, not a ClientError, was not named StoreBusy
    and reached MarkFailed. The commit of step 2 never reaches DynamoDB."""
    client: Any = _wiring.runtime().dynamodb
    send = client._make_api_call
    dropped: list[str] = []

    def drop_the_commit_of_step_2(operation: str, params: dict[str, Any]) -> Any:
        if operation == "TransactWriteItems" and not dropped and _commits_step(params):
            dropped.append(operation)
            raise EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")
        return send(operation, params)

    monkeypatch.setattr(client, "_make_api_call", drop_the_commit_of_step_2)

    history = _run_to_the_end(migration, "conn")

    assert dropped == ["TransactWriteItems"]
    # The adapter names it StoreBusy; an engine that records a failed commit as a failed
    # attempt raises that instead. Either is retried, and neither is a crash.
    (error,) = _step_errors(history)
    assert error in {"StoreBusy", *ATTEMPT_FAILED}
    _assert_done_with_each_batch_applied_once(migration, "conn")


def _commits_step(params: dict[str, Any]) -> bool:
    records = [i["Put"]["Item"] for i in params["TransactItems"] if "Put" in i]
    return any(
        r.get("step") == {"N": str(FAULTED_STEP)}
        and r["sk"]["S"].startswith("CP#")
        and json.loads(r["event"]["S"])["kind"] == "step"
        for r in records
    )


@pytest.mark.parametrize(
    ("fault", "reported_as", "error"),
    [
        (f"kill:after_tool@{FAULTED_STEP}", "Lambda.Unknown", "Runtime.ExitError"),
        (f"raise:after_tool@{FAULTED_STEP}", "Sandbox.Timedout", "Sandbox.Timedout"),
        (f"raise:after_tool@{FAULTED_STEP}", "Lambda.Unknown", "Lambda.Unknown"),
    ],
    ids=["killed", "timed-out", "unknown"],
)
def test_an_invocation_that_died_after_the_tool_is_retried_and_the_batch_applied_once(
    migration: Stack, fault: str, reported_as: str, error: str
):
    """Before: only Lambda.Unknown was retried; Runtime.ExitError and Sandbox.Timedout
    reached MarkFailed."""
    migration.report_crashes_as(reported_as)
    migration.fault(fault)

    history = _run_to_the_end(migration, f"died-{error.lower().replace('.', '-')}")

    assert _step_errors(history) == [error]
    _assert_done_with_each_batch_applied_once(migration, f"died-{error.lower().replace('.', '-')}")


def test_a_fault_that_never_stops_fails_the_run_after_three_attempts(migration: Stack):
    """RATCHET_FAULT from the function's environment fires in every invocation that has it:
    the engine's three strikes end the run, and MarkFailed names the crash."""
    migration.report_crashes_as("Runtime.ExitError")
    migration.fault(f"raise:after_tool@{FAULTED_STEP}", times=99)
    _, started = migration.post_run({**MIGRATION, "run_id": "forever"})

    execution = migration.finished(started["execution_name"])

    assert (execution["status"], execution["error"]) == ("FAILED", "RunFailed")
    assert _step_errors(migration.history(started["execution_name"])) == ["Runtime.ExitError"] * 3
    final = migration.head("forever")
    assert (final.status, final.step, final.attempts) == (RunStatus.FAILED, 1, 3)
    assert (final.error or "").startswith("Runtime.ExitError: crashed: injected fault")
