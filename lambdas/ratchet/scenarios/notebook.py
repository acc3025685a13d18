"""Scenario `notebook`: a general agent for `ratchet start --goal TEXT` without `--agent`.

Its one side effect is writing notes (at most once per step key); it can ask a person before
doing anything it considers risky. Offline, the scripted policy files the goal as a note and
reports done; with Claude, the model works the goal with these tools.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from pydantic import BaseModel, Field

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


class WriteNote(BaseModel):
    title: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=20_000)


class ReadNotes(BaseModel):
    pass


class RequestApproval(BaseModel):
    action: str = Field(min_length=1, max_length=500)
    reason: str = Field(min_length=1, max_length=2000)


def _notes(ctx: ToolContext) -> sqlite3.Connection:
    connection: sqlite3.Connection = ctx.resources
    return connection


@tool(side_effect=True)
def write_note(args: WriteNote, ctx: ToolContext) -> str:
    """Write a note (title and body) to the run's notebook. At most once per step."""
    with _notes(ctx) as db:
        inserted = db.execute(
            "INSERT INTO notes (key, title, body) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
            (ctx.idempotency_key, args.title, args.body),
        ).rowcount
    return f"Note {args.title!r} " + ("written." if inserted else "was already written.")


@tool()
def read_notes(args: ReadNotes, ctx: ToolContext) -> str:
    """List the notes written so far, oldest first."""
    rows = _notes(ctx).execute("SELECT title, body FROM notes ORDER BY rowid").fetchall()
    return "\n".join(f"# {title}\n{body}" for title, body in rows) or "No notes yet."


@tool()
def request_approval(args: RequestApproval, ctx: ToolContext) -> ToolResult:
    """Ask a person to approve an action; the run pauses until they decide."""
    return ask_person(f"{args.action}. {args.reason}", action=args.action, reason=args.reason)


def notebook_policy(view: StepView) -> Decision:
    if not view.messages and not view.digest:
        return ToolCall(name="write_note", arguments={"title": "Goal", "body": view.goal})
    return Done(summary="Filed the goal in the run's notebook; the scripted policy does no more.")


def open_notes(ctx: RunContext) -> sqlite3.Connection:
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    # Used by the tools on the engine's agent thread, one at a time; closed by whoever owns it.
    db = sqlite3.connect(ctx.workdir / "notes.db", timeout=30.0, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS notes (key TEXT PRIMARY KEY, title TEXT NOT NULL, "
        "body TEXT NOT NULL)"
    )
    return db


def verify(ctx: RunContext, state: RunState) -> dict[str, Any]:
    db = open_notes(ctx)
    try:
        (notes,) = db.execute("SELECT count(*) FROM notes").fetchone()
    finally:
        db.close()
    return {"ok": True, "status": state.status.value, "notes": notes}


agent = Agent(
    name="notebook",
    goal="Write a short note about the task you are given.",
    tools=[write_note, read_notes, request_approval],
    policy=notebook_policy,
    resources=open_notes,
    verify=verify,
)
