"""A model call is paid for even when its attempt fails afterwards: the tokens of an attempt
whose tool raised, whose decision the agent refused, or whose tool can never succeed are kept
in that attempt's record (`attempt_failed`, or the `finished` record of a failed run) and in
the run's totals, so `ratchet status` and the cost estimate count every call made."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import BaseModel

from ratchet.engine import Engine, Outcome
from ratchet.errors import ModelOutputInvalid, PermanentError, ToolFailed
from ratchet.ports import ModelReply, ModelRequest
from ratchet.state import AttemptFailed, Done, Finished, RunStatus, StepCompleted, ToolCall, Usage
from ratchet.tools import Agent, Tool, ToolContext
from tests.support import Harness, StubModel

CALL = Usage(input_tokens=1_000, output_tokens=50, cache_read_tokens=200, calls=1)


class Note(BaseModel):
    text: str


class Paid:
    """A model that answers `tool_name` at every call, at the price of `CALL`."""

    def __init__(self, tool_name: str = "write_note") -> None:
        self.tool_name = tool_name
        self.calls = 0

    def decide(self, request: ModelRequest) -> ModelReply:
        self.calls += 1
        if request.view.messages:
            return ModelReply(decision=Done(summary="wrote it"), usage=CALL)
        return ModelReply(
            decision=ToolCall(name=self.tool_name, arguments={"text": "hi"}), usage=CALL
        )


def _engine(harness: Harness, tool: Callable[[Note, ToolContext], str], model: Paid) -> Engine:
    agent = Agent(name="notes", tools=[Tool("write_note", "Write a note.", Note, tool)])
    return harness.engine_for(agent, model)


@pytest.fixture
def harness(tmp_path) -> Harness:
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    return harness


def _records(harness: Harness) -> list[object]:
    return [c.event for c in harness.store.list_checkpoints("run")]


def test_an_attempt_whose_tool_raised_keeps_its_model_calls_tokens(harness):
    calls = []

    def flaky(args: Note, ctx: ToolContext) -> str:
        calls.append(args.text)
        if len(calls) == 1:
            raise ConnectionError("the notes service dropped the connection")
        return "noted"

    model = Paid()
    engine = _engine(harness, flaky, model)

    with pytest.raises(ToolFailed) as raised:
        engine.advance("run")
    assert raised.value.usage == CALL  # what the worker sees, too
    while engine.advance("run").outcome is Outcome.CONTINUE:
        pass

    (failed,) = [e for e in _records(harness) if isinstance(e, AttemptFailed)]
    assert failed.usage == CALL
    # The retry reused the recorded decision: no second call for step 1, one for the finish.
    assert model.calls == 2
    step = next(e for e in _records(harness) if isinstance(e, StepCompleted))
    assert step.usage is None
    head = engine.load("run")
    assert head.status is RunStatus.DONE
    assert head.usage == CALL + CALL


def test_a_decision_the_agent_refuses_keeps_its_tokens(harness):
    engine = _engine(harness, lambda args, ctx: "noted", Paid(tool_name="no_such_tool"))

    with pytest.raises(ModelOutputInvalid):
        engine.advance("run")

    (failed,) = [e for e in _records(harness) if isinstance(e, AttemptFailed)]
    assert failed.usage == CALL
    assert engine.load("run").usage == CALL


def test_a_run_failed_for_good_keeps_the_tokens_of_its_last_attempt(harness):
    def broken(args: Note, ctx: ToolContext) -> str:
        raise PermanentError("the notebook is gone")

    engine = _engine(harness, broken, Paid())

    outcome = engine.advance("run")

    assert outcome.outcome is Outcome.FAILED
    finished = _records(harness)[-1]
    assert isinstance(finished, Finished)
    assert finished.usage == CALL
    assert engine.load("run").usage == CALL


class NoSummary(Paid):
    """Asked for a summary of the oldest steps, it answers with another tool call."""

    def decide(self, request: ModelRequest) -> ModelReply:
        self.calls += 1
        decision = ToolCall(name="write_note", arguments={"text": f"n{self.calls}"})
        return ModelReply(decision=decision, usage=CALL)


def test_a_summary_the_engine_refuses_keeps_the_tokens_of_both_calls(harness):
    agent = Agent(
        name="notes", tools=[Tool("write_note", "Write a note.", Note, lambda args, ctx: "noted")]
    )
    engine = harness.engine_for(agent, NoSummary())
    harness.start("summarised", memory_window=1, model_summary=True)
    engine.advance("summarised")  # step 1: nothing to summarise yet

    with pytest.raises(ModelOutputInvalid, match="summary"):
        engine.advance("summarised")  # step 2 decides, then asks for a summary of step 1

    failed = [e for e in _records_of(harness, "summarised") if isinstance(e, AttemptFailed)]
    assert [f.usage for f in failed] == [CALL + CALL]  # the decision's call and the summary's


def _records_of(harness: Harness, run_id: str) -> list[object]:
    return [c.event for c in harness.store.list_checkpoints(run_id)]
