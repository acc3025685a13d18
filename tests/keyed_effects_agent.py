"""An agent whose every step applies one effect keyed by its step's key, for the tests of
workers on a shared store killed at random: `params.steps` steps (default 3), each calling
`apply`, then done.

The world is a SQLite file `world.db` in the working directory, shared by every process of a
test: `apply` writes one row per key (a primary key: a second call with the same key changes
nothing) and a line per call to `calls.log`. A key that differed between two attempts of one
step (or a step committed twice) would leave more rows than steps."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from pydantic import BaseModel

from ratchet.tools import Agent, Done, StepView, Tool, ToolCall, ToolContext

WORLD = Path("world.db")
CALLS = Path("calls.log")
AGENT = f"{__name__}:agent"


class Nothing(BaseModel):
    pass


def _world() -> sqlite3.Connection:
    # Generous: eight worker processes write here at once.
    connection = sqlite3.connect(WORLD, timeout=60, isolation_level=None)
    connection.execute(
        "CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, run_id TEXT, pid INTEGER)"
    )
    return connection


def apply(args: Nothing, ctx: ToolContext) -> str:
    with CALLS.open("a") as calls:  # one short append per line: lines never interleave
        calls.write(f"{ctx.idempotency_key} {os.getpid()}\n")
    connection = _world()
    try:
        connection.execute(
            "INSERT OR IGNORE INTO effects (key, run_id, pid) VALUES (?, ?, ?)",
            (ctx.idempotency_key, ctx.run_id, os.getpid()),
        )
    finally:
        connection.close()
    return f"applied {ctx.idempotency_key}"


def policy(view: StepView) -> ToolCall | Done:
    if len(view.messages) < view.params.get("steps", 3):
        return ToolCall(name="apply", arguments={})
    return Done(summary="applied")


agent = Agent(
    name="keyed-effects",
    tools=[Tool("apply", "Apply one keyed effect.", Nothing, apply)],
    goal="Apply",
    policy=policy,
    default_params={"steps": 3},
)


def effects() -> list[tuple[str, str]]:
    """Every effect applied: (key, run id)."""
    connection = _world()
    try:
        return [(str(k), str(r)) for k, r in connection.execute("SELECT key, run_id FROM effects")]
    finally:
        connection.close()
