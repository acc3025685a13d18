"""Scenario `notebook`: a general agent for `ratchet start --goal TEXT` without `--agent`.

Its one side effect is writing notes (at most once per step key); it can ask a person before
doing anything it considers risky. Offline, the scripted policy files the goal as a note and
reports done; with Claude, the model works the goal with these tools.

The notes are the run's data (`RunContext.data`), kept by the runtime's own store on either
runtime: one value per note under `notes/<step, zero-padded>`, so the keys sort in step order.
"""

from __future__ import annotations

import json
from typing import Any, Self

from pydantic import BaseModel, Field, model_validator

from ratchet.ports import MAX_DATA_VALUE_BYTES, RunData
from ratchet.state import RunState
from ratchet.tools import (
    Agent,
    Decision,
    Done,
    RunContext,
    StepView,
    ToolCall,
    ToolContext,
    ToolResult,
    ask_person,
    tool,
)

NOTES = "notes/"
STEP_DIGITS = 8
"""Zero-padding of the step in a note's key: more digits than any run's step cap has."""


class WriteNote(BaseModel):
    title: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=20_000)

    @model_validator(mode="after")
    def _fits(self) -> Self:
        if len(_stored(self).encode("utf-8")) > MAX_DATA_VALUE_BYTES:
            raise ValueError(
                f"the note is over {MAX_DATA_VALUE_BYTES:,} bytes of UTF-8: split it in two"
            )
        return self


class ReadNotes(BaseModel):
    pass


class RequestApproval(BaseModel):
    action: str = Field(min_length=1, max_length=500)
    reason: str = Field(min_length=1, max_length=2000)


def _stored(note: WriteNote) -> str:
    return json.dumps({"title": note.title, "body": note.body}, ensure_ascii=False)


def note_key(step: int) -> str:
    """The key of the note a step writes: one per step, sorting in step order."""
    return f"{NOTES}{step:0{STEP_DIGITS}d}"


@tool(side_effect=True)
def write_note(args: WriteNote, ctx: ToolContext) -> str:
    """Write a note (title and body) to the run's notebook. At most once per step."""
    data: RunData = ctx.resources
    # The step is the step's idempotency key within this run's data: a retried step (same
    # key, same arguments) finds its note there and writes nothing.
    written = data.put_once(note_key(ctx.step), _stored(args))
    return f"Note {args.title!r} " + ("written." if written else "was already written.")


@tool()
def read_notes(args: ReadNotes, ctx: ToolContext) -> str:
    """List the notes written so far, oldest first."""
    data: RunData = ctx.resources
    notes = [json.loads(value) for _, value in data.items(NOTES)]
    return "\n".join(f"# {n['title']}\n{n['body']}" for n in notes) or "No notes yet."


@tool()
def request_approval(args: RequestApproval, ctx: ToolContext) -> ToolResult:
    """Ask a person to approve an action; the run pauses until they decide."""
    return ask_person(f"{args.action}. {args.reason}", action=args.action, reason=args.reason)


def notebook_policy(view: StepView) -> Decision:
    if not view.messages and not view.digest:
        return ToolCall(name="write_note", arguments={"title": "Goal", "body": view.goal})
    return Done(summary="Filed the goal in the run's notebook; the scripted policy does no more.")


def open_notes(ctx: RunContext) -> RunData:
    if ctx.data is None:
        raise RuntimeError(
            "the notebook keeps its notes in the run's data, and this context has none"
        )
    return ctx.data


def fork(source: RunContext, fork: RunContext, step: int) -> None:
    """A fork's notebook holds the notes its source wrote up to the fork point, and none of
    the later ones: its own later steps write theirs under their own step numbers."""
    notes = open_notes(fork)
    for key, value in open_notes(source).items(NOTES):
        if int(key.removeprefix(NOTES)) <= step:
            notes.put_once(key, value)


def verify(ctx: RunContext, state: RunState) -> dict[str, Any]:
    notes = len(open_notes(ctx).items(NOTES))
    return {"ok": True, "status": state.status.value, "notes": notes}


agent = Agent(
    name="notebook",
    goal="Write a short note about the task you are given.",
    tools=[write_note, read_notes, request_approval],
    policy=notebook_policy,
    resources=open_notes,
    verify=verify,
    fork=fork,
)
