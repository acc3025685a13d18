"""An agent that waits on the world, for the tests of waits: it waits for a `ci-finished`
event (with a schema, and a timeout given in its params), naps, and finishes with what it got.
"""

from __future__ import annotations

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


def wait_ci(args: Nothing, ctx: ToolContext) -> ToolResult:
    return wait_for_event("ci-finished", timeout=7200, schema=CiResult, webhook=True)


def nap(args: Nothing, ctx: ToolContext) -> ToolResult:
    return sleep_for(2)


def policy(view: StepView) -> ToolCall | Done:
    """Wait for CI, then (if `params.nap`) nap, then finish with the last result."""
    done = [m.tool for m in view.messages]
    if "wait_ci" not in done:
        return ToolCall(name="wait_ci", arguments={})
    if view.params.get("nap") and "nap" not in done:
        return ToolCall(name="nap", arguments={})
    return Done(summary=f"finished after: {view.last_result}")


agent = Agent(
    name="waits",
    tools=[
        Tool("wait_ci", "Wait for CI to finish.", Nothing, wait_ci),
        Tool("nap", "Nap for two seconds.", Nothing, nap),
    ],
    goal="Wait for CI",
    policy=policy,
    default_params={"nap": False},
    events=["ci-finished"],
)
AGENT = f"{__name__}:agent"
