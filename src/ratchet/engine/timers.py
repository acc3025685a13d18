"""The runtime's `sleep` tool: the model parks its own run for a while, or until a time.

Offered to every agent beside `remember` (`Agent.sleep` turns it off; an agent's own tool of the
name wins). It is a plain tool returning `ratchet.tools.sleep` or `sleep_until`, so the engine
records and settles it as it does any tool's wait.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ratchet.state import MAX_WAIT_SECONDS, MIN_SLEEP_SECONDS
from ratchet.tools import Agent, Tool, ToolContext, ToolResult, sleep, sleep_until

SLEEP = "sleep"


class SleepArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seconds: int | None = Field(default=None, ge=MIN_SLEEP_SECONDS, le=MAX_WAIT_SECONDS)
    until: datetime | None = None
    """An ISO 8601 time with its timezone, e.g. 2026-12-07T09:00:00+01:00."""

    @model_validator(mode="after")
    def _one_of(self) -> SleepArgs:
        if (self.seconds is None) == (self.until is None):
            raise ValueError("give exactly one of seconds and until")
        if self.until is not None and self.until.tzinfo is None:
            raise ValueError("until needs its timezone (e.g. 2026-12-07T09:00:00Z)")
        return self


def _sleep(args: SleepArgs, ctx: ToolContext) -> ToolResult:
    """Pause this task without using anything while it waits: for `seconds` (1 s to a year),
    or `until` a time (ISO 8601 with timezone; a time already past goes on at once). Use it to
    check something again later, or to wait for a time of day, instead of polling."""
    if args.until is not None:
        return sleep_until(args.until)
    assert args.seconds is not None
    return sleep(args.seconds)


SLEEP_TOOL: Tool[Any] = Tool(
    name=SLEEP,
    description=_sleep.__doc__ or "",
    args=SleepArgs,
    handler=_sleep,
)


def offers_sleep(agent: Agent) -> bool:
    """Whether the runtime's `sleep` tool is the agent's (an agent's own tool of that name
    wins, and an agent may turn it off)."""
    return agent.sleep and agent.tool_named(SLEEP) is None


def tool_of(agent: Agent, name: str) -> Tool[Any] | None:
    """The agent's tool called `name`, or the runtime's `sleep` tool if it offers it."""
    found = agent.tool_named(name)
    if found is None and name == SLEEP and offers_sleep(agent):
        return SLEEP_TOOL
    return found
