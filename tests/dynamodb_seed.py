"""A checkpoints table of many runs, filled in seconds: each run's head and step records as
the store's commits would leave them, built by the store's own item functions
(`ratchet.adapters.dynamodb.store`), written straight to the table with BatchWriteItem, 25
items a call. Committing 10,000 runs one transaction at a time takes minutes on moto; the
listing tests and `bench.many_runs` need the items, not the commits."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ratchet.adapters.dynamodb.items import DEFAULT_RETENTION_DAYS, text_attribute
from ratchet.adapters.dynamodb.store import checkpoint_item, created_head_item
from ratchet.state import (
    Created,
    Finished,
    RunState,
    RunStatus,
    StepCompleted,
    StoredCheckpoint,
    ToolCall,
    ToolOutput,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from ratchet.adapters.dynamodb.items import Item

BATCH = 25
"""BatchWriteItem's most items a call."""
AGENT = "bench"
DONE_EVERY = 3
"""Every third run (run 0, 3, 6, ...) is done; the others are running."""
WORKER = "seed"
OUTPUT = "row written; " * 16
"""Each step's tool output: ~200 B, so a step record is ~600 B, as a small real step's is."""
_RETENTION = timedelta(days=DEFAULT_RETENTION_DAYS)


@dataclass(frozen=True)
class Seeded:
    run_ids: list[str]
    """Every run, `run-00000` on, in id order (their change times are shuffled)."""
    done: list[str]
    changed: dict[str, datetime]
    """Each run's last change, as its head and index item hold it."""
    items: int
    """Items written: heads and step records."""


def run_id(number: int) -> str:
    return f"run-{number:05d}"


def seed_runs(
    client: DynamoDBClient,
    *,
    table: str,
    runs: int,
    steps: int,
    now: datetime | None = None,
) -> Seeded:
    """`runs` runs of `AGENT` (every `DONE_EVERY`th done, the rest running), each with its
    creation record and `steps` step records, and a finishing record if done. Their last
    changes are a second apart, shuffled against their ids, the newest at `now`."""
    latest = now or datetime.now(UTC)
    moments = random.Random(runs).sample(range(runs), runs)
    steps_of = _step_records(run_id(0), steps, latest)
    changed = {run_id(n): latest - timedelta(seconds=moments[n]) for n in range(runs)}
    written = 0
    batch: list[Item] = []
    for number in range(runs):
        run = run_id(number)
        for item in _run_items(run, number, steps, steps_of, changed[run]):
            batch.append(item)
            if len(batch) == BATCH:
                written += _write(client, table, batch)
                batch = []
    written += _write(client, table, batch)
    return Seeded(
        run_ids=[run_id(n) for n in range(runs)],
        done=[run_id(n) for n in range(0, runs, DONE_EVERY)],
        changed=changed,
        items=written,
    )


def _step_records(template: str, steps: int, at: datetime) -> list[Item]:
    """Versions 2 to `steps` + 1, for the run `template`; another run's are these with its
    id in place of the template's (it appears in the key and the call's arguments)."""
    records = []
    for step in range(1, steps + 1):
        event = StepCompleted(
            step=step,
            key=f"{template}/step-{step}",
            call=ToolCall(name="write_row", arguments={"run": template, "row": step}),
            output=ToolOutput(step=step, tool="write_row", text=OUTPUT),
            attempt=1,
            duration_ms=12.5,
        )
        record = StoredCheckpoint(
            run_id=template,
            version=step + 1,
            step=step,
            status=RunStatus.RUNNING,
            worker_id=WORKER,
            created_at=at,
            event=event,
        )
        records.append(checkpoint_item(record, other_bytes=0, retention=_RETENTION)[0])
    return records


def _run_items(
    run: str, number: int, steps: int, steps_of: list[Item], changed: datetime
) -> Iterator[Item]:
    template = steps_of[0]["run_id"]["S"] if steps_of else run
    created = RunState(
        run_id=run, agent=AGENT, goal="list me", created_at=changed, updated_at=changed
    )
    yield _record(created, 1, 0, Created(state=created), changed)
    for item in steps_of:
        yield {
            **item,
            "run_id": text_attribute(run),
            "event": text_attribute(item["event"]["S"].replace(template, run)),
        }
    head = created.model_copy(update={"step": steps, "version": steps + 1})
    if number % DONE_EVERY == 0:
        head = head.model_copy(
            update={"status": RunStatus.DONE, "version": steps + 2, "summary": "listed"}
        )
        finished = Finished(status=RunStatus.DONE, summary="listed")
        yield _record(head, steps + 2, steps, finished, changed)
    yield created_head_item(head)


def _record(
    state: RunState, version: int, step: int, event: Created | Finished, at: datetime
) -> Item:
    record = StoredCheckpoint(
        run_id=state.run_id,
        version=version,
        step=step,
        status=state.status,
        worker_id=WORKER,
        created_at=at,
        event=event,
    )
    return checkpoint_item(record, other_bytes=0, retention=_RETENTION)[0]


def _write(client: DynamoDBClient, table: str, items: list[Item]) -> int:
    """Write `items` (at most `BATCH`), sending again what DynamoDB left unprocessed."""
    requests: list[Any] = [{"PutRequest": {"Item": item}} for item in items]
    while requests:
        answer = client.batch_write_item(RequestItems={table: requests})
        requests = list(answer.get("UnprocessedItems", {}).get(table, []))
    return len(items)
