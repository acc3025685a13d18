"""An agent that fails for good at step 2 (its tool raises `PermanentError`), and one whose tool
calls `sys.exit(7)`. Tests that run them in another process copy this file into that process's
working directory (`breaker:agent`, `breaker:exits`)."""

import sys

from pydantic import BaseModel

from ratchet.ports import StepView
from ratchet.state import Decision
from ratchet.tools import Agent, PermanentError, ToolCall, ToolContext, tool


class Nothing(BaseModel):
    pass


@tool()
def look(args: Nothing, ctx: ToolContext) -> str:
    """Look around."""
    return "all quiet"


@tool()
def break_things(args: Nothing, ctx: ToolContext) -> str:
    """Fail for good."""
    raise PermanentError("the disk is on fire")


def policy(view: StepView) -> Decision:
    if not view.messages:
        return ToolCall(name="look", arguments={})
    return ToolCall(name="break_things", arguments={})


agent = Agent(name="breaker", goal="Fail at step 2.", tools=[look, break_things], policy=policy)


@tool()
def exit_process(args: Nothing, ctx: ToolContext) -> str:
    """Exit, as a script written to run alone would."""
    sys.exit(7)


exits = Agent(
    name="exits",
    goal="Call sys.exit in a tool.",
    tools=[exit_process],
    policy=lambda view: ToolCall(name="exit_process", arguments={}),
)
