"""An agent whose one tool cannot take an idempotency key, for the tests of at-most-once
tools: `send_wire` appends a line to the file `params.bank` (the bank's record of wires,
across processes) each time it is really called, and the run is done after it, its summary
the wire's result. Its steps' time limit is short: a step retried in another process asks
whether the wire was sent no sooner than that after the call started.

With `params.freeze` (a path), the first call freezes its own process in the middle of the
call (SIGSTOP: a paused VM, a long GC), after writing its pid there; sent SIGCONT, it goes on
and sends the wire."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from pydantic import BaseModel, Field

from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, tool

STEP_SECONDS = 5.0
"""The agent's step time limit: the deadline of its wire's call, counted from the call's start."""


class Wire(BaseModel):
    amount: int = Field(gt=0)
    to: str


@tool(side_effect=True, at_most_once=True)
def send_wire(args: Wire, ctx: ToolContext) -> str:
    """Send a wire through the bank's portal (which takes no idempotency key)."""
    freeze = ctx.resources.get("freeze")
    if freeze and not Path(freeze).exists():
        Path(freeze).write_text(str(os.getpid()))
        # Sent to this thread, so it stops here (the whole process with it), not a little
        # later, when another thread the kernel picked gets round to it.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
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
    default_params={"bank": "", "wires": 1, "freeze": ""},
    step_timeout_seconds=STEP_SECONDS,
)
AGENT = f"{__name__}:agent"


def wires(bank: Path) -> list[str]:
    """The wires the bank received: one line each."""
    return bank.read_text().splitlines() if bank.exists() else []
