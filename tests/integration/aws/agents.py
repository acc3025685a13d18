"""Agents for the state machine tests, started through the API as `--agent
tests.integration.aws.agents:<name>`.

Their side effects land in `WORLD`, an in-memory table that applies each idempotency key at
most once and counts every delivery: the handlers run in the test process (moto dispatches the
Lambda invocations to them), so the test reads what the tools did directly.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ratchet.tools import (
    Agent,
    Decision,
    Done,
    PermanentError,
    RunSpec,
    StepView,
    Tool,
    ToolCall,
    ToolContext,
    ToolResult,
    ask_person,
    sleep,
    start_runs,
    wait_for_event,
)
from tests.fixtures import sealed_agent
from tests.waits_agent import CiResult

ROWS = 3


class WriteRow(BaseModel):
    n: int


@dataclass
class Rows:
    """The app data of every run: rows by idempotency key, and every key a tool received."""

    applied: dict[str, int] = field(default_factory=dict)
    delivered: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, args: WriteRow, ctx: ToolContext) -> str:
        with self.lock:
            self.delivered[ctx.idempotency_key] += 1
            if ctx.idempotency_key in self.applied:
                return f"row {args.n} already written"
            self.applied[ctx.idempotency_key] = args.n
            return f"row {args.n} written"

    def rows_of(self, run_id: str) -> dict[str, int]:
        with self.lock:
            return {k: n for k, n in self.applied.items() if k.startswith(f"{run_id}/")}

    def deliveries_of(self, run_id: str) -> dict[str, int]:
        with self.lock:
            return {k: c for k, c in self.delivered.items() if k.startswith(f"{run_id}/")}


WORLD = Rows()


@dataclass
class Gate:
    """Holds the first delivery of a step inside its tool until the test lets it go."""

    step: int
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def hold(self, ctx: ToolContext) -> None:
        if ctx.step == self.step and not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(timeout=60), "the test never released the gate"


GATE = Gate(step=1)


def write_rows_policy(view: StepView) -> Decision:
    rows = int(view.params.get("batches", ROWS))
    if view.step > rows:
        return Done(summary=f"wrote {rows} rows")
    return ToolCall(name="write_row", arguments={"n": view.step})


def _always_fails_at_3(args: WriteRow, ctx: ToolContext) -> str:
    if ctx.step == 3:
        raise RuntimeError("the disk is full")
    return WORLD.write(args, ctx)


FLAKY_STEPS = (3, 6, 9)
_FLAKED: set[str] = set()
_FLAKED_LOCK = threading.Lock()


def _fails_once_at_3_6_and_9(args: WriteRow, ctx: ToolContext) -> str:
    with _FLAKED_LOCK:
        first = ctx.step in FLAKY_STEPS and ctx.idempotency_key not in _FLAKED
        _FLAKED.add(ctx.idempotency_key)
    if first:
        raise RuntimeError("the disk is busy")
    return WORLD.write(args, ctx)


_REFUSED: Counter[str] = Counter()


def _fails_twice_at_3(args: WriteRow, ctx: ToolContext) -> str:
    if ctx.step == 3:
        with _FLAKED_LOCK:
            _REFUSED[ctx.idempotency_key] += 1
            refused = _REFUSED[ctx.idempotency_key] <= 2
        if refused:
            raise RuntimeError("the disk is busy")
    return WORLD.write(args, ctx)


def _gated(args: WriteRow, ctx: ToolContext) -> str:
    GATE.hold(ctx)
    return WORLD.write(args, ctx)


def _agent(name: str, handler: Callable[[WriteRow, ToolContext], str]) -> Agent:
    return Agent(
        name=name,
        tools=[Tool("write_row", "Write row n.", WriteRow, handler, side_effect=True)],
        goal="Write {batches} rows, one per step.",
        policy=write_rows_policy,
        default_params={"batches": ROWS},
    )


@dataclass
class InFlight:
    """Counts the steps of an agent at work at once (and which runs' they are); holds each in
    its tool until the test opens the gate, so that a run beyond the bound must find every
    slot taken."""

    open: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    now: int = 0
    most: int = 0
    at_work: set[str] = field(default_factory=set)
    moments: list[frozenset[str]] = field(default_factory=list)
    """The runs at work each time a step began."""

    def work(self, args: WriteRow, ctx: ToolContext) -> str:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.at_work.add(ctx.run_id)
            self.moments.append(frozenset(self.at_work))
        try:
            assert self.open.wait(timeout=60), "the test never opened the gate"
            return WORLD.write(args, ctx)
        finally:
            with self.lock:
                self.now -= 1
                self.at_work.discard(ctx.run_id)

    def most_of(self, runs: Collection[str]) -> int:
        """The most of `runs` at work at once."""
        with self.lock:
            return max((len(moment & set(runs)) for moment in self.moments), default=0)


IN_FLIGHT = InFlight()
HELDOUT_IN_FLIGHT = InFlight()


@dataclass
class Timeline:
    """When each step's tool started and ended (wall clock), by run: what a test counts the
    steps in flight from."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    spans: list[tuple[str, float, float]] = field(default_factory=list)

    def work(self, args: WriteRow, ctx: ToolContext) -> str:
        started = time.time()
        time.sleep(0.05)
        written = WORLD.write(args, ctx)
        with self.lock:
            self.spans.append((ctx.run_id, started, time.time()))
        return written

    def most_at_once(self, runs: Collection[str]) -> int:
        """The most steps of `runs` in flight at once (an end before a start at one instant)."""
        with self.lock:
            events = sorted(
                (moment, change)
                for run_id, start, end in self.spans
                if run_id in runs
                for moment, change in ((start, 1), (end, -1))
            )
        most = now = 0
        for _, change in events:
            now += change
            most = max(most, now)
        return most

    def first_start(self, run_id: str) -> float:
        with self.lock:
            return min(start for run, start, _ in self.spans if run == run_id)


TIMELINE = Timeline()


rows = _agent("rows", WORLD.write)
quick = dataclasses.replace(_agent("quick", WORLD.write), step_timeout_seconds=10)
"""`rows` with a short step time limit: an invocation holds many more of its steps."""
failing = _agent("failing", _always_fails_at_3)
flaky = _agent("flaky", _fails_once_at_3_6_and_9)
"""Each of steps 3, 6 and 9 fails its first attempt and succeeds at its second."""
twice = _agent("twice", _fails_twice_at_3)
"""Step 3 fails its first two attempts and succeeds at its third."""
gated = _agent("gated", _gated)
bounded = dataclasses.replace(_agent("bounded", IN_FLIGHT.work), max_concurrent=2)
heldout = _agent("heldout", HELDOUT_IN_FLIGHT.work)
"""No bound of its own: a deployment bounds it by a name it registers it under."""
heldout_alias = heldout
"""`heldout` under a second import path, as a package re-exports its agent."""
keyed = dataclasses.replace(_agent("keyed", TIMELINE.work), max_concurrent_per_key=2)
"""At most 2 runs of one `concurrency_key` at work at once; its steps' times in `TIMELINE`."""


# --- waits on the world: an event, a time -------------------------------------------------------


class WaitFor(BaseModel):
    timeout: float | None = None


class Nap(BaseModel):
    seconds: float


def _wait_ci(args: WaitFor, ctx: ToolContext) -> ToolResult:
    return wait_for_event("ci-finished", timeout=args.timeout, schema=CiResult)


def _nap(args: Nap, ctx: ToolContext) -> ToolResult:
    return sleep(args.seconds)


def _once_then_done(
    tool: str, arguments: Callable[[StepView], dict[str, object]]
) -> Callable[[StepView], Decision]:
    def policy(view: StepView) -> Decision:
        if tool not in [m.tool for m in view.messages]:
            return ToolCall(name=tool, arguments=arguments(view))
        return Done(summary=f"finished after: {view.last_result}")

    return policy


events = Agent(
    name="events",
    tools=[Tool("wait_ci", "Wait for CI to finish.", WaitFor, _wait_ci)],
    goal="Wait for CI",
    policy=_once_then_done("wait_ci", lambda view: {"timeout": view.params["timeout"]}),
    default_params={"timeout": None},
    events=["ci-finished"],
)
"""Waits once for `ci-finished` (its params' `timeout`, seconds; none: for ever), then ends
with the wait's result as its summary."""

sleeper = Agent(
    name="sleeper",
    tools=[Tool("nap", "Sleep a while.", Nap, _nap)],
    goal="Sleep",
    policy=_once_then_done("nap", lambda view: {"seconds": view.params["seconds"]}),
    default_params={"seconds": 2},
)
"""Sleeps once for its params' `seconds`, then ends with the sleep's result as its summary."""


# --- child runs ---------------------------------------------------------------------------------


class Nothing(BaseModel):
    pass


def _fan_out(args: Nothing, ctx: ToolContext) -> ToolResult:
    params = ctx.resources
    child = params["child"]
    specs = [
        RunSpec(agent=child, input=_child_input(child, i, params))
        for i in range(params["children"])
    ]
    return start_runs(specs, wait=params["wait"])


def _child_input(child: str, i: int, params: dict[str, Any]) -> dict[str, object]:
    if child == "helper":
        return {"batches": 1, "fail": i in (params["failing"] or [])}
    return {}


fanout = Agent(
    name="fanout",
    tools=[Tool("fan_out", "Start the child runs.", Nothing, _fan_out)],
    goal="Delegate",
    policy=_once_then_done("fan_out", lambda view: {}),
    resources=lambda ctx: ctx.options.params,
    default_params={"children": 3, "child": "helper", "wait": "all", "failing": []},
)
"""Starts `children` runs of the registered agent `child` (`helper`, or `events` to have them
wait), waits for them as `wait` says, then ends with the wait's result as its summary."""


def _helper_row(args: WriteRow, ctx: ToolContext) -> str:
    if ctx.resources["fail"]:
        raise PermanentError(f"{ctx.run_id} cannot write its row")
    return WORLD.write(args, ctx)


helper = dataclasses.replace(
    _agent("helper", _helper_row),
    default_params={"batches": 1, "fail": False},
    resources=lambda ctx: ctx.options.params,
)
"""Writes its rows (one per step) as `rows` does, or with `fail` fails at once."""


# --- an at-most-once tool -------------------------------------------------------------------


@dataclass
class Bank:
    """The wires a portal with no idempotency key received (every real call is one)."""

    sent: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, args: WriteRow, ctx: ToolContext) -> str:
        with self.lock:
            self.sent.append(ctx.run_id)
        return f"wired {args.n}"

    def sent_by(self, run_id: str) -> int:
        with self.lock:
            return self.sent.count(run_id)


BANK = Bank()
WIRE_STEP_SECONDS = 5.0


wires = Agent(
    name="wires",
    tools=[
        Tool(
            "send_wire",
            "Send a wire (the portal takes no idempotency key).",
            WriteRow,
            BANK.send,
            side_effect=True,
            at_most_once=True,
        )
    ],
    goal="Pay",
    policy=_once_then_done("send_wire", lambda view: {"n": 120}),
    step_timeout_seconds=WIRE_STEP_SECONDS,
)
"""Sends one wire through an at-most-once tool, then ends with its result as its summary. A
retried step asks whether the wire was sent no sooner than its step time limit after the call
started (`WIRE_STEP_SECONDS`, short)."""

SLOW_PORTAL = Gate(step=1)


def _slow_send(args: WriteRow, ctx: ToolContext) -> str:
    SLOW_PORTAL.hold(ctx)
    return BANK.send(args, ctx)


slow_wires = dataclasses.replace(
    wires,
    name="slow_wires",
    tools=[dataclasses.replace(wires.tools[0], handler=_slow_send)],
    step_timeout_seconds=1.0,
)
"""`wires` whose portal holds the first call until the test lets it go, past the step's time
limit (1 s): the step gives the call up at its deadline, and the call goes on."""


def _ask_to_export(args: sealed_agent.Customer, ctx: ToolContext) -> ToolResult:
    return ask_person(f"Send the orders of {args.customer} to the auditor?")


def _sealed_policy(view: StepView) -> Decision:
    customer = view.params["customer"]
    if view.step == 3:
        return ToolCall(name="ask", arguments={"customer": customer})
    if view.step > 3:
        return Done(summary=f"exported the orders of {customer}")
    return sealed_agent.policy(view)


sealed = dataclasses.replace(
    sealed_agent.agent,
    tools=[
        *sealed_agent.agent.tools,
        Tool("ask", "Ask a person.", sealed_agent.Customer, _ask_to_export),
    ],
    policy=_sealed_policy,
)
"""`tests.fixtures.sealed_agent`'s run (its input in its goal, a result and a blob that say it)
with a person asked about it, in the question, before it ends: what the deployed stack must
store sealed (tests/integration/aws/test_sealed_stack.py)."""
