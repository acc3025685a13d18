"""The agent whose trace docs/tracing.md draws (`bench.trace_picture`) and the trace tests
(tests/integration/test_tracing.py) read: `note` writes a line into `params.notes` (failing once
at the step `params.flaky_step`, as a flaky API would), then `ask` asks a person, then one more
note, and the run is done. Its model (`MODEL`) is the policy reporting a fixed usage, cache
reads and writes included, so the model spans have tokens to show."""

from __future__ import annotations

from pathlib import Path

from opentelemetry import trace
from pydantic import BaseModel

from ratchet.ports import ModelReply, ModelRequest
from ratchet.state import Usage
from ratchet.tools import (
    Agent,
    Done,
    StepView,
    ToolCall,
    ToolContext,
    ToolResult,
    ask_person,
    tool,
)

USAGE = Usage(
    input_tokens=1200, output_tokens=80, cache_read_tokens=3000, cache_write_tokens=400, calls=1
)


class Note(BaseModel):
    text: str


class Question(BaseModel):
    prompt: str


@tool(side_effect=True)
def note(args: Note, ctx: ToolContext) -> str:
    """Write a note, once per key; the first attempt at the flaky step fails."""
    notes = Path(ctx.resources["notes"])
    if ctx.step == ctx.resources.get("flaky_step") and ctx.attempt == 1:
        raise ConnectionError("the notes service dropped the connection")
    # The tool's own span (an instrumented client's, say) nests under Ratchet's tool span,
    # though the tool runs on the agent's thread.
    with (
        trace.get_tracer("notes-service").start_as_current_span("notes.write"),
        notes.open("a") as out,
    ):
        out.write(f"{ctx.idempotency_key} {args.text}\n")
    return f"noted {args.text!r}"


@tool()
def ask(args: Question, ctx: ToolContext) -> ToolResult:
    """Ask a person before the last note."""
    return ask_person(args.prompt)


PLAN = [
    ToolCall(name="note", arguments={"text": "one"}),
    ToolCall(name="note", arguments={"text": "two"}),
    ToolCall(name="ask", arguments={"prompt": "Write the last note?"}),
    ToolCall(name="note", arguments={"text": "three"}),
]


def policy(view: StepView) -> ToolCall | Done:
    done = len(view.messages)
    return PLAN[done] if done < len(PLAN) else Done(summary="three notes written")


class UsageModel:
    def decide(self, request: ModelRequest) -> ModelReply:
        return ModelReply(decision=policy(request.view), usage=USAGE)


agent = Agent(
    name="notes",
    tools=[note, ask],
    goal="Write three notes, asking before the last",
    policy=policy,
    resources=lambda ctx: ctx.options.params,
    default_params={"notes": "", "flaky_step": 0},
)
AGENT = f"{__name__}:agent"
MODEL = f"{__name__}:UsageModel"
