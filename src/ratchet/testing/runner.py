"""One schedule of a check, in a process of its own: a scratch folder (its working directory
too, so a world kept in relative files is private to it), a fresh world from the user's
`setup`, the run started on a scratch store, crashed where the schedule says, resumed to its
end, and what it left behind observed.

A killed life is a real process (`python -m ratchet.testing.life`) that this one spawns with
`RATCHET_FAULT=kill:<point>@<step>` and that dies by SIGKILL at the point; this process, a
fresh one to the run, then goes on from the run's last checkpoint.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue

from ratchet.agents import load_agent
from ratchet.client import Client
from ratchet.errors import InvalidInput, RatchetError
from ratchet.faults import FaultPlan, FaultPoint
from ratchet.imports import ImportFailed, import_object
from ratchet.quickjson import dumps
from ratchet.state import StepCompleted, idempotency_key
from ratchet.testing.clock import FakeClock
from ratchet.testing.drive import (
    LOG,
    CrashOnce,
    Driver,
    open_runtime,
    store_of,
    waits_answered,
)
from ratchet.testing.model import (
    CHECK_MODEL,
    CHECKED_RUN,
    CheckModelSettings,
    Recording,
    model_calls,
    recording_of,
)
from ratchet.testing.outcome import Crash, CrashKind, Outcome, observe
from ratchet.testing.script import WaitScript
from ratchet.tools import Agent, Tool, ToolContext

RUN_ID = CHECKED_RUN
MODEL_LOG = "model-calls.jsonl"
CRASH_GAP_SECONDS = 1000.0
"""How far the fake clock moves on after a crash, before the next life: past any step's time
limit (840 s at most), so an at-most-once call cut off by the crash is known to be over."""
KILLED_LEASE_SECONDS = 0.1
"""The lease of a life that is to be killed: the next life waits this long for it to lapse."""
LIFE_TIMEOUT_SECONDS = 300.0


class CheckFailed(RatchetError):
    """A schedule could not be run at all (the user's setup raised, a life died of something
    else than the crash): not a difference, a broken check."""


class Target(BaseModel):
    """What a check checks: the agent, its input, how the world is seen and reset, how the
    run's waits are answered and where its decisions come from."""

    model_config = ConfigDict(frozen=True)

    agent: str
    params: dict[str, JsonValue] = {}
    effects: str | None = None
    setup: str | None = None
    script: WaitScript = WaitScript()
    recording: Path | None = None
    model: str | None = None
    """The model of a run that records its decisions (`--record`); None: the check's own
    (`CHECK_MODEL`: the agent's policy, or `recording` replayed)."""


class Schedule(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: Target
    root: Path
    crash: Crash | None = None
    """None: the baseline, without a crash."""


class ToolCallSeen(BaseModel):
    model_config = ConfigDict(frozen=True)

    step: int
    tool: str
    side_effect: bool
    at_most_once: bool
    children: bool = False


class KeyTest(BaseModel):
    """The direct test of a key: a side-effecting call of the baseline made once more, with
    the same key and arguments and a fresh context."""

    model_config = ConfigDict(frozen=True)

    step: int
    tool: str
    key: str
    ok: bool
    said: str


class ScheduleRun(BaseModel):
    """What running a schedule gives back (across processes, as JSON)."""

    model_config = ConfigDict(frozen=True)

    crash: Crash | None
    reached: bool
    outcome: Outcome
    seconds: float
    waits: list[dict[str, Any]] = []
    calls: list[ToolCallSeen] = []
    key_tests: list[KeyTest] = []
    recording: Recording | None = None
    """The run's decisions, when it recorded them (`Target.model`)."""


def load_function(reference: str, flag: str) -> Callable[[], Any]:
    """The user's zero-argument function `module:fn` (`--effects`, `--setup`)."""
    try:
        found = import_object(reference, what="function", reference=reference)
    except ImportFailed as failed:
        raise InvalidInput(f"{flag} {reference}: {failed}") from None
    if not callable(found):
        raise InvalidInput(f"{flag} {reference} is not a function")
    return found


def snapshot(effects: Callable[[], Any] | None, reference: str | None) -> JsonValue:
    """What the user's effects function sees now, as JSON; `InvalidInput` if it raises or
    returns what JSON cannot hold (a check that cannot see the world checks nothing)."""
    if effects is None:
        return None
    try:
        seen = effects()
    except Exception as error:
        reason = " ".join(str(error).split())
        raise InvalidInput(
            f"--effects {reference} raised {type(error).__name__}: {reason}"
        ) from None
    try:
        dumps(seen)
    except (TypeError, ValueError) as error:
        raise InvalidInput(
            f"--effects {reference} returned {type(seen).__name__}, not JSON: {error}"
        ) from None
    return seen  # type: ignore[no-any-return]


def run_schedule(schedule: Schedule) -> ScheduleRun:
    """Run one schedule (see the module's docstring). Changes this process's working
    directory and `RATCHET_CHECK_MODEL`: run it in a process of its own."""
    import time

    started = time.perf_counter()
    target, root, crash = schedule.target, schedule.root, schedule.crash
    root.mkdir(parents=True, exist_ok=True)
    os.chdir(root)
    effects = load_function(target.effects, "--effects") if target.effects else None
    if target.setup is not None:
        setup = load_function(target.setup, "--setup")
        try:
            setup()
        except Exception as error:
            raise InvalidInput(
                f"--setup {target.setup} raised {type(error).__name__}: {error}"
            ) from None
    log = root / MODEL_LOG
    model = CheckModelSettings(
        agent=target.agent, recording=target.recording, log=log, store=store_of(root)
    )
    os.environ.update(model.environment())
    clock = FakeClock()
    runtime = open_runtime(root, clock)
    try:
        Client(runtime, logger=LOG).start(
            run_id=RUN_ID,
            agent=target.agent,
            input=target.params,
            model=target.model or CHECK_MODEL,
        )
    finally:
        runtime.close()
    reached = False
    if crash is not None and crash.kind is CrashKind.RAISE:
        stop = CrashOnce(FaultPlan.parse(crash.fault).faults)
        runtime = open_runtime(root, clock, fault=crash.fault)
        try:
            reached = Driver(
                runtime,
                RUN_ID,
                target.script,
                clock,
                root,
                faults=stop,
                stop=stop.stop,
                call_ran=_call_ran(crash),
            ).drive()
        finally:
            runtime.close()
    elif crash is not None:
        reached = _killed_life(target, root, crash, clock)
    runtime = open_runtime(root, clock)
    try:
        client = Client(runtime, logger=LOG)
        if reached:
            # The next life starts later, as a restarted process would.
            clock.advance_to(client.get(RUN_ID).updated_at + timedelta(seconds=CRASH_GAP_SECONDS))
        call_ran = _call_ran(crash) if crash is not None else True
        Driver(runtime, RUN_ID, target.script, clock, root, call_ran=call_ran).drive()
        agent = load_agent(target.agent)
        waits = waits_answered(root)
        outcome = observe(
            client,
            RUN_ID,
            effects=(lambda: snapshot(effects, target.effects)) if effects else None,
            model_calls=model_calls(log).get(RUN_ID, {}),
            asked_whether_ran=sorted(
                {w["step"] for w in waits if w["run_id"] == RUN_ID and w["kind"] == "call"}
            ),
            has_verify=agent.verify is not None,
        )
        calls: list[ToolCallSeen] = []
        key_tests: list[KeyTest] = []
        waited_for_children: list[dict[str, Any]] = []
        recording = recording_of(client, RUN_ID) if target.model is not None else None
        if crash is None:
            tools = _tools(client, agent)
            children = _children_started(client)
            for taken in outcome.steps:
                tool = tools.get(taken.tool)
                calls.append(
                    ToolCallSeen(
                        step=taken.step,
                        tool=taken.tool,
                        side_effect=bool(tool and tool.side_effect),
                        at_most_once=bool(tool and tool.at_most_once),
                        children=taken.step in children,
                    )
                )
            # A run whose children end while this process works them never shows its wait to
            # the driver: the wait for them is known from the steps that started them.
            waited_for_children = [
                {"run_id": RUN_ID, "step": step, "kind": "children", "name": None}
                for step in sorted(children)
            ]
            key_tests = _key_tests(client, agent, tools, outcome, effects, target.effects)
    finally:
        runtime.close()
    return ScheduleRun(
        crash=crash,
        reached=reached,
        outcome=outcome,
        seconds=time.perf_counter() - started,
        waits=[w for w in waits if w["run_id"] == RUN_ID] + waited_for_children,
        calls=calls,
        key_tests=key_tests,
        recording=recording,
    )


def _call_ran(crash: Crash) -> bool:
    """Whether the crashed step's at-most-once call ran: only a crash after it was marked
    started and before it was called leaves it not run."""
    return crash.point is not FaultPoint.AFTER_CALL_STARTED


def _killed_life(target: Target, root: Path, crash: Crash, clock: FakeClock) -> bool:
    """Run the schedule's first life in a real process that SIGKILLs itself at the crash
    point; True if it did (False: it never reached the point and ended the run)."""
    spec = LifeSpec(root=root, script=target.script, ahead=clock.ahead, call_ran=_call_ran(crash))
    # A process with one thread forks its life: the child has every module loaded already, so
    # a life costs milliseconds, not the half second a new interpreter takes to import Ratchet
    # and the agent. Forking beside other threads (pytest's, a server's) may copy a lock one
    # of them holds; there a fresh interpreter is spawned instead.
    if threading.active_count() == 1 and hasattr(os, "fork"):
        code = _forked_life(spec, crash)
    else:
        code = _spawned_life(spec, crash)
    if code == -signal.SIGKILL:
        return True
    if code == 0:
        return False
    tail = (root / "life.log").read_text(errors="replace").strip().splitlines()[-1:]
    raise CheckFailed(
        f"{crash.words}: the process to be killed exited {code} instead: "
        + (tail[0] if tail else "no output")
    )


def _forked_life(spec: LifeSpec, crash: Crash) -> int:
    """The life in a forked child; its exit code (negative: the signal that ended it)."""
    pid = os.fork()
    if pid == 0:  # the child: it dies by the fault, or ends here, and never returns
        code = 0
        try:
            live(spec, crash.fault)
        except BaseException:
            (spec.root / "life.log").write_text(traceback.format_exc(), encoding="utf-8")
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _spawned_life(spec: LifeSpec, crash: Crash) -> int:
    """The life in a fresh interpreter (`python -m ratchet.testing.life`); its exit code."""
    path = spec.root / "life.json"
    path.write_text(spec.model_dump_json(), encoding="utf-8")
    env = {
        **os.environ,
        "RATCHET_FAULT": crash.fault,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    env.pop("RATCHET_STORE", None)
    with (spec.root / "life.log").open("w") as log:
        life = subprocess.run(
            [sys.executable, "-m", "ratchet.testing.life", str(path)],
            cwd=spec.root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=LIFE_TIMEOUT_SECONDS,
            check=False,
        )
    return life.returncode


class LifeSpec(BaseModel):
    """What `ratchet.testing.life` needs to drive the run in a process of its own."""

    model_config = ConfigDict(frozen=True)

    root: Path
    script: WaitScript
    ahead: float
    call_ran: bool


def live(spec: LifeSpec, fault: str) -> bool:
    """Drive the run under `fault` (a `kill:` fault ends this process at its point): what the
    killed life's process runs. False: the point was never reached."""
    clock = FakeClock()
    clock.advance(spec.ahead)
    runtime = open_runtime(spec.root, clock, fault=fault)
    try:
        return Driver(
            runtime,
            RUN_ID,
            spec.script,
            clock,
            spec.root,
            faults=FaultPlan.parse(fault),
            call_ran=spec.call_ran,
            lease_seconds=KILLED_LEASE_SECONDS,
        ).drive()
    finally:
        runtime.close()


def _children_started(client: Client) -> set[int]:
    """The steps of the checked run that started child runs."""
    return {
        checkpoint.step
        for checkpoint in client.runtime.store.list_checkpoints(RUN_ID)
        if isinstance(checkpoint.event, StepCompleted) and checkpoint.event.started
    }


def _tools(client: Client, agent: Agent) -> dict[str, Tool[Any]]:
    """The agent's tools as the run has them (its MCP servers' pinned tools too)."""
    if agent.mcp:
        from ratchet.mcp import bind_tools

        head = client.head(RUN_ID)
        agent = bind_tools(agent, client.runtime.context(RUN_ID, head.options).data)
    return {tool.name: tool for tool in agent.tools}


def _key_tests(
    client: Client,
    agent: Agent,
    tools: dict[str, Tool[Any]],
    outcome: Outcome,
    effects: Callable[[], Any] | None,
    reference: str | None,
) -> list[KeyTest]:
    """Each side-effecting call of the baseline, made once more with its key and arguments
    and a fresh context: the world must not change (the pattern's second required test,
    `run/step-3` received twice, applied once)."""
    head = client.head(RUN_ID)
    tests = []
    for taken in outcome.steps:
        tool = tools.get(taken.tool)
        if tool is None or not tool.side_effect:
            continue
        key = idempotency_key(RUN_ID, taken.step)
        if tool.at_most_once:
            tests.append(
                KeyTest(
                    step=taken.step,
                    tool=tool.name,
                    key=key,
                    ok=True,
                    said="at most once: it takes no key, and is never called twice",
                )
            )
            continue

        def world() -> Any:
            context = client.runtime.context(RUN_ID, head.options)
            seen: dict[str, Any] = {
                "data": dict(context.data.items()) if context.data is not None else {}
            }
            if agent.verify is not None:
                seen["verify_ok"] = client.verify(RUN_ID).get("ok")
            if effects is not None:
                seen["effects"] = snapshot(effects, reference)
            return seen

        before = world()
        said = _call_again(agent, tool, taken.arguments, client, head.options, key, taken.step)
        after = world()
        if before == after:
            tests.append(KeyTest(step=taken.step, tool=tool.name, key=key, ok=True, said=said))
            continue
        from ratchet.testing.outcome import _apart

        changed = "; ".join(_apart(after, before))
        tests.append(
            KeyTest(
                step=taken.step,
                tool=tool.name,
                key=key,
                ok=False,
                said=f"not idempotent under its key: called again with the same key and "
                f"arguments, it changed the world ({changed})",
            )
        )
    return tests


def _call_again(
    agent: Agent,
    tool: Tool[Any],
    arguments: dict[str, Any],
    client: Client,
    options: Any,
    key: str,
    step: int,
) -> str:
    """Call `tool` with a fresh context (resources opened anew), as a retried step would."""
    context = client.runtime.context(RUN_ID, options)
    args = tool.parse(arguments)

    async def called() -> str:
        resources = agent.resources(context) if agent.resources else None
        if inspect.isawaitable(resources):
            resources = await resources
        ctx = ToolContext(
            run_id=RUN_ID, step=step, idempotency_key=key, attempt=1, resources=resources
        )
        try:
            result = await tool.call_async(args, ctx)
        finally:
            aclose, close = getattr(resources, "aclose", None), getattr(resources, "close", None)
            if aclose is not None:
                await aclose()
            elif close is not None:
                close()
        return result.output

    try:
        output = asyncio.run(called())
    except Exception as error:
        return f"called again, it raised {type(error).__name__}: {error}"
    return f"called again, it said: {output[:200]}"
