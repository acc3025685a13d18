"""The scripted agent that the benches run: one tool call a step, ~200 B of arguments, 1 KB out.

Each step the agent looks up one order: the arguments are 200 bytes of compact JSON and the
tool's answer 1,024 bytes, both fixed by the step number, so every attempt and every framework
sees the same bytes. `bench.compare` runs the same script on LangGraph and DBOS through
`arguments_for` and `result_for`; `agent` is the Ratchet agent, loadable as
`bench.scripted_agent:agent`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, Field

from ratchet.model_names import SCRIPTED
from ratchet.runs import RunRequest, new_run
from ratchet.state import RunState
from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, tool

AGENT_REFERENCE = "bench.scripted_agent:agent"
TOOL_NAME = "lookup_order"
ARGUMENT_BYTES = 200
RESULT_BYTES = 1024
MAX_STEPS = 10_000
"""The most steps a run may ask for (Ratchet's step cap)."""

_FIELDS = ["status", "items", "shipping", "refunds"]


def _text(seed: str, size: int) -> str:
    """`size` characters of hex, fixed by `seed`: no framework can compress it away."""
    digest = b""
    counter = 0
    while len(digest) * 2 < size:
        digest += hashlib.sha256(f"{seed}/{counter}".encode()).digest()
        counter += 1
    return digest.hex()[:size]


def _padded(document: dict[str, Any], pad_field: str, size: int) -> dict[str, Any]:
    """`document` with `pad_field` filled so that its compact JSON is exactly `size` bytes."""
    empty = len(_compact({**document, pad_field: ""}))
    if empty > size:
        raise ValueError(f"{document} is over {size} bytes before padding")
    return {**document, pad_field: _text(_compact(document), size - empty)}


def _compact(document: dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"))


def arguments_for(step: int) -> dict[str, Any]:
    """The tool call of step `step`: 200 bytes of compact JSON."""
    call = {"order_id": f"A-{step:06d}", "fields": _FIELDS, "reason": ""}
    return _padded(call, "reason", ARGUMENT_BYTES)


def result_for(arguments: dict[str, Any]) -> str:
    """The tool's answer to `arguments`: 1,024 bytes of JSON."""
    answer = {"order_id": arguments["order_id"], "status": "shipped", "history": ""}
    return _compact(_padded(answer, "history", RESULT_BYTES))


class ScriptInput(BaseModel):
    steps: int = Field(default=MAX_STEPS, ge=1, le=MAX_STEPS)
    """How many tool calls the script makes before it says it is done."""


class LookupOrder(BaseModel):
    order_id: str
    fields: list[str]
    reason: str


@tool(name=TOOL_NAME)
def lookup_order(args: LookupOrder, ctx: ToolContext) -> str:
    """Look up an order's status, items, shipping and refunds."""
    return result_for(args.model_dump())


def scripted(view: StepView) -> ToolCall | Done:
    if view.step > int(view.params["steps"]):
        return Done(summary=f"looked up {view.step - 1} orders")
    return ToolCall(name=TOOL_NAME, arguments=arguments_for(view.step))


agent = Agent(
    name="scripted-lookups",
    goal="Look up {steps} orders, one a step.",
    tools=[lookup_order],
    policy=scripted,
    input=ScriptInput,
)


def new_scripted_run(run_id: str, *, steps: int = MAX_STEPS, max_steps: int) -> RunState:
    """A new run of `agent` that looks up `steps` orders, checked as any start is."""
    request = RunRequest(
        run_id=run_id,
        agent=AGENT_REFERENCE,
        model=SCRIPTED,
        max_steps=max_steps,
        input={"steps": steps},
    )
    return new_run(request, has_anthropic_key=False)
