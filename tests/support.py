"""Test doubles and wiring shared by the engine tests: a stub LLM, a fake side-effecting tool
that keeps a real SQLite table, and an engine on a real SQLite store."""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel

from ratchet.adapters.file_blobs import FileBlobStore
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.ledger import SqliteLedger
from ratchet.adapters.sqlite.store import SqliteCheckpointStore
from ratchet.engine import Binding, Engine
from ratchet.faults import NO_FAULTS, FaultPlan
from ratchet.ports import BlobStore, CheckpointStore, IdempotencyLedger, Model, ModelRequest
from ratchet.state import Decision, Done, RunOptions, RunState, ToolCall
from ratchet.tools import Agent, Tool, ToolContext, ask_person

LOG = logging.getLogger("ratchet.tests")


class WriteRow(BaseModel):
    n: int


class FakeTable:
    """A side-effecting tool's world: a real table, applied at most once per key."""

    def __init__(self, path: Path) -> None:
        # The engine runs tools on a thread of its own (the step time limit).
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY, n INTEGER)")
        self.received: list[str] = []

    def apply(self, args: WriteRow, ctx: ToolContext) -> str:
        self.received.append(ctx.idempotency_key)
        inserted = self.db.execute(
            "INSERT INTO rows (key, n) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
            (ctx.idempotency_key, args.n),
        ).rowcount
        return f"row {args.n} " + ("written" if inserted else "already written")

    @property
    def row_count(self) -> int:
        (count,) = self.db.execute("SELECT count(*) FROM rows").fetchone()
        return int(count)

    def keys(self) -> list[str]:
        return [k for (k,) in self.db.execute("SELECT key FROM rows ORDER BY n")]


@dataclass
class StubModel:
    """Writes row n at step n, asks for approval at `ask_at`, then reports DONE."""

    total: int
    ask_at: int | None = None
    calls: list[int] = field(default_factory=list)

    def decide(self, request: ModelRequest) -> Decision:
        step = request.view.step
        self.calls.append(step)
        if step > self.total:
            return Done(summary=f"wrote {self.total} rows")
        if step == self.ask_at:
            return ToolCall(name="ask", arguments={"n": step})
        return ToolCall(name="write_row", arguments={"n": step})


def fake_agent(table: FakeTable) -> Agent:
    return Agent(
        name="fake",
        tools=[
            Tool("write_row", "Write row n.", WriteRow, table.apply, side_effect=True),
            Tool("ask", "Ask a person.", WriteRow, lambda args, ctx: ask_person(f"ok {args.n}?")),
        ],
    )


@dataclass
class Harness:
    """An engine on a real SQLite file. `restart()` is a fresh process's view: new
    connections, new engine, nothing carried over in memory but the stub's call log.

    Subclasses put the same engine on another backend by overriding `_connect`,
    `_disconnect`, `store`, `ledger` and `blobs`."""

    root: Path
    model: StubModel
    faults: FaultPlan = NO_FAULTS
    worker_id: str = "worker-1"

    def __post_init__(self) -> None:
        self.table = FakeTable(self.root / "app.db")
        self._connect()
        self.engine = self._engine()

    def _connect(self) -> None:
        self.db = SqliteDatabase(self.root / "ratchet.db")

    def _disconnect(self) -> None:
        self.db.close()

    def _engine(self) -> Engine:
        return self.engine_for(fake_agent(self.table), self.model, worker_id=self.worker_id)

    def engine_for(
        self,
        agent: Agent,
        model: Model,
        *,
        worker_id: str = "w",
        faults: FaultPlan | None = None,
        **options: Any,
    ) -> Engine:
        """An engine on this harness's store for `agent` driven by `model`; `options` are
        the Engine's other settings (`abandoned_grace_seconds`, ...)."""
        binding = Binding(agent, model)
        return Engine(
            store=self.store,
            ledger=self.ledger,
            blobs=self.blobs,
            bind=lambda state: binding,
            worker_id=worker_id,
            logger=LOG,
            faults=self.faults if faults is None else faults,
            **options,
        )

    @property
    def store(self) -> CheckpointStore:
        return SqliteCheckpointStore(self.db)

    @property
    def ledger(self) -> IdempotencyLedger:
        return SqliteLedger(self.db)

    @property
    def blobs(self) -> BlobStore:
        return FileBlobStore(self.root / "blobs")

    def start(self, run_id: str = "run", **options: int) -> RunState:
        state = RunState(
            run_id=run_id, agent="fake", goal="write the rows", options=RunOptions(**options)
        )
        assert self.engine.start(state)
        return self.engine.load(run_id)

    def restart(self, *, faults: FaultPlan = NO_FAULTS, worker_id: str = "worker-2") -> Self:
        self._disconnect()
        self.faults, self.worker_id = faults, worker_id
        self._connect()
        self.engine = self._engine()
        return self

    def run_until_stopped(self, run_id: str = "run", limit: int = 500) -> RunState:
        from ratchet.engine import Outcome

        for _ in range(limit):
            if self.engine.advance(run_id).outcome is not Outcome.CONTINUE:
                return self.engine.load(run_id)
        raise AssertionError(f"run {run_id} did not stop within {limit} advances")
