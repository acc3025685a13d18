"""The state machine, executed: every path of `statemachine/agent_run.asl.json` that a run can
take, driven through the API and the approval flow as a deployment would be."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from ratchet.adapters.stepfunctions import (
    REJECTED_ERROR,
    ApprovalAnswer,
    ExecutionInput,
    Rejection,
    execution_name,
)
from ratchet.agents import AgentRegistry, load_agent
from ratchet.client import Client
from ratchet.engine import Engine
from ratchet.errors import AgentNotFound, InjectedFault
from ratchet.faults import Fault, FaultAction, FaultPlan, FaultPoint
from ratchet.handlers import _wiring, decide, mark_failed, step
from ratchet.state import RunStatus
from tests.integration.aws import agents
from tests.integration.aws.harness import (
    APPROVER,
    FakeContext,
    Stack,
    entered_states,
    history_events_per_iteration,
    wait_until,
)

MIGRATION = {"scenario": "migration", "batches": 3}


def _parked(stack: Stack, run_id: str) -> str:
    """Wait until the run waits for a person and its request went out; return the task
    token, read from the table as the function that answers reads it."""
    stack.parked(run_id)
    return stack.token(run_id)


def _verified(stack: Stack, run_id: str) -> dict[str, Any]:
    state = stack.head(run_id)
    agent = load_agent(state.agent)
    assert agent.verify is not None
    return agent.verify(_wiring.runtime().context(run_id, state.options), state)


def _errors(events: list[dict[str, Any]]) -> list[str]:
    return [e["taskFailedEventDetails"]["error"] for e in events if e["type"] == "TaskFailed"]


def test_a_migration_started_through_the_api_parks_for_approval_and_finishes(stack: Stack):
    status, started = stack.post_run({**MIGRATION, "run_id": "mig-1"})
    assert (status, started["created"]) == (201, True)
    token = _parked(stack, "mig-1")

    stack.sfn.send_task_success(
        taskToken=token, output=ApprovalAnswer(by="alice", comment="go").model_dump_json()
    )

    execution = stack.finished(started["execution_name"])
    assert execution["status"] == "SUCCEEDED"
    final = stack.head("mig-1")
    assert final.status is RunStatus.DONE
    assert "legacy_orders was dropped" in (final.summary or "")
    checks = _verified(stack, "mig-1")
    assert checks["ok"], checks["problems"]
    assert (checks["legacy_dropped"], checks["emails_sent"]) == (True, 1)
    stack.assert_settled("mig-1")
    # inspect, three copies and the approval in one invocation; drop, email and DONE in
    # another, after the decision (several steps per invocation).
    steps = [e for name, e in stack.lambdas.invocations if name == "ratchet-step"]
    assert [e["iteration"] for e in steps] == [0, 1]
    history = stack.history(started["execution_name"])
    assert history_events_per_iteration(history) == [EVENTS_PER_ITERATION + EVENTS_PER_APPROVAL]


def test_a_rejection_resumes_the_run_which_then_keeps_the_legacy_table(stack: Stack):
    _, started = stack.post_run({**MIGRATION, "run_id": "mig-2"})
    token = _parked(stack, "mig-2")

    stack.sfn.send_task_failure(
        taskToken=token,
        error=REJECTED_ERROR,
        cause=Rejection(by="bob", reason="not before the audit").model_dump_json(),
    )

    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"
    final = stack.head("mig-2")
    assert final.status is RunStatus.DONE
    assert stack.decisions("mig-2") == [(False, "bob", "not before the audit")]
    checks = _verified(stack, "mig-2")
    assert checks["ok"], checks["problems"]
    assert (checks["legacy_dropped"], checks["emails_sent"]) == (False, 1)
    stack.assert_settled("mig-2")


def test_an_approval_nobody_answers_expires_and_the_run_goes_on_as_rejected(stack: Stack):
    stack.configure(approval_timeout_seconds=1)
    _, started = stack.post_run({**MIGRATION, "run_id": "mig-3"})

    execution = stack.finished(started["execution_name"])

    assert execution["status"] == "SUCCEEDED"
    assert stack.decisions("mig-3") == [(False, "nobody", "approval expired after 1 s")]
    assert "TaskTimedOut" in [e["type"] for e in stack.history(started["execution_name"])]
    assert _verified(stack, "mig-3")["legacy_dropped"] is False
    stack.assert_settled("mig-3")


def test_a_step_that_fails_three_times_fails_the_run_with_its_last_checkpoint(stack: Stack):
    _, started = stack.post_run({"agent": "tests.integration.aws.agents:failing", "run_id": "f1"})

    execution = stack.finished(started["execution_name"])

    assert (execution["status"], execution["error"]) == ("FAILED", "RunFailed")
    # Two retries, then the engine itself fails the run on the third attempt.
    assert _errors(stack.history(started["execution_name"])) == ["ToolFailed", "ToolFailed"]
    final = stack.head("f1")
    assert (final.status, final.step, final.attempts) == (RunStatus.FAILED, 2, 3)
    assert "the disk is full" in (final.error or "")
    kinds = [c.event.kind for c in _wiring.runtime().store.list_checkpoints("f1")]
    assert kinds[-3:] == ["attempt_failed", "attempt_failed", "finished"]
    assert agents.WORLD.rows_of("f1") == {"f1/step-1": 1, "f1/step-2": 2}


@dataclass(frozen=True)
class FirstTimeOnly(FaultPlan):
    """Each fault fires once in this process: the retried invocation is the "new process"
    that recovers."""

    fired: set[tuple[FaultPoint, int]] = field(default_factory=set)

    def hit(self, point: FaultPoint, step: int) -> None:
        if (point, step) in self.fired:
            return
        try:
            super().hit(point, step)
        except InjectedFault:
            self.fired.add((point, step))
            raise


def _inject(monkeypatch: pytest.MonkeyPatch, faults: FaultPlan) -> None:
    def faulty_engine(context: Any) -> Engine:
        return _wiring.runtime().engine(
            worker_id=f"lambda:{context.aws_request_id}", logger=_wiring.logger, faults=faults
        )

    monkeypatch.setattr(step, "engine", faulty_engine)


CRASH_AFTER_TOOL_2 = (Fault(FaultAction.RAISE, FaultPoint.AFTER_TOOL, 2),)


@pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")  # a crash records none
def test_a_crash_after_the_tool_and_before_the_commit_is_retried_and_applies_once(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    _inject(monkeypatch, FirstTimeOnly(CRASH_AFTER_TOOL_2))
    _, started = stack.post_run({"agent": "tests.integration.aws.agents:rows", "run_id": "c1"})

    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"
    assert _errors(stack.history(started["execution_name"])) == ["Lambda.Unknown"]
    assert agents.WORLD.deliveries_of("c1") == {"c1/step-1": 1, "c1/step-2": 2, "c1/step-3": 1}
    assert agents.WORLD.rows_of("c1") == {"c1/step-1": 1, "c1/step-2": 2, "c1/step-3": 3}
    assert stack.head("c1").status is RunStatus.DONE


@pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")  # a crash records none
def test_a_step_that_keeps_crashing_is_marked_failed_with_the_crash(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    _inject(monkeypatch, FaultPlan(CRASH_AFTER_TOOL_2))
    _, started = stack.post_run({"agent": "tests.integration.aws.agents:rows", "run_id": "c2"})

    execution = stack.finished(started["execution_name"])

    assert (execution["status"], execution["error"]) == ("FAILED", "RunFailed")
    assert execution["cause"].startswith("Lambda.Unknown: ")
    assert _errors(stack.history(started["execution_name"])) == ["Lambda.Unknown"] * 3
    final = stack.head("c2")
    assert (final.status, final.step) == (RunStatus.FAILED, 1)
    assert (final.error or "").startswith("Lambda.Unknown: crashed: injected fault")
    assert agents.WORLD.deliveries_of("c2") == {"c2/step-1": 1, "c2/step-2": 3}
    assert agents.WORLD.rows_of("c2") == {"c2/step-1": 1, "c2/step-2": 2}


def test_of_two_executions_for_one_run_the_slow_one_stops_on_the_stale_version(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    gate = agents.Gate(step=1)
    monkeypatch.setattr(agents, "GATE", gate)
    _, started = stack.post_run({"agent": "tests.integration.aws.agents:gated", "run_id": "r1"})
    assert gate.entered.wait(timeout=30), "the first execution never reached its tool"

    # While the first execution is inside step 1's tool, a second one takes the run over.
    rival = ExecutionInput(run_id="r1", approval_timeout_seconds=300)
    stack.sfn.start_execution(
        stateMachineArn=stack.state_machine_arn, name="r1-rival", input=rival.model_dump_json()
    )
    assert stack.finished("r1-rival")["status"] == "SUCCEEDED"
    settled = stack.head("r1")
    assert settled.status is RunStatus.DONE

    gate.release.set()
    slow = stack.finished(started["execution_name"])

    assert slow["status"] == "SUCCEEDED"
    history = stack.history(started["execution_name"])
    assert _errors(history) == ["StaleVersion"]
    assert entered_states(history)[-1] == "Superseded"
    assert stack.head("r1") == settled, "the stale execution changed the run"
    assert agents.WORLD.deliveries_of("r1")["r1/step-1"] == 2
    assert agents.WORLD.rows_of("r1") == {"r1/step-1": 1, "r1/step-2": 2, "r1/step-3": 3}


def test_a_run_rolls_over_into_successor_executions_and_completes(stack: Stack):
    # One step per invocation: the rollover counts loop iterations, here one step each.
    stack.configure(rollover_after=3, max_steps_per_invocation=1)
    stack.post_run({"agent": "tests.integration.aws.agents:rows", "run_id": "long", "batches": 7})
    names = [execution_name("long", generation) for generation in range(3)]

    # 7 rows and DONE are 8 steps: 3 + 3 + 2 over three executions.
    last = stack.finished(names[-1]) if _started(stack, names[-1]) else {}

    assert last["status"] == "SUCCEEDED"
    assert [e["name"] for e in stack.executions()] == names
    assert all(stack.finished(name)["status"] == "SUCCEEDED" for name in names)
    inputs = [json.loads(stack.finished(name)["input"]) for name in names]
    assert [(i["generation"], i["iteration"]) for i in inputs] == [(0, 0), (1, 0), (2, 0)]
    final = stack.head("long")
    assert (final.status, final.step) == (RunStatus.DONE, 7)
    assert len(agents.WORLD.rows_of("long")) == 7
    assert set(agents.WORLD.deliveries_of("long").values()) == {1}
    # Steps 1-3 in the first execution: two whole loop iterations between three Steps.
    assert history_events_per_iteration(stack.history(names[0])) == [EVENTS_PER_ITERATION] * 2


EVENTS_PER_ITERATION = 7
"""Step (entered, scheduled, started, succeeded, exited) and Route (entered, exited)."""
EVENTS_PER_APPROVAL = 13
"""AwaitApproval (entered, scheduled, started, submitted, succeeded, exited), Approved (entered,
exited) and RecordDecision (entered, scheduled, started, succeeded, exited)."""


def _started(stack: Stack, name: str) -> bool:
    wait_until(lambda: name in [e["name"] for e in stack.executions()], what=f"execution {name}")
    return True


def test_a_late_decision_or_failure_leaves_a_finished_run_as_it_is(stack: Stack):
    _, started = stack.post_run({"agent": "tests.integration.aws.agents:rows", "run_id": "late"})
    stack.finished(started["execution_name"])
    done = stack.head("late")
    context = FakeContext("ratchet-decide", "arn:ratchet-decide")

    decided = decide.handler(
        {"run_id": "late", "verdict": "approved", "answer": {"by": "carol"}}, context
    )
    failed = mark_failed.handler(
        {"run_id": "late", "error": {"Error": "Lambda.Unknown", "Cause": "late"}}, context
    )

    assert decided == {"run_id": "late", "status": "done", "step": 3, "recorded": False}
    assert failed == {"run_id": "late", "status": "done", "step": 3}
    assert stack.head("late") == done


@pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")
def test_a_bundle_that_cannot_load_the_agent_leaves_its_run_untouched(stack: Stack):
    # Given a run whose step function, once the run was started, cannot import its agent
    # (a deployment whose bundle lacks the agent's module)
    held = stack.hold("ratchet-step")
    _, started = stack.post_run({"agent": "tests.integration.aws.agents:rows", "run_id": "gone"})
    held.wait_entered()
    before = stack.head("gone")

    def unloadable(self: Any, reference: str) -> Any:
        raise AgentNotFound(f"cannot import {reference}: No module named 'my_agents'")

    with pytest.MonkeyPatch.context() as bundle_without_the_agent:
        bundle_without_the_agent.setattr(AgentRegistry, "load", unloadable)
        held.release()
        execution = stack.finished(started["execution_name"], timeout=30)

    # Then the execution ends naming the agent and why, and the run is neither failed nor struck
    assert (execution["status"], execution["error"]) == ("FAILED", "AgentUnloadable")
    assert "cannot load agent 'tests.integration.aws.agents:rows'" in execution["cause"]
    assert "No module named 'my_agents'" in execution["cause"]
    history = stack.history(started["execution_name"])
    assert _errors(history) == ["AgentUnloadable"]
    assert "MarkFailed" not in entered_states(history)
    after = stack.head("gone")
    assert (after.status, after.step, after.attempts) == (RunStatus.RUNNING, 0, 0)
    assert after.step == before.step
    assert agents.WORLD.rows_of("gone") == {}

    # When a bundle with the agent is deployed and the run's next execution started (deploy.md)
    ended = ExecutionInput.model_validate_json(execution["input"])
    again = ended.model_copy(update={"generation": ended.generation + 1})
    stack.sfn.start_execution(
        stateMachineArn=stack.state_machine_arn,
        name=execution_name("gone", again.generation),
        input=again.model_dump_json(),
    )

    # Then the run goes on from where it was left, each step once
    assert stack.finished(execution_name("gone", 1))["status"] == "SUCCEEDED"
    assert stack.head("gone").status is RunStatus.DONE
    assert set(agents.WORLD.deliveries_of("gone").values()) == {1}


def test_a_run_worked_from_python_on_the_stacks_tables_asks_its_person(stack: Stack):
    # Given the stack's tables and state machine, as its StoreUrl output names them
    client = Client(_wiring.runtime(), agents=_wiring.agents())

    # When a run worked in this process parks for a person
    waiting = client.run(run_id="py-1", scenario="migration", input={"batches": 3})
    assert waiting.status is RunStatus.WAITING
    # (every step up to the wait committed by this process: the execution it hands the run to
    # may already be under way, and invoke the step function to find the run parked)
    workers = {c.worker for c in client.history("py-1") if c.version <= waiting.version}
    assert all(w.startswith(client.worker_id) for w in workers), workers

    # Then the request is opened and its approver emailed, as for a run worked on AWS, and
    # deciding through the link takes the run to its end
    approval = stack.parked("py-1", timeout=30)
    assert approval.step == waiting.step
    assert stack.submit(stack.link("py-1"), "approve").status == 200
    assert stack.finished(execution_name("py-1", 0))["status"] == "SUCCEEDED"
    assert stack.head("py-1").status is RunStatus.DONE
    assert stack.decisions("py-1") == [(True, APPROVER, "")]
