"""Several steps per invocation of the step function (`ratchet.engine.budget`), executed by the
state machine on moto: fewer invocations and transitions, every step still committed before
the next and counting its own attempt as it begins, a crash between two steps costing at most
one and leaving no strike on a step that never began, and the time the invocation has left
deciding whether another step fits."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from ratchet.adapters.stepfunctions import execution_name
from ratchet.faults import Fault, FaultAction, FaultPoint
from ratchet.handlers import _wiring
from ratchet.state import RunStatus, StepCompleted
from tests.integration.aws import agents
from tests.integration.aws.harness import Stack, entered_states, wait_until
from tests.integration.aws.test_state_machine import FirstTimeOnly, _errors, _inject

ROWS_AGENT = "tests.integration.aws.agents:rows"
QUICK_AGENT = "tests.integration.aws.agents:quick"


def _run(stack: Stack, run_id: str, batches: int, agent: str = ROWS_AGENT) -> str:
    _, started = stack.post_run({"agent": agent, "run_id": run_id, "batches": batches})
    execution = stack.finished(started["execution_name"])
    assert execution["status"] == "SUCCEEDED", execution
    assert stack.head(run_id).status is RunStatus.DONE
    return str(started["execution_name"])


def _steps(run_id: str) -> list[StepCompleted]:
    checkpoints = _wiring.runtime().store.list_checkpoints(run_id)
    return [c.event for c in checkpoints if isinstance(c.event, StepCompleted)]


def _steps_per_invocation(run_id: str) -> list[int]:
    """Step records by the invocation that committed them (its worker id names the request),
    in order."""
    checkpoints = _wiring.runtime().store.list_checkpoints(run_id)
    invocations = [c.worker_id for c in checkpoints if isinstance(c.event, StepCompleted)]
    return [len(list(group)) for _, group in itertools.groupby(invocations)]


def _step_invocations(stack: Stack) -> int:
    return sum(1 for name, _ in stack.lambdas.invocations if name == "ratchet-step")


def _each_invocation_has(seconds: Callable[[], Callable[[], float]], stack: Stack) -> None:
    stack.lambdas.clocks["ratchet-step"] = seconds


def test_a_scripted_run_takes_its_steps_ten_at_a_time_each_committed_before_the_next(
    stack: Stack,
):
    stack.configure(max_steps_per_invocation=10)

    name = _run(stack, "many", batches=24)

    # 24 rows and DONE: 10 + 10 + 4 tool steps and the DONE in three invocations, not 25.
    assert _step_invocations(stack) == 3
    assert entered_states(stack.history(name)).count("Step") == 3
    assert _steps_per_invocation("many") == [10, 10, 4]
    steps = _steps("many")
    assert [s.step for s in steps] == list(range(1, 25))
    assert agents.WORLD.rows_of("many") == {f"many/step-{n}": n for n in range(1, 25)}
    assert set(agents.WORLD.deliveries_of("many").values()) == {1}
    assert {s.attempt for s in steps} == {1}


def test_one_step_per_invocation_is_the_loop_as_it_was(stack: Stack):
    stack.configure(max_steps_per_invocation=1)

    _run(stack, "single", batches=4)

    assert _step_invocations(stack) == 5
    assert _steps_per_invocation("single") == [1, 1, 1, 1]
    assert {s.attempt for s in _steps("single")} == {1}


@pytest.mark.parametrize(
    ("seconds_left", "agent", "per_invocation"),
    [
        # The rows agent's step time limit is the default 120 s: another step needs 180 s.
        (180.0, ROWS_AGENT, [5]),
        (179.9, ROWS_AGENT, [1, 1, 1, 1, 1]),
        # The quick agent's is 10 s: 70 s hold another of its steps.
        (70.0, QUICK_AGENT, [5]),
        (69.9, QUICK_AGENT, [1, 1, 1, 1, 1]),
    ],
)
def test_another_step_is_taken_only_while_the_time_left_holds_the_agents_step_limit(
    stack: Stack, seconds_left: float, agent: str, per_invocation: list[int]
):
    stack.configure(max_steps_per_invocation=1000)
    _each_invocation_has(lambda: lambda: seconds_left, stack)
    run_id = f"timed-{agent.rpartition(':')[2]}-{seconds_left}"

    _run(stack, run_id, batches=5, agent=agent)

    assert _steps_per_invocation(run_id) == per_invocation
    assert set(agents.WORLD.deliveries_of(run_id).values()) == {1}


def test_an_invocation_stops_when_its_time_runs_down(stack: Stack):
    stack.configure(max_steps_per_invocation=1000)

    def clock() -> Callable[[], float]:
        # Each step takes 100 s of the invocation's 900 (read once a step, after its commit).
        left = itertools.count(900, -100)
        return lambda: float(next(left))

    _each_invocation_has(clock, stack)

    _run(stack, "running-down", batches=12)

    # 900 ... 200 s left after steps 1-8 hold another 180 s step; 100 s after step 9 do not.
    assert _steps_per_invocation("running-down") == [9, 3]
    assert {s.attempt for s in _steps("running-down")} == {1}


CRASHES_BETWEEN_TWO_STEPS = [
    # After step 3's commit, before step 4 began: nothing of step 4 happened, nor was counted,
    # and the retry, finding it not begun, took no step: the next entry of Step took the rest.
    (Fault(FaultAction.RAISE, FaultPoint.AFTER_COMMIT, 3), False, 1, [3, 3]),
    # Inside step 4, its row written but not committed: step 4 is taken again with its key,
    # alone by the retry, and the next entry of Step takes the rest.
    (Fault(FaultAction.RAISE, FaultPoint.AFTER_TOOL, 4), True, 2, [3, 1, 2]),
    (Fault(FaultAction.RAISE, FaultPoint.BEFORE_COMMIT, 4), True, 2, [3, 1, 2]),
    (Fault(FaultAction.RAISE, FaultPoint.BEFORE_MODEL, 4), False, 2, [3, 1, 2]),
]


@pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")  # a crash records none
@pytest.mark.parametrize(
    ("fault", "step_4_delivered_twice", "step_4_attempt", "invocations"),
    CRASHES_BETWEEN_TWO_STEPS,
)
def test_a_crash_inside_an_invocation_costs_at_most_the_step_it_is_in(
    stack: Stack,
    monkeypatch: pytest.MonkeyPatch,
    fault: Fault,
    step_4_delivered_twice: bool,
    step_4_attempt: int,
    invocations: list[int],
):
    stack.configure(max_steps_per_invocation=10)
    _inject(monkeypatch, FirstTimeOnly((fault,)))
    run_id = f"crashed-{fault.point}"

    name = _run(stack, run_id, batches=6)

    assert _errors(stack.history(name)) == ["Lambda.Unknown"]
    # Steps 1-3 committed in the invocation that crashed and were never taken again.
    assert _steps_per_invocation(run_id) == invocations
    deliveries = agents.WORLD.deliveries_of(run_id)
    twice = {f"{run_id}/step-4": 2} if step_4_delivered_twice else {}
    assert {k: n for k, n in deliveries.items() if n != 1} == twice
    assert agents.WORLD.rows_of(run_id) == {f"{run_id}/step-{n}": n for n in range(1, 7)}
    # A crash inside step 4 stands as its first attempt (counted as it began), and the retry is
    # the second; a crash before it began is no attempt of it.
    attempts = {s.step: s.attempt for s in _steps(run_id)}
    assert attempts == {1: 1, 2: 1, 3: 1, 4: step_4_attempt, 5: 1, 6: 1}


@pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")  # a crash records none
@pytest.mark.parametrize(
    ("agent", "status"), [("twice", RunStatus.DONE), ("failing", RunStatus.FAILED)]
)
def test_an_invocation_killed_between_two_steps_leaves_no_strike_on_the_next(
    stack: Stack, agent: str, status: RunStatus
):
    # Given an invocation killed right after step 2's commit, before step 3 began
    stack.configure(max_steps_per_invocation=10)
    stack.fault("kill:after_commit@2")
    run_id = f"between-{agent}"

    # When step 3 then fails (its tool raises) in each invocation that retries it: twice and
    # then goes, or every time
    _, started = stack.post_run(
        {"agent": f"tests.integration.aws.agents:{agent}", "run_id": run_id, "batches": 4}
    )
    execution = stack.finished(started["execution_name"])

    # Then the run fails only at step 3's third failure (the engine's own), not its second:
    # the death before step 3 began was no attempt of it
    assert _errors(stack.history(started["execution_name"])) == [
        "Runtime.ExitError",
        "ToolFailed",
        "ToolFailed",
    ]
    head = stack.head(run_id)
    assert head.status is status
    if status is RunStatus.DONE:
        assert execution["status"] == "SUCCEEDED"
        attempts = {s.step: s.attempt for s in _steps(run_id)}
        assert attempts == {1: 1, 2: 1, 3: 3, 4: 1}
        assert agents.WORLD.rows_of(run_id) == {f"{run_id}/step-{n}": n for n in range(1, 5)}
    else:
        assert (execution["status"], execution["error"]) == ("FAILED", "RunFailed")
        assert (head.step, head.attempts) == (2, 3)
        assert (head.error or "").startswith("step 3 failed 3 times; last error: ")
        assert "the disk is full" in (head.error or "")


@pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")  # a crash records none
def test_a_death_between_two_steps_spends_none_of_the_next_steps_retries(stack: Stack):
    # Given an invocation killed right after step 2's commit, before step 3 began, and then
    # two invocations killed inside step 3 (after its tool ran)
    stack.configure(max_steps_per_invocation=10)
    stack.fault("kill:after_commit@2,kill:after_tool@3", times=3)
    run_id = "deaths"

    _, started = stack.post_run(
        {"agent": "tests.integration.aws.agents:rows", "run_id": run_id, "batches": 4}
    )
    execution = stack.finished(started["execution_name"])

    # Then step 3 died twice, its third attempt went through and the run is done: the death
    # before it began spent none of the retries Step Functions gives its deaths (the retry
    # that found it not begun entered Step anew)
    assert _errors(stack.history(started["execution_name"])) == ["Runtime.ExitError"] * 3
    assert execution["status"] == "SUCCEEDED", execution
    assert stack.head(run_id).status is RunStatus.DONE
    attempts = {s.step: s.attempt for s in _steps(run_id)}
    assert attempts == {1: 1, 2: 1, 3: 3, 4: 1}
    assert agents.WORLD.rows_of(run_id) == {f"{run_id}/step-{n}": n for n in range(1, 5)}


def test_a_run_that_waits_mid_invocation_parks_on_its_task_token(stack: Stack):
    stack.configure(max_steps_per_invocation=100)
    _, started = stack.post_run({"scenario": "migration", "batches": 3, "run_id": "parks"})

    approval = stack.parked("parks")

    # inspect and three copies, then the step that asks: one invocation, parked for a person.
    assert _step_invocations(stack) == 1
    assert _steps_per_invocation("parks") == [5]
    assert approval.step == 5
    assert entered_states(stack.history(started["execution_name"]))[-1] == "AwaitApproval"


def test_a_rollover_comes_after_as_many_invocations_not_steps(stack: Stack):
    stack.configure(rollover_after=2, max_steps_per_invocation=2)
    stack.post_run({"agent": ROWS_AGENT, "run_id": "rolls", "batches": 7})
    names = [execution_name("rolls", generation) for generation in range(2)]

    wait_until(lambda: len(stack.executions()) == 2, what="the successor execution")

    assert [e["name"] for e in stack.executions()] == names
    assert [stack.finished(name)["status"] for name in names] == ["SUCCEEDED"] * 2
    # 7 rows and DONE, two a time: two invocations in each execution.
    assert _steps_per_invocation("rolls") == [2, 2, 2, 1]
    assert [entered_states(stack.history(name)).count("Step") for name in names] == [2, 2]
    assert stack.head("rolls").status is RunStatus.DONE
    assert set(agents.WORLD.deliveries_of("rolls").values()) == {1}


def test_failures_of_different_steps_do_not_add_up_to_the_retries_of_one(stack: Stack):
    # The state machine retries a failed step twice, counting per entry of its Step state:
    # three failures in one entry fail the run, whichever steps they were.
    stack.configure(max_steps_per_invocation=100)

    name = _run(stack, "flaky", batches=10, agent="tests.integration.aws.agents:flaky")

    assert _errors(stack.history(name)) == ["ToolFailed"] * 3
    steps = _steps("flaky")
    assert [s.step for s in steps] == list(range(1, 11))
    assert {s.step: s.attempt for s in steps if s.attempt != 1} == {3: 2, 6: 2, 9: 2}
    # Each retry took its step alone; the next entry of Step went on from there.
    assert _steps_per_invocation("flaky") == [2, 1, 2, 1, 2, 1, 1]
    assert agents.WORLD.rows_of("flaky") == {f"flaky/step-{n}": n for n in range(1, 11)}
