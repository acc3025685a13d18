"""One `Client` shared by many threads, and an `AsyncClient` awaited many times at once, on a
SQLite store: no errors, every run there exactly once, each step's effect applied once."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pydantic import BaseModel

from ratchet import AsyncClient, Client, connect
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.tools import (
    Agent,
    Decision,
    Done,
    StepView,
    ToolCall,
    ToolContext,
    tool,
)

THREADS = 8
RUNS_PER_THREAD = 4
GATHERED = 20


class Nothing(BaseModel):
    pass


CALLS: Counter[str] = Counter()
"""How often each step key's tool call ran, across every thread."""
_CALLS_LOCK = threading.Lock()


@tool(side_effect=True)
def tally(args: Nothing, ctx: ToolContext) -> str:
    """Count this step's call."""
    with _CALLS_LOCK:
        CALLS[ctx.idempotency_key] += 1
    return f"tallied step {ctx.step}"


def tally_twice(view: StepView) -> Decision:
    return ToolCall(name="tally") if view.step <= 2 else Done(summary="tallied twice")


tallying = Agent(name="tallying", goal="Tally.", tools=[tally], policy=tally_twice)
AGENT = f"{__name__}:tallying"


def _called_once_per_step(run_ids: list[str]) -> bool:
    expected = {f"{run_id}/step-{step}" for run_id in run_ids for step in (1, 2)}
    return {key for key in CALLS if key in expected} == expected and all(
        CALLS[key] == 1 for key in expected
    )


@pytest.fixture
def client(tmp_path: Path) -> Client:
    return connect(f"sqlite:///{tmp_path / 'ratchet.db'}")


def test_eight_threads_start_work_and_read_runs_through_one_client(client: Client) -> None:
    def work_runs(thread: int) -> list[str]:
        done = []
        for i in range(RUNS_PER_THREAD):
            run_id = f"t{thread}-{i}"
            started = client.start(run_id=run_id, agent=AGENT)
            assert started.status == "running"
            run = client.work(run_id)
            assert (run.status, run.summary) == ("done", "tallied twice")
            assert client.get(run_id).step == 2
            assert [c.event for c in client.history(run_id)][-1] == "finished"
            client.runs(status="done")  # a listing beside the others' writes
            done.append(run_id)
        return done

    with client, ThreadPoolExecutor(THREADS) as pool:
        finished = [run_id for ids in pool.map(work_runs, range(THREADS)) for run_id in ids]
        listed = [r.run_id for r in client.runs()]

    expected = sorted(f"t{t}-{i}" for t in range(THREADS) for i in range(RUNS_PER_THREAD))
    assert sorted(finished) == expected
    assert sorted(listed) == expected, "every run there exactly once"
    assert _called_once_per_step(expected), "each step's tool ran once"


def test_an_async_client_runs_twenty_gathered_calls(client: Client) -> None:
    async def main() -> tuple[list[str], list[str]]:
        async with AsyncClient(client) as runs:
            done = await asyncio.gather(
                *(runs.run(run_id=f"a{i}", agent=AGENT) for i in range(GATHERED))
            )
            assert {(run.status, run.summary) for run in done} == {("done", "tallied twice")}
            listed = await runs.runs()
            return [run.run_id for run in done], [run.run_id for run in listed]

    done, listed = asyncio.run(main())

    expected = sorted(f"a{i}" for i in range(GATHERED))
    assert sorted(done) == expected
    assert sorted(listed) == expected, "every run there exactly once"
    assert _called_once_per_step(expected), "each step's tool ran once"


def test_an_async_client_offers_the_clients_methods_and_nothing_else(client: Client) -> None:
    runs = AsyncClient(client)

    assert {"run", "start", "approve", "history", "close"} <= set(dir(runs))
    with pytest.raises(AttributeError, match="has no method 'runtime'"):
        runs.runtime  # noqa: B018 - the attribute is the test
    with pytest.raises(AttributeError, match="has no method '_work'"):
        runs._work  # noqa: B018
    client.close()


def test_each_thread_works_runs_as_a_worker_of_its_own(client: Client) -> None:
    seen: list[str] = []
    thread = threading.Thread(target=lambda: seen.append(client._worker()), name="caller-2")
    thread.start()
    thread.join()
    client.close()

    assert client._worker() == client.worker_id
    assert seen == [f"{client.worker_id}/caller-2"], "a lease held by one id lets that id in"


def test_a_database_gives_each_thread_its_own_connection_and_closes_them_all(tmp_path):
    db = SqliteDatabase(tmp_path / "ratchet.db")
    theirs: list[object] = []
    thread = threading.Thread(target=lambda: theirs.append(db.connection))
    thread.start()
    thread.join()

    assert db.connection is db.connection
    assert theirs[0] is not db.connection
    db.close()
    with pytest.raises(Exception, match="closed database"):
        db.connection.execute("SELECT 1")
