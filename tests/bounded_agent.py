"""An agent with at most 3 runs at work at a time, for the tests of concurrency limits: each
run works `params.steps` steps (default 2) and is done. Each step's tool appends when it
starts and ends (wall clock, across processes) to the file `params.log`, so a test can count
the steps in flight at any moment; with `params.hold`, a run's first try of its first step
holds on for that many seconds (a worker to kill mid-step), and with `params.gate`, until that
file exists (a test holding every slot taken while the other workers try for one). `two` is the
same agent bounded at 2, and `tests.bounded_alias` re-exports both, as a package re-exports its
agent: two import paths of one agent. `keyed` and `keyed_one` bound the runs of each
`concurrency_key` instead (at 2, at 1)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Collection
from pathlib import Path

from pydantic import BaseModel

from ratchet.tools import Agent, Done, StepView, Tool, ToolCall, ToolContext

STEP_SECONDS = 0.1
GATE_SECONDS = 90.0
"""The longest a gated step waits for its gate: the test that holds it opens it well before."""


class Nothing(BaseModel):
    pass


def _note(log: str, what: str, run_id: str) -> None:
    # One short append per line: lines from several processes never interleave.
    with Path(log).open("a") as file:
        file.write(f"{what} {time.time():.6f} {run_id} {os.getpid()}\n")


def work(args: Nothing, ctx: ToolContext) -> str:
    params = ctx.resources
    _note(params["log"], "start", ctx.run_id)
    first = ctx.step == 1 and ctx.attempt == 1
    hold = params.get("hold", 0) if first else 0
    time.sleep(hold or STEP_SECONDS)
    if first and params.get("gate"):
        deadline = time.monotonic() + GATE_SECONDS
        while not Path(params["gate"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
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
    default_params={"log": "", "steps": 2, "hold": 0, "gate": ""},
    max_concurrent=3,
)
AGENT = f"{__name__}:agent"
two = dataclasses.replace(agent, name="bounded-two", max_concurrent=2)
TWO = f"{__name__}:two"
keyed = dataclasses.replace(
    agent, name="bounded-keyed", max_concurrent=None, max_concurrent_per_key=2
)
"""No bound on all its runs; at most 2 of one `concurrency_key` at work at once."""
KEYED = f"{__name__}:keyed"
keyed_one = dataclasses.replace(agent, name="bounded-keyed-one", max_concurrent_per_key=1)
"""At most 1 run of one key at work at once, and 3 of all its runs."""
KEYED_ONE = f"{__name__}:keyed_one"


def in_flight(log: Path, runs: Collection[str] | None = None) -> tuple[int, dict[str, int]]:
    """The most steps in flight at once that the log shows (of `runs` only, if given), and the
    steps each run started."""
    events: list[tuple[float, int]] = []
    started: dict[str, int] = {}
    for line in log.read_text().splitlines():
        what, moment, run_id, _ = line.split()
        if runs is not None and run_id not in runs:
            continue
        # At the same instant an end counts before a start: touching is not overlapping.
        events.append((float(moment), 1 if what == "start" else -1))
        if what == "start":
            started[run_id] = started.get(run_id, 0) + 1
    most = now = 0
    for _, change in sorted(events):
        now += change
        most = max(most, now)
    return most, started
