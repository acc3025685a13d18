"""An agent for the tests of webhooks: it waits for a `ci-finished` event (with a schema, and a
2 h timeout), from a webhook too unless `params.trusted`, and finishes with what it got."""

from __future__ import annotations

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
from tests.waits_agent import CiResult


class Nothing(BaseModel):
    pass


def wait_hook(args: Nothing, ctx: ToolContext) -> ToolResult:
    return wait_for_event("ci-finished", timeout=7200, schema=CiResult, webhook=True)


def wait_trusted(args: Nothing, ctx: ToolContext) -> ToolResult:
    return wait_for_event("ci-finished", timeout=7200, schema=CiResult)


def policy(view: StepView) -> ToolCall | Done:
    if not view.messages:
        tool = "wait_trusted" if view.params.get("trusted") else "wait_hook"
        return ToolCall(name=tool, arguments={})
    return Done(summary=f"finished after: {view.last_result}")


agent = Agent(
    name="hooks",
    tools=[
        Tool("wait_hook", "Wait for CI, from its webhook.", Nothing, wait_hook),
        Tool("wait_trusted", "Wait for CI, sent by a trusted sender.", Nothing, wait_trusted),
    ],
    goal="Wait for CI",
    policy=policy,
    default_params={"trusted": False},
    events=["ci-finished"],
)
AGENT = f"{__name__}:agent"
