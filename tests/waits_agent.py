"""An agent that waits on the world, for the tests of waits: it waits for a `ci-finished`
event (with a schema and a 2 h timeout), then (with `params.merge`) merges, a side effect kept
in the run's data under its step's key, then (with `params.nap`) naps 2 s, and finishes with
what it got.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import BaseModel

from ratchet.tools import (
    Agent,
    Done,
    StepView,
    Tool,
    ToolCall,
    ToolContext,
    ToolResult,
    wait_for_event,
)
from ratchet.tools import sleep as sleep_for


class CiResult(BaseModel):
    conclusion: Literal["success", "failure"]
    url: str = ""


class Nothing(BaseModel):
    pass


class WaitArgs(BaseModel):
    webhook: bool = True


def wait_ci(args: WaitArgs, ctx: ToolContext) -> ToolResult:
    return wait_for_event("ci-finished", timeout=7200, schema=CiResult, webhook=args.webhook)


def nap(args: Nothing, ctx: ToolContext) -> ToolResult:
    return sleep_for(2)


def merge(args: Nothing, ctx: ToolContext) -> str:
    """The side effect: applied once per step key, however often the step is tried (each
    try is counted apart, so a test can tell a retried step from a repeated effect)."""
    data = ctx.resources
    data.put(f"tries/{ctx.idempotency_key}/{ctx.attempt}", "1")
    applied = data.put_once(f"merged/{ctx.idempotency_key}", "1")
    return "merged" if applied else "merged already"


def policy(view: StepView) -> ToolCall | Done:
    """Wait for CI, then merge and nap as the params say, then finish with what CI said."""
    done = [m.tool for m in view.messages]
    if "wait_ci" not in done:
        return ToolCall(name="wait_ci", arguments={"webhook": view.params.get("webhook", True)})
    if view.params.get("merge") and "merge" not in done:
        return ToolCall(name="merge", arguments={})
    if view.params.get("nap") and "nap" not in done:
        return ToolCall(name="nap", arguments={})
    return Done(summary=f"finished after: {view.last_result}")


agent = Agent(
    name="waits",
    tools=[
        Tool("wait_ci", "Wait for CI to finish.", WaitArgs, wait_ci),
        Tool("nap", "Nap for two seconds.", Nothing, nap),
        Tool("merge", "Merge the pull request.", Nothing, merge, side_effect=True),
    ],
    resources=lambda ctx: ctx.data,
    goal="Wait for CI",
    policy=policy,
    default_params={"nap": False, "merge": False, "webhook": True},
    events=["ci-finished"],
)
AGENT = f"{__name__}:agent"

open_agent = replace(agent, name="waits-open", events=None)
"""The same agent declaring no events: its runs' mailboxes keep an event of any name."""
OPEN_AGENT = f"{__name__}:open_agent"
two_events_agent = replace(agent, name="waits-two", events=["ci-finished", "deploy-done"])
"""The same agent declaring a second event, which it never waits for."""
TWO_EVENTS_AGENT = f"{__name__}:two_events_agent"
