"""An agent whose one tool cannot take an idempotency key, for the tests of at-most-once
tools: `send_wire` appends a line to the file `params.bank` (the bank's record of wires,
across processes) each time it is really called, and the run is done after it, its summary
the wire's result."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, tool


class Wire(BaseModel):
    amount: int = Field(gt=0)
    to: str


@tool(side_effect=True, at_most_once=True)
def send_wire(args: Wire, ctx: ToolContext) -> str:
    """Send a wire through the bank's portal (which takes no idempotency key)."""
    with Path(ctx.resources["bank"]).open("a") as bank:
        bank.write(f"{ctx.run_id} {ctx.step} {args.amount} {args.to} {os.getpid()}\n")
    return f"wired {args.amount} to {args.to}"


def policy(view: StepView) -> ToolCall | Done:
    if not view.messages or view.params.get("wires", 1) > len(
        [m for m in view.messages if m.tool == "send_wire"]
    ):
        return ToolCall(name="send_wire", arguments={"amount": 120, "to": "ACME"})
    return Done(summary=view.last_result or "")


agent = Agent(
    name="wires",
    tools=[send_wire],
    goal="Pay ACME",
    policy=policy,
    resources=lambda ctx: ctx.options.params,
    default_params={"bank": "", "wires": 1},
)
AGENT = f"{__name__}:agent"


def wires(bank: Path) -> list[str]:
    """The wires the bank received: one line each."""
    return bank.read_text().splitlines() if bank.exists() else []
