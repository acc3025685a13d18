"""An agent whose runs have a budget, for the budget's tests: one tool that writes a note, and
a model that never says it is done (each test ends its run at the bound or the step cap)."""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel

from ratchet.tools import Agent, ToolContext, tool


class Note(BaseModel):
    text: str


@tool()
def write_note(args: Note, ctx: ToolContext) -> str:
    """Write one note in the notebook."""
    return f"noted: {args.text}"


unbounded = Agent(
    name="unbounded",
    goal="Write notes, one a step.",
    tools=[write_note],
    instructions="You keep a tidy notebook.",
    max_tokens=1024,
    model_retry_seconds=0,
    step_timeout_seconds=None,
)
"""Bounded by nothing: what a step costs without a budget, for comparison."""

agent = dataclasses.replace(unbounded, name="budgeted", max_cost_usd=0.05)

daily = dataclasses.replace(unbounded, name="daily", max_cost_usd_per_day=0.03)
"""The same, with no budget per run and a budget per day, shared by all its runs."""
