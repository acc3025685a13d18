"""Listing runs on DynamoDB (moto) without a Scan: a page of runs is a few Queries of the runs
index, and the items they read grow with the page, not with the runs or the step records the
table holds. Every request the store makes is counted."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import boto3
import pytest
from moto import mock_aws

from ratchet.adapters.dynamodb.store import (
    LIST_SHARDS,
    DynamoDbCheckpointStore,
    list_partition,
    list_shard,
    list_sort_key,
)
from ratchet.client import Client
from ratchet.errors import InvalidInput
from ratchet.runtime.aws import AwsRuntime
from ratchet.state import RunState, RunStatus
from tests.dynamodb_seed import seed_runs
from tests.dynamodb_support import REGION, SETTINGS, create_tables

RUNS = 120
STEPS = 20
"""Step records per run, written beside each head as a run's steps would be."""


@dataclass
class Counting:
    """A DynamoDB client that counts the requests made through it, and the items each Query
    and Scan read (their `ScannedCount`)."""

    client: Any
    calls: Counter[str] = field(default_factory=Counter)
    read: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    """A page's first reads go out from threads of their own."""

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.client, name)
        if not callable(call) or name.startswith("_"):
            return call

        def counted(*args: Any, **kwargs: Any) -> Any:
            answer = call(*args, **kwargs)
            with self.lock:
                self.calls[name] += 1
                if name in ("query", "scan"):
                    self.read += answer.get("ScannedCount", 0)
            return answer

        return counted

    def reset(self) -> None:
        self.calls.clear()
        self.read = 0


@dataclass
class Table:
    counting: Counting
    store: DynamoDbCheckpointStore
    done: list[str]

    @property
    def client(self) -> Any:
        """The counting client, where a boto3 client is expected."""
        return self.counting

    def head(self, run_id: str) -> RunState:
        head = self.store.load_head(run_id)
        assert head is not None
        return head


@pytest.fixture(scope="module")
def table() -> Iterator[Table]:
    with mock_aws():
        client = boto3.client(
            "dynamodb",
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        create_tables(
            client,
            checkpoints=SETTINGS.checkpoints_table,
            idempotency=SETTINGS.idempotency_table,
            app=SETTINGS.app_table,
        )
        counting = Counting(client)
        store = DynamoDbCheckpointStore(
            cast(Any, counting),
            table=SETTINGS.checkpoints_table,
            ledger_table=SETTINGS.idempotency_table,
        )
        # Every third run done, each with the step records a long run leaves beside its head
        # (what a Scan reads through): the bench's table, smaller.
        seeded = seed_runs(client, table=SETTINGS.checkpoints_table, runs=RUNS, steps=STEPS)
        yield Table(counting, store, seeded.done)


def test_a_page_of_done_runs_queries_the_index_and_reads_about_the_page(table: Table):
    heads = {run_id: table.head(run_id) for run_id in table.done}
    newest = sorted(heads, key=lambda r: (heads[r].updated_at, r), reverse=True)
    table.counting.reset()
    page = table.store.list_page(status=RunStatus.DONE.value, limit=25)

    assert [r.run_id for r in page] == newest[:25]
    assert all(r.agent == "bench" and r.status == "done" for r in page)
    calls = dict(table.counting.calls)
    assert "scan" not in calls
    assert calls["query"] <= LIST_SHARDS * 3
    # The page, plus at most one read's worth per shard it did not need: never the table's
    # 2,680 items, nor all its 40 done runs.
    chunk = -(-25 // LIST_SHARDS) + 1
    print(f"\nA page of 25 done runs: {calls['query']} queries, {table.counting.read} items read")
    assert 25 <= table.counting.read <= 25 + LIST_SHARDS * chunk


def test_every_run_is_listed_once_across_pages_newest_first(table: Table):
    client = Client(AwsRuntime(SETTINGS, table.client))
    table.counting.reset()
    seen: list[str] = []
    after = None
    while True:
        page = client.runs_page(limit=50, after=after)
        seen += [r.run_id for r in page.runs]
        after = page.next
        if after is None:
            break
    assert sorted(seen) == [f"run-{n:05d}" for n in range(RUNS)]
    assert len(seen) == len(set(seen)) == RUNS
    assert "scan" not in table.counting.calls
    print(f"\n{RUNS} runs in pages of 50: {table.counting.read} items read")
    # Each page reads its runs (and the one past them) plus a read's worth per shard.
    pages = -(-RUNS // 50)
    assert table.counting.read <= RUNS + pages * (1 + len(RunStatus) * LIST_SHARDS * 14)


def test_a_token_no_page_gave_is_refused(table: Table):
    client = Client(AwsRuntime(SETTINGS, table.client))
    for token in ("nonsense", "W10", "WyJ4IiwieSJd"):
        with pytest.raises(InvalidInput, match="after"):
            client.runs_page(after=token)
    with pytest.raises(InvalidInput, match="limit"):
        client.runs_page(limit=0)


def test_a_run_the_index_still_holds_under_its_old_status_is_listed_once(table: Table):
    """The index is eventually consistent: just after a commit that changed a run's status it
    may hold the run's old entry too. Made here by hand: an item under the old status with an
    older change time (its own key, so the head is untouched)."""
    run_id = table.done[0]
    head = table.head(run_id)
    stale = head.updated_at - timedelta(seconds=1)
    table.counting.client.put_item(
        TableName=SETTINGS.checkpoints_table,
        Item={
            "run_id": {"S": run_id},
            "sk": {"S": "STALE-INDEX-ENTRY"},
            "list_pk": {"S": list_partition("running", list_shard(run_id))},
            "list_sk": {"S": list_sort_key(stale, run_id)},
            "status": {"S": "running"},
            "step": {"N": "0"},
            "version": {"N": "1"},
            "updated_at": {"S": stale.isoformat()},
            "agent": {"S": "bench"},
        },
    )
    try:
        listed = table.store.list_page(limit=RUNS + 1)  # room for both entries
        assert [r.run_id for r in listed].count(run_id) == 1
        assert next(r for r in listed if r.run_id == run_id).status == "done"
    finally:
        table.counting.client.delete_item(
            TableName=SETTINGS.checkpoints_table,
            Key={"run_id": {"S": run_id}, "sk": {"S": "STALE-INDEX-ENTRY"}},
        )


def test_a_pages_first_reads_of_every_shard_go_out_at_once(table: Table, monkeypatch):
    # Each partition's first read waits at a barrier for all the others: read one after
    # another, the first would wait alone until the barrier gives up.
    partitions = len(RunStatus) * LIST_SHARDS
    barrier = threading.Barrier(partitions, timeout=10)
    real = table.store._query_index

    def together(partition: str, before: Any, chunk: int, start: Any) -> Any:
        if start is None:
            barrier.wait()
        return real(partition, before, chunk, start)

    monkeypatch.setattr(table.store, "_query_index", together)
    page = table.store.list_page(limit=10)

    assert len(page) == 10
    assert not barrier.broken
