"""What no retry can fix fails the run at once, with the error kept: a `PermanentError` from a
tool or a policy, and a recorded decision the agent now refuses. Any other exception from a
tool stays one counted attempt of three."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, Field

import ratchet
from ratchet import errors, tools
from ratchet.adapters.scripted import ScriptedModel
from ratchet.adapters.sqlite.leases import SqliteLeases
from ratchet.engine import Engine, Outcome
from ratchet.errors import InjectedFault, PermanentError, ToolFailed
from ratchet.faults import NO_FAULTS, FaultPlan
from ratchet.ports import StepView
from ratchet.state import AttemptFailed, Decision, Done, Finished, RunStatus, ToolCall
from ratchet.tools import Agent, Tool, ToolContext
from ratchet.worker import Worker
from tests.processes import Cli
from tests.support import LOG, Harness, StubModel


class Order(BaseModel):
    order_id: str


class ShortOrder(BaseModel):
    """The same tool after a deploy that tightened its arguments."""

    order_id: str = Field(max_length=3)


def lookup_once(view: StepView) -> Decision:
    if view.step == 1:
        return ToolCall(name="lookup_order", arguments={"order_id": "A-100"})
    return Done(summary="looked it up")


class Lookup:
    """A tool that counts its calls and answers with what `answer` returns."""

    def __init__(self, answer: Callable[[Order], str]) -> None:
        self.answer = answer
        self.calls: list[str] = []

    def __call__(self, args: Order, ctx: ToolContext) -> str:
        self.calls.append(args.order_id)
        return self.answer(args)


def engine_with(
    harness: Harness,
    tool: Callable[[Any, ToolContext], str],
    *,
    policy: Callable[[StepView], Decision] = lookup_once,
    args: type[BaseModel] = Order,
    name: str = "lookup_order",
    faults: FaultPlan = NO_FAULTS,
) -> Engine:
    agent = Agent(name="shop", tools=[Tool(name, "Look an order up.", args, tool)])
    return harness.engine_for(agent, ScriptedModel(policy), faults=faults)


def _no_such_order(args: Order) -> str:
    raise PermanentError(f"no order {args.order_id}")


@pytest.fixture
def harness(tmp_path) -> Harness:
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    return harness


def test_a_tool_raising_permanent_error_fails_the_run_at_once_with_the_error_kept(
    harness, tmp_path
):
    # Given a tool that knows retrying cannot help
    lookup = Lookup(_no_such_order)
    pauses: list[float] = []
    worker = Worker(
        engine_with(harness, lookup), SqliteLeases(harness.db), LOG, sleep=pauses.append
    )

    # When a worker works the run
    worker.run(until_idle=True)

    # Then the run failed on the first attempt, without a pause or a second call
    expected = "step 1 failed and cannot succeed on retry: PermanentError: no order A-100"
    head = harness.engine.load("run")
    assert (head.status, head.error, head.attempts) == (RunStatus.FAILED, expected, 1)
    assert lookup.calls == ["A-100"]
    assert pauses == []
    events = [c.event for c in harness.store.list_checkpoints("run")]
    assert [e.kind for e in events] == ["created", "finished"]
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert (finished.status, finished.error, finished.attempts) == (
        RunStatus.FAILED,
        expected,
        1,
    )

    # And the command line shows it
    cli = Cli(tmp_path)
    status = cli.json("status", "run")
    assert (status["status"], status["error"], status["attempts"]) == ("failed", expected, 1)
    history = cli.json("history", "run")["checkpoints"]
    assert [(c["event"], c["status"]) for c in history] == [
        ("created", "running"),
        ("finished", "failed"),
    ]


def test_a_policy_raising_permanent_error_fails_the_run_at_once(harness):
    def give_up(view: StepView) -> Decision:
        raise PermanentError("the goal names no order")

    lookup = Lookup(lambda args: "found")

    outcome = engine_with(harness, lookup, policy=give_up).advance("run")

    assert outcome.outcome is Outcome.FAILED
    assert harness.engine.load("run").error == (
        "step 1 failed and cannot succeed on retry: PermanentError: the goal names no order"
    )
    assert lookup.calls == []


def _declined_over_a_dropped_connection(args: Order) -> str:
    try:
        raise ConnectionError("connection reset by peer")
    except ConnectionError as dropped:
        raise PermanentError(f"card declined for {args.order_id}") from dropped


def test_a_permanent_error_raised_from_a_transient_one_is_logged_as_not_transient(harness, caplog):
    # Given a tool that gives up for good, its PermanentError raised from a dropped connection
    lookup = Lookup(_declined_over_a_dropped_connection)

    # When the step fails
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        outcome = engine_with(harness, lookup).advance("run")

    # Then the run fails at once, and the failure is logged as what it is: permanent
    assert outcome.outcome is Outcome.FAILED
    (failed,) = [r for r in caplog.records if r.getMessage() == "step attempt failed"]
    assert (failed.step, failed.error_type, failed.transient) == (1, "ToolFailed", False)
    assert lookup.calls == ["A-100"]


def test_a_transient_cause_alone_is_still_logged_as_transient(harness, caplog):
    def dropped(args: Order) -> str:
        raise ConnectionError("connection reset by peer")

    with caplog.at_level(logging.WARNING, logger=LOG.name), pytest.raises(ToolFailed):
        engine_with(harness, Lookup(dropped)).advance("run")

    (failed,) = [r for r in caplog.records if r.getMessage() == "step attempt failed"]
    assert failed.transient is True


def _decided_then_crashed(harness: Harness) -> None:
    """Step 1's decision is recorded, then the process dies before the tool runs."""
    lookup = Lookup(lambda args: "found")
    engine = engine_with(harness, lookup, faults=FaultPlan.parse("raise:after_decision@1"))
    with pytest.raises(InjectedFault):
        engine.advance("run")
    assert lookup.calls == []


def test_recorded_arguments_the_tool_now_refuses_fail_the_run_at_once(harness):
    # Given a decision recorded under the old argument model, and a deploy that tightened it
    _decided_then_crashed(harness)
    lookup = Lookup(lambda args: "found")
    engine = engine_with(harness, lookup, args=ShortOrder)

    # When the step is retried: the same recorded arguments would fail on every retry
    outcome = engine.advance("run")

    # Then the run fails at once with the reason, and the tool never ran
    assert outcome.outcome is Outcome.FAILED
    head = engine.load("run")
    assert (head.error or "").startswith(
        "step 1 failed and cannot succeed on retry: RecordedDecisionInvalid: recorded "
        "arguments no longer fit lookup_order:"
    )
    assert "order_id" in (head.error or "")
    assert head.attempts == 2  # the attempt that died, and this one
    assert lookup.calls == []
    kinds = [c.event.kind for c in harness.store.list_checkpoints("run")]
    assert kinds == ["created", "finished"]


def test_a_recorded_call_of_a_tool_the_agent_lost_fails_the_run_at_once(harness):
    _decided_then_crashed(harness)
    renamed = Lookup(lambda args: "found")

    outcome = engine_with(harness, renamed, name="find_order").advance("run")

    assert outcome.outcome is Outcome.FAILED
    assert harness.engine.load("run").error == (
        "step 1 failed and cannot succeed on retry: RecordedDecisionInvalid: step 1 asks for "
        "tool 'lookup_order', which this agent lacks"
    )
    assert renamed.calls == []


def test_any_other_exception_from_a_tool_is_one_counted_attempt(harness):
    def broken(args: Order) -> str:
        return str(undefined_name)  # type: ignore[name-defined]  # noqa: F821

    lookup = Lookup(broken)
    engine = engine_with(harness, lookup)

    with pytest.raises(ToolFailed, match="NameError") as raised:
        engine.advance("run")

    assert not errors.is_terminal(raised.value)
    head = engine.load("run")
    assert (head.status, head.attempts) == (RunStatus.RUNNING, 1)
    (failed,) = [
        c.event for c in harness.store.list_checkpoints("run") if isinstance(c.event, AttemptFailed)
    ]
    assert "NameError: name 'undefined_name' is not defined" in failed.error


def test_permanent_error_is_public():
    assert ratchet.PermanentError is tools.PermanentError is errors.PermanentError
    assert "PermanentError" in ratchet.__all__
    assert "PermanentError" in tools.__all__
