"""Agents for the tests of child runs.

`parent` starts `params.children` runs of `child` at its first step (`start_runs`, waiting as
`params.wait` says; or the runs `params.specs` names, as they are), then is done, its summary
the step's result (how each child ended).
With `params.pause_at`, the process creating child number `pause_at` stops itself there
(SIGSTOP, in the child's `prepare`: the children before it are created, it and those after it
are not), so a test can act in the middle of the fan-out and then let it go on (SIGCONT).
`child` works one step (0.05 s, or `params.hold` seconds) and is done with the summary
`child <i> done`; with `params.fail` its tool raises a `PermanentError` and the run fails;
with `params.ask` it waits for a person first. Every child's step appends a line to the file
`params.log` (when given), so a test counts how many times each child worked.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ratchet.tools import (
    Agent,
    Done,
    PermanentError,
    RunContext,
    RunSpec,
    StepView,
    Tool,
    ToolCall,
    ToolContext,
    ToolResult,
    ask_person,
    start_runs,
)


class Nothing(BaseModel):
    pass


def fan_out(args: Nothing, ctx: ToolContext) -> ToolResult:
    params = ctx.resources
    if params.get("specs"):
        return start_runs(params["specs"], wait=params.get("wait", "all"))
    failing = set(params.get("failing", []))
    specs = [
        RunSpec(
            agent=CHILD,
            input={
                "i": i,
                "fail": i in failing,
                "log": params.get("log", ""),
                "hold": params.get("hold", 0.0),
                "ask": params.get("ask", False),
                "pause": i == params.get("pause_at"),
            },
        )
        for i in range(params["children"])
    ]
    return start_runs(specs, wait=params.get("wait", "all"))


def parent_policy(view: StepView) -> ToolCall | Done:
    if not view.messages:
        return ToolCall(name="fan_out", arguments={})
    return Done(summary=view.last_result or "")


class ChildInput(BaseModel):
    i: int = 0
    fail: bool = False
    log: str = ""
    hold: float = 0.0
    ask: bool = False
    pause: bool = False


def pause_on_creation(ctx: RunContext) -> None:
    if ctx.options.params.get("pause"):
        os.kill(os.getpid(), signal.SIGSTOP)


def work(args: Nothing, ctx: ToolContext) -> str | ToolResult:
    params: dict[str, Any] = ctx.resources
    if params.get("ask") and ctx.step == 1:
        return ask_person("May the child go on?")
    if params.get("log"):
        with Path(params["log"]).open("a") as file:
            file.write(f"{ctx.run_id} {os.getpid()}\n")
    time.sleep(params.get("hold") or 0.05)
    if params.get("fail"):
        raise PermanentError(f"child {params['i']} cannot do it")
    return f"child {params['i']} worked"


def child_policy(view: StepView) -> ToolCall | Done:
    wanted = 2 if view.params.get("ask") else 1
    if len(view.messages) < wanted:
        return ToolCall(name="work", arguments={})
    return Done(summary=f"child {view.params['i']} done")


parent = Agent(
    name="parent",
    tools=[Tool("fan_out", "Start the child runs.", Nothing, fan_out)],
    goal="Delegate",
    policy=parent_policy,
    resources=lambda ctx: ctx.options.params,
    default_params={
        "children": 3,
        "wait": "all",
        "failing": [],
        "log": "",
        "hold": 0.0,
        "ask": False,
        "specs": [],
        "pause_at": None,
    },
)
child = Agent(
    name="child",
    tools=[Tool("work", "Do the child's part.", Nothing, work)],
    goal="Do part {i}",
    policy=child_policy,
    resources=lambda ctx: ctx.options.params,
    input=ChildInput,
    prepare=pause_on_creation,
)
PARENT = f"{__name__}:parent"
CHILD = f"{__name__}:child"
