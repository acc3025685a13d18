"""Async tools and async resources: run on the process's one event loop by a real worker,
against a real HTTP server the test starts; cancelled at the step deadline (and not fenced
once they end); and, crashed at any point of a step, resumed with the tool's effect applied
once per idempotency key, as a sync tool's is.

The hung coroutines here wait on events only the test sets, after the engine has given up;
nothing depends on the machine's speed beyond a trivial step fitting in the 0.5 s limit."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from ratchet.adapters.scripted import ScriptedModel
from ratchet.client import Client
from ratchet.engine import Outcome
from ratchet.engine.deadline import abandoned_call_running
from ratchet.errors import InjectedFault, StepTimedOut, ToolFailed
from ratchet.faults import STEP_POINTS, FaultPlan, FaultPoint
from ratchet.ports import StepView
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import AttemptFailed, Decision, Done, RunStatus, StepCompleted, ToolCall
from ratchet.tools import Agent, RunContext, Tool, ToolContext, tool
from tests.status_service import StatusService, serving
from tests.support import Harness, StubModel

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "status_agent" / "src"
LOG = logging.getLogger("ratchet.tests.async_tools")
LIMIT = 0.5


@pytest.fixture
def status_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatusService]:
    with serving(monkeypatch) as service:
        yield service


@pytest.fixture
def example_on_path() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLE))
    yield
    sys.path.remove(str(EXAMPLE))


def _runtime(root: Path) -> LocalRuntime:
    return LocalRuntime.open(LocalSettings(store=f"sqlite:///{root / 'ratchet.db'}"))


# --- the example, worked by a worker ----------------------------------------------------------


@pytest.mark.usefixtures("example_on_path")
def test_a_worker_runs_the_async_example_against_a_real_http_server(tmp_path, status_service):
    with Client(_runtime(tmp_path)) as client:
        run = client.run(
            run_id="oncall", agent="status_agent.agent:agent", input={"service": "payments"}
        )
        calls = [c.tool for c in client.history("oncall") if c.event == "step"]

    assert run.status == "done"
    assert run.summary == "payments was down: Incident INC-1 is open for payments."
    assert calls == ["check_service", "open_incident"]
    assert status_service.posts == ["oncall/step-2"]


@pytest.mark.usefixtures("example_on_path")
def test_the_async_example_leaves_a_service_that_is_up_alone(tmp_path, status_service):
    with Client(_runtime(tmp_path)) as client:
        run = client.run(run_id="ok", agent="status_agent.agent:agent", input={"service": "search"})

    assert (run.status, run.summary) == ("done", "search is up; nothing to do.")
    assert status_service.posts == []


# --- crashes around an async tool -------------------------------------------------------------


def _drive(root: Path, faults: FaultPlan) -> bool:
    """Advance the run in a fresh runtime until it stops (False) or a fault fires (True)."""
    runtime = _runtime(root)
    engine = runtime.engine(
        worker_id="crashy" if faults.faults else "clean", logger=LOG, faults=faults
    )
    try:
        for _ in range(20):
            try:
                outcome = engine.advance("oncall")
            except InjectedFault:
                return True
            if outcome.outcome is not Outcome.CONTINUE:
                return False
        raise AssertionError("the run did not stop")
    finally:
        runtime.close()


@pytest.mark.usefixtures("example_on_path")
@pytest.mark.parametrize("point", STEP_POINTS)
@pytest.mark.parametrize("step", [1, 2])
def test_a_crash_at_any_point_of_an_async_step_opens_one_incident(
    tmp_path, status_service, point, step
):
    # Given the example's run, started
    runtime = _runtime(tmp_path)
    Client(runtime).start(
        run_id="oncall", agent="status_agent.agent:agent", input={"service": "payments"}
    )
    runtime.close()

    # When a step crashes at the point, and a fresh process resumes the run
    assert _drive(tmp_path, FaultPlan.parse(f"raise:{point}@{step}")) is True
    assert _drive(tmp_path, FaultPlan()) is False

    # Then it ends as a run that never crashed, with one incident opened under its step key
    runtime = _runtime(tmp_path)
    head = runtime.store.load_head("oncall")
    runtime.close()
    assert head is not None
    assert (head.status, head.summary) == (
        RunStatus.DONE,
        "payments was down: Incident INC-1 is open for payments.",
    )
    assert list(status_service.incidents) == ["oncall/step-2"]
    crashed_after_the_post = step == 2 and point in (
        FaultPoint.AFTER_TOOL,
        FaultPoint.BEFORE_COMMIT,
    )
    # A crash after the call sends it again, with the same key: the service applies it once.
    assert status_service.posts == ["oncall/step-2"] * (2 if crashed_after_the_post else 1)


# --- async resources: once per run, on the tools' loop ----------------------------------------


class Nothing(BaseModel):
    pass


@dataclass
class Pool:
    """What the async resources hook opens: where it was opened."""

    loop: asyncio.AbstractEventLoop
    run_id: str


OPENED: list[Pool] = []
USED: list[tuple[str, asyncio.AbstractEventLoop, str]] = []


async def open_pool(ctx: RunContext) -> Pool:
    await asyncio.sleep(0)
    pool = Pool(asyncio.get_running_loop(), ctx.run_id)
    OPENED.append(pool)
    return pool


@tool()
async def ping(args: Nothing, ctx: ToolContext) -> str:
    """Use the run's pool."""
    pool: Pool = ctx.resources
    USED.append((ctx.run_id, asyncio.get_running_loop(), threading.current_thread().name))
    assert pool.loop is asyncio.get_running_loop()
    return f"pinged at step {ctx.step}"


def ping_three_times(view: StepView) -> Decision:
    return ToolCall(name="ping") if view.step <= 3 else Done(summary="pinged three times")


pinging = Agent(
    name="pinging", goal="Ping.", tools=[ping], policy=ping_three_times, resources=open_pool
)


def test_async_resources_are_opened_once_per_run_on_the_loop_its_tools_run_on(tmp_path):
    OPENED.clear()
    USED.clear()
    with Client(_runtime(tmp_path)) as client:
        for run_id in ("a", "b"):
            run = client.run(run_id=run_id, agent=f"{__name__}:pinging")
            assert run.status == "done"

    assert [pool.run_id for pool in OPENED] == ["a", "b"], "once per run"
    loops = {loop for _, loop, _ in USED} | {pool.loop for pool in OPENED}
    assert len(loops) == 1, "one event loop for the process: the hook's and every tool's"
    assert [run_id for run_id, _, _ in USED] == ["a"] * 3 + ["b"] * 3
    assert {thread for _, _, thread in USED} == {"ratchet-agent-loop"}


# --- the step deadline ------------------------------------------------------------------------


def call_then_done(view: StepView) -> Decision:
    return ToolCall(name="slow") if view.step == 1 else Done(summary="done")


@dataclass
class SlowCoroutine:
    """The first call waits for ever (until cancelled); later calls answer at once. With
    `holds_out`, a cancelled call goes on until the test releases it."""

    holds_out: bool = False
    calls: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, args: Nothing, ctx: ToolContext) -> str:
        self.calls += 1
        if self.calls > 1:
            return f"answered on attempt {ctx.attempt}"
        try:
            await asyncio.sleep(60)
            return "too late"
        except asyncio.CancelledError:
            self.cancelled.set()
            if not self.holds_out:
                raise
            while not self.released.is_set():
                await asyncio.sleep(0.01)
            return "held out"
        finally:
            self.ended.set()


def slow_agent(slow: SlowCoroutine) -> Agent:
    return Agent(
        name="slow",
        tools=[Tool("slow", "Take long.", Nothing, slow)],
        step_timeout_seconds=LIMIT,
    )


def test_an_async_tool_over_its_deadline_is_cancelled_recorded_and_retried_at_once(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    slow = SlowCoroutine()
    engine = harness.engine_for(slow_agent(slow), ScriptedModel(call_then_done))

    with pytest.raises(StepTimedOut, match=r"\(in tool slow\); the coroutine was cancelled and"):
        engine.advance("run")

    # The coroutine was cancelled and has ended: nothing of it runs, so nothing is fenced
    assert slow.cancelled.is_set()
    assert slow.ended.is_set()
    assert not abandoned_call_running("run")
    head = engine.load("run")
    assert (head.status, head.step, head.attempts) == (RunStatus.RUNNING, 0, 1)
    failed = [c.event for c in harness.store.list_checkpoints("run")]
    assert [e.kind for e in failed] == ["created", "attempt_failed"]
    assert isinstance(failed[1], AttemptFailed)

    # The retry runs the tool again with the same key, at once, and the run goes on
    assert engine.advance("run").outcome is Outcome.CONTINUE
    assert engine.advance("run").outcome is Outcome.DONE
    assert slow.calls == 2
    step = harness.store.list_checkpoints("run")[2].event
    assert isinstance(step, StepCompleted)
    assert step.output is not None
    assert step.output.text == "answered on attempt 2"


def test_an_async_tool_that_holds_out_against_its_cancellation_is_fenced(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    slow = SlowCoroutine(holds_out=True)
    engine = harness.engine_for(
        slow_agent(slow), ScriptedModel(call_then_done), abandoned_grace_seconds=0
    )
    try:
        with pytest.raises(StepTimedOut, match="cancelled but had not ended"):
            engine.advance("run")
        assert slow.cancelled.is_set()
        assert abandoned_call_running("run"), "a coroutine that goes on is fenced as a thread"

        # The next attempt waits for it, within its own limit, and calls nothing beside it
        with pytest.raises(StepTimedOut, match="waiting for the call an earlier attempt"):
            engine.advance("run")
        assert slow.calls == 1
    finally:
        slow.released.set()
    assert slow.ended.wait(timeout=30)
    assert engine.advance("run").outcome is Outcome.CONTINUE
    assert slow.calls == 2
    assert not abandoned_call_running("run")


def test_a_sync_tool_that_returns_a_coroutine_fails_saying_await_is_missing(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()

    async def fetch() -> str:
        return "never awaited"

    def forgot_await(args: Nothing, ctx: ToolContext) -> Any:
        return fetch()

    agent = Agent(name="forgetful", tools=[Tool("slow", "Forget.", Nothing, forgot_await)])
    engine = harness.engine_for(agent, ScriptedModel(call_then_done))

    with pytest.raises(ToolFailed, match=r"returned coroutine, an awaitable, not its result: a"):
        engine.advance("run")


def test_an_async_tool_error_keeps_its_cause(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()

    async def broken(args: Nothing, ctx: ToolContext) -> str:
        await asyncio.sleep(0)
        raise ZeroDivisionError("division by zero")

    agent = Agent(name="broken", tools=[Tool("slow", "Fails.", Nothing, broken)])
    engine = harness.engine_for(agent, ScriptedModel(call_then_done))

    with pytest.raises(ToolFailed, match="slow raised ZeroDivisionError: division by zero") as e:
        engine.advance("run")
    assert isinstance(e.value.__cause__, ZeroDivisionError)


SLOW = SlowCoroutine()


@tool()
async def slow_with_pool(args: Nothing, ctx: ToolContext) -> str:
    """Take long on the first call."""
    assert isinstance(ctx.resources, Pool)
    return await SLOW(args, ctx)


slow_pooled = Agent(
    name="slow-pooled",
    goal="Be slow once.",
    tools=[slow_with_pool],
    policy=lambda view: ToolCall(name="slow_with_pool") if view.step == 1 else Done(summary="ok"),
    resources=open_pool,
    step_timeout_seconds=LIMIT,
)


def test_a_cancelled_coroutine_that_ended_leaves_the_run_its_resources(tmp_path):
    OPENED.clear()
    runtime = _runtime(tmp_path)
    Client(runtime).start(run_id="slow", agent=f"{__name__}:slow_pooled")
    engine = runtime.engine(worker_id="w", logger=LOG)
    try:
        with pytest.raises(StepTimedOut, match="cancelled and has ended"):
            engine.advance("slow")
        assert engine.advance("slow").outcome is Outcome.CONTINUE
        assert engine.advance("slow").outcome is Outcome.DONE
    finally:
        runtime.close()

    assert SLOW.calls == 2
    assert [pool.run_id for pool in OPENED] == ["slow"], "the retry reused the run's resources"
