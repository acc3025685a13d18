"""Step time limits: the engine abandons agent code that overruns the agent's limit, records
the attempt as timed out, and never commits what the abandoned code returns later.

The hung tools here block on an event that only the test sets, after the engine has given up;
nothing depends on how fast the machine is, beyond setting up a trivial agent and calling a
scripted model within the 0.5 s limit being enforced."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from ratchet.adapters.scripted import ScriptedModel
from ratchet.engine import Binding, Engine, Outcome
from ratchet.errors import AbandonedCallRunning, StepTimedOut, ToolFailed
from ratchet.ports import ModelRequest, StepView
from ratchet.runtime.models import Bindings
from ratchet.state import AttemptFailed, Decision, Done, RunOptions, RunState, RunStatus, ToolCall
from ratchet.tools import (
    DEFAULT_STEP_TIMEOUT_SECONDS,
    MAX_STEP_TIMEOUT_SECONDS,
    Agent,
    RunContext,
    Tool,
    ToolContext,
)
from tests.support import LOG, Harness, StubModel

LIMIT = 0.5


class Nothing(BaseModel):
    pass


@dataclass
class HungTool:
    """Blocks until the test releases it, then answers; says when it has finished."""

    release: threading.Event = field(default_factory=threading.Event)
    started: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    finished: threading.Event = field(default_factory=threading.Event)
    calls: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def __call__(self, args: Nothing, ctx: ToolContext) -> str:
        self.calls.append(ctx.idempotency_key)
        self.threads.append(threading.current_thread())
        self.started.release()
        try:
            assert self.release.wait(timeout=60), "the test never released the hung tool"
            return "finished late"
        finally:
            self.finished.set()


@dataclass
class NaiveCounter:
    """A check-then-write tool with no idempotency: reads the counter, waits until the test
    lets this call go on, then writes what it read plus one. Counts the calls running at once."""

    value: int = 0
    keys: list[str] = field(default_factory=list)
    running: int = 0
    most_at_once: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _go: dict[int, threading.Event] = field(default_factory=dict)
    _ended: dict[int, threading.Event] = field(default_factory=dict)

    def _events(self, call: int) -> tuple[threading.Event, threading.Event]:
        with self._lock:
            go = self._go.setdefault(call, threading.Event())
            return go, self._ended.setdefault(call, threading.Event())

    def let_go(self, call: int, *, wait: bool = True) -> None:
        """Let call `call` (0 first) go on; with `wait`, until it has written and ended."""
        go, ended = self._events(call)
        go.set()
        if wait:
            assert ended.wait(timeout=30), f"call {call} never ended"

    def release_all(self) -> None:
        for call in range(len(self.keys) + 3):
            self.let_go(call, wait=False)

    def __call__(self, args: Nothing, ctx: ToolContext) -> str:
        with self._lock:
            call = len(self.keys)
            self.keys.append(ctx.idempotency_key)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        go, ended = self._events(call)
        try:
            seen = self.value
            assert go.wait(timeout=60), "the test never let the call go on"
            self.value = seen + 1
            return f"counter is {self.value}"
        finally:
            with self._lock:
                self.running -= 1
            ended.set()


@pytest.fixture
def counter() -> Iterator[NaiveCounter]:
    tool = NaiveCounter()
    yield tool
    tool.release_all()  # let the abandoned threads end with the test


def counter_agent(tool: NaiveCounter) -> Agent:
    return Agent(
        name="counts",
        tools=[Tool("hang", "Add one to the counter.", Nothing, tool)],
        step_timeout_seconds=LIMIT,
    )


def engine_with(harness: Harness, agent: Agent, **options: Any) -> Engine:
    return harness.engine_for(agent, ScriptedModel(hang_then_done), **options)


def hang_then_done(view: StepView) -> Decision:
    if view.step == 1:
        return ToolCall(name="hang")
    return Done(summary="done")


@pytest.fixture
def hung() -> Iterator[HungTool]:
    tool = HungTool()
    yield tool
    tool.release.set()  # let the abandoned threads end with the test


def hung_agent(tool: HungTool) -> Agent:
    return Agent(
        name="hangs",
        tools=[Tool("hang", "Hang.", Nothing, tool)],
        step_timeout_seconds=LIMIT,
    )


def test_a_hung_tool_times_out_and_counts_one_strike(tmp_path, hung):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    engine = harness.engine_for(hung_agent(hung), ScriptedModel(hang_then_done))

    with pytest.raises(StepTimedOut, match=r"step 1 timed out after 0\.5 s \(in tool hang\)"):
        engine.advance("run")

    head = engine.load("run")
    assert (head.status, head.step, head.attempts) == (RunStatus.RUNNING, 0, 1)
    assert head.error is not None
    assert head.error.startswith("step 1 timed out after 0.5 s")
    events = [c.event for c in harness.store.list_checkpoints("run")]
    assert [e.kind for e in events] == ["created", "attempt_failed"]
    assert hung.started.acquire(timeout=30)
    assert hung.threads[0] is not threading.current_thread()
    assert hung.threads[0].daemon, "a hung tool must not keep the process alive"


def test_the_late_completion_of_an_abandoned_step_changes_nothing(tmp_path, hung):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    engine = harness.engine_for(hung_agent(hung), ScriptedModel(hang_then_done))
    with pytest.raises(StepTimedOut):
        engine.advance("run")
    after_timeout = engine.load("run")
    checkpoints = harness.store.list_checkpoints("run")

    # When the abandoned tool finally returns
    assert hung.started.acquire(timeout=30)
    hung.release.set()
    assert hung.finished.wait(timeout=30)
    hung.threads[0].join(timeout=30)

    # Then nothing it returned was written, and the ledger still has the step in progress
    assert engine.load("run") == after_timeout
    assert harness.store.list_checkpoints("run") == checkpoints
    entry = harness.ledger.get("run/step-1")
    assert entry is not None
    assert entry.result is None


def test_the_third_timeout_fails_the_run_with_the_cause(tmp_path, counter):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    engine = engine_with(harness, counter_agent(counter), abandoned_grace_seconds=0)

    # Each attempt's call overruns, and ends (is let go) before the next attempt
    for call in range(2):
        with pytest.raises(StepTimedOut, match=r"\(in tool hang\)"):
            engine.advance("run")
        counter.let_go(call)
    # The third strike: its own call still runs, so the run is left as it is for now
    with pytest.raises(AbandonedCallRunning, match="not marked failed while it may still act"):
        engine.advance("run")
    counter.let_go(2)
    outcome = engine.advance("run")

    assert outcome.outcome is Outcome.FAILED
    head = engine.load("run")
    assert head.status is RunStatus.FAILED
    assert head.error == (
        "step 1 failed 3 times; last error: step 1 timed out after 0.5 s (in tool hang); "
        "the late result, if any, is discarded"
    )
    assert counter.keys == ["run/step-1"] * 3, "each attempt ran the tool once, with the same key"
    assert counter.most_at_once == 1
    failed = [c.event for c in harness.store.list_checkpoints("run")]
    assert [e.attempt for e in failed if isinstance(e, AttemptFailed)] == [1, 2]


def test_a_hung_model_call_times_out_too(tmp_path, hung):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()

    @dataclass
    class HungModel:
        def decide(self, request: ModelRequest) -> Decision:
            hung.calls.append("model")
            assert hung.release.wait(timeout=60)
            return Done(summary="too late")

    engine = harness.engine_for(hung_agent(hung), HungModel())

    with pytest.raises(StepTimedOut, match=r"\(in the model call\)"):
        engine.advance("run")

    assert harness.ledger.get("run/step-1") is None, "a decision that came too late is not kept"


def test_a_step_within_the_limit_is_untouched_and_a_tool_error_keeps_its_cause(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()

    def broken(args: Nothing, ctx: ToolContext) -> str:
        raise ZeroDivisionError("division by zero")

    agent = Agent(
        name="quick", tools=[Tool("hang", "Fails.", Nothing, broken)], step_timeout_seconds=30
    )
    engine = harness.engine_for(agent, ScriptedModel(hang_then_done))

    with pytest.raises(ToolFailed, match="hang raised ZeroDivisionError: division by zero") as e:
        engine.advance("run")
    assert isinstance(e.value.__cause__, ZeroDivisionError)


class Note(BaseModel):
    text: str


def test_resources_opened_by_the_agent_stay_on_the_thread_its_tools_run_on(tmp_path):
    # SQLite connections may only be used on the thread that opened them: the agent's hook and
    # its tools must share one thread, step after step.
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start(max_steps=5)

    def open_notes(ctx: RunContext) -> sqlite3.Connection:
        db = sqlite3.connect(ctx.workdir / "notes.db", isolation_level=None)
        db.execute("CREATE TABLE IF NOT EXISTS notes (key TEXT PRIMARY KEY, text TEXT)")
        return db

    def write(args: Note, ctx: ToolContext) -> str:
        ctx.resources.execute(
            "INSERT OR IGNORE INTO notes VALUES (?, ?)", (ctx.idempotency_key, args.text)
        )
        return "noted"

    def policy(view: StepView) -> Decision:
        if view.step > 3:
            return Done(summary="three notes")
        return ToolCall(name="write", arguments={"text": f"note {view.step}"})

    agent = Agent(
        name="notes",
        tools=[Tool("write", "Write a note.", Note, write)],
        policy=policy,
        resources=open_notes,
    )

    class Registry:
        def load(self, name: str) -> Agent:
            return agent

    tmp_path.joinpath("data").mkdir()
    bindings = Bindings(
        lambda run_id, options: RunContext(run_id, options, tmp_path / "data"),
        anthropic_api_key=None,
        agents=Registry(),  # type: ignore[arg-type]
    )
    engine = Engine(
        store=harness.store,
        ledger=harness.ledger,
        blobs=harness.blobs,
        bind=bindings,
        worker_id="w",
        logger=LOG,
    )

    for _ in range(4):
        engine.advance("run")

    head = engine.load("run")
    assert (head.status, head.step, head.error) == (RunStatus.DONE, 3, None)


@pytest.mark.parametrize("limit", [0, 0.05, -1, 841, float("inf"), float("nan"), True, "60"])
def test_a_step_time_limit_must_be_a_bounded_number_of_seconds(limit):
    with pytest.raises(ValueError, match="step_timeout_seconds must be a number of seconds"):
        Agent(name="a", tools=[], step_timeout_seconds=limit)


def test_the_step_time_limit_defaults_and_is_exposed(tmp_path):
    assert Agent(name="a", tools=[]).step_timeout_seconds == DEFAULT_STEP_TIMEOUT_SECONDS == 120
    assert MAX_STEP_TIMEOUT_SECONDS == 840
    harness = Harness(tmp_path, StubModel(total=1))
    state = RunState(run_id="r", agent="fake", goal="g", options=RunOptions())

    assert harness.engine.step_timeout(state) == DEFAULT_STEP_TIMEOUT_SECONDS


def test_after_a_timeout_the_next_attempt_opens_its_own_resources(tmp_path, hung):
    # Given an agent whose resources are opened once per run and process
    opened: list[int] = []

    def resources(ctx: RunContext) -> int:
        opened.append(len(opened) + 1)
        return len(opened)

    agent = Agent(
        name="hangs",
        tools=[Tool("hang", "Hang.", Nothing, hung)],
        step_timeout_seconds=LIMIT,
        resources=resources,
        policy=hang_then_done,
    )
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    bindings = Bindings(
        lambda run_id, options: RunContext(run_id, options, tmp_path / "data"),
        anthropic_api_key=None,
    )
    bindings._bound["run"] = Binding(agent, ScriptedModel(hang_then_done), resources(None))  # type: ignore[arg-type]
    engine = Engine(
        store=harness.store,
        ledger=harness.ledger,
        blobs=harness.blobs,
        bind=bindings,
        unbind=bindings.forget,
        worker_id="w",
        logger=LOG,
    )

    # When its step times out
    with pytest.raises(StepTimedOut):
        engine.advance("run")

    # Then the abandoned step keeps what it had, and the run's binding is dropped, so the
    # next attempt sets the agent up afresh instead of sharing resources with the hung thread
    assert "run" not in bindings._bound
    assert opened == [1]


def test_the_retry_waits_for_the_abandoned_call_and_never_runs_the_tool_beside_it(
    tmp_path, counter
):
    # Given a naive check-then-write tool whose first call overran the step's deadline
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    engine = engine_with(harness, counter_agent(counter))
    with pytest.raises(StepTimedOut, match=r"\(in tool hang\)"):
        engine.advance("run")

    # When the next attempt comes while that call still runs
    with pytest.raises(StepTimedOut, match="waiting for the call an earlier attempt abandoned"):
        engine.advance("run")

    # Then it spent its time waiting and called nothing beside it
    assert counter.keys == ["run/step-1"]
    # And once the abandoned call has ended, the next attempt calls the tool, which reads
    # what the abandoned call wrote: one call at a time, never two at once
    counter.let_go(0)
    counter.let_go(1, wait=False)
    assert engine.advance("run").outcome is Outcome.CONTINUE
    assert counter.keys == ["run/step-1"] * 2
    assert counter.most_at_once == 1
    assert counter.value == 2
    assert engine.load("run").last_result == "counter is 2"


def test_a_run_is_not_failed_while_its_abandoned_call_still_runs(tmp_path, counter):
    # Given a run whose first call overran its deadline and never ends by itself
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    engine = engine_with(harness, counter_agent(counter), abandoned_grace_seconds=0)
    for _ in range(2):
        with pytest.raises(StepTimedOut):
            engine.advance("run")
    checkpoints = harness.store.list_checkpoints("run")

    # When its third attempt spends its time waiting too, using up its strikes
    with pytest.raises(AbandonedCallRunning, match="a call of step 1 abandoned"):
        engine.advance("run")

    # Then the run is left running, with nothing written, while the call may still act
    head = engine.load("run")
    assert (head.status, head.attempts) == (RunStatus.RUNNING, 3)
    assert harness.store.list_checkpoints("run") == checkpoints
    assert engine.abandoned_call_running("run")
    # And once the call has ended (its late write landed before the run fails), it is failed
    counter.let_go(0)
    assert not engine.abandoned_call_running("run")
    assert engine.advance("run").outcome is Outcome.FAILED
    assert counter.keys == ["run/step-1"], "the tool ran once: no attempt ran it beside itself"
    assert engine.load("run").error == (
        "step 1 failed 3 times; last error: step 1 timed out after 0.5 s (waiting for the call "
        "an earlier attempt abandoned, still running in this process); nothing was called "
        "beside it"
    )
