"""An agent with at most 3 runs at work at a time, for the tests of concurrency limits: each
run works `params.steps` steps (default 2) and is done. Each step's tool appends when it
starts and ends (wall clock, across processes) to the file `params.log`, so a test can count
the steps in flight at any moment; with `params.hold`, a run's first try of its first step
holds on for that many seconds (a worker to kill mid-step)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel

from ratchet.tools import Agent, Done, StepView, Tool, ToolCall, ToolContext

STEP_SECONDS = 0.1


class Nothing(BaseModel):
    pass


def _note(log: str, what: str, run_id: str) -> None:
    # One short append per line: lines from several processes never interleave.
    with Path(log).open("a") as file:
        file.write(f"{what} {time.time():.6f} {run_id} {os.getpid()}\n")


def work(args: Nothing, ctx: ToolContext) -> str:
    params = ctx.resources
    _note(params["log"], "start", ctx.run_id)
    hold = params.get("hold", 0) if ctx.step == 1 and ctx.attempt == 1 else 0
    time.sleep(hold or STEP_SECONDS)
    _note(params["log"], "end", ctx.run_id)
    return "worked"


def policy(view: StepView) -> ToolCall | Done:
    if len(view.messages) < view.params.get("steps", 2):
        return ToolCall(name="work", arguments={})
    return Done(summary="worked")


agent = Agent(
    name="bounded",
    tools=[Tool("work", "Work a while.", Nothing, work)],
    goal="Work",
    policy=policy,
    resources=lambda ctx: ctx.options.params,
    default_params={"log": "", "steps": 2, "hold": 0},
    max_concurrent=3,
)
AGENT = f"{__name__}:agent"


def in_flight(log: Path) -> tuple[int, dict[str, int]]:
    """The most steps in flight at once that the log shows, and the steps each run started."""
    events: list[tuple[float, int]] = []
    started: dict[str, int] = {}
    for line in log.read_text().splitlines():
        what, moment, run_id, _ = line.split()
        # At the same instant an end counts before a start: touching is not overlapping.
        events.append((float(moment), 1 if what == "start" else -1))
        if what == "start":
            started[run_id] = started.get(run_id, 0) + 1
    most = now = 0
    for _, change in sorted(events):
        now += change
        most = max(most, now)
    return most, started
