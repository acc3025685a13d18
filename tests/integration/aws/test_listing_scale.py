"""Listing at scale on the deployed shape (moto): with 1,000 runs of 50 step records each
(~51,000 items), `GET /runs?status=done&limit=50` and the dashboard's runs page read a page of
the runs index and nothing else: no Scan, no read per run. Every DynamoDB request the handlers'
client makes is counted, with the items it read (`ScannedCount`, what a read is billed by).

The bounds come from `DynamoDbCheckpointStore.list_page`: a page of `limit` runs asks the store
for `limit + 1` (to know whether a `next` follows) and reads each index partition newest first,
`ceil((limit + 1) / LIST_SHARDS) + 1` items a Query, one Query per partition at once, then more
only for the partitions the merge draws from. So a partition reads at most one Query's worth
past the items it gives the page."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from werkzeug.test import Client as HttpClient

from ratchet.adapters.dynamodb.store import LIST_SHARDS
from ratchet.handlers import _wiring, api
from ratchet.state import RunStatus
from ratchet.web.dashboard import RUNS_PER_PAGE, local_app
from ratchet.web.serve import wsgi_app
from tests.dynamodb_seed import Seeded, seed_runs
from tests.integration.aws.harness import TABLES, FakeContext, Stack, api_event, deployed

RUNS = 1000
STEPS = 50
LIMIT = 50


def _chunk(limit: int) -> int:
    """The items each Query of a page of `limit` runs asks for (`list_page`)."""
    return -(-(limit + 1) // LIST_SHARDS) + 1


@dataclass
class Reads:
    """Every DynamoDB request made through a client, by operation, and the items its Queries
    and Scans read, from botocore's after-call event."""

    calls: Counter[str] = field(default_factory=Counter)
    items: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    """A page's first Queries go out from threads of their own."""

    def __call__(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        with self.lock:
            self.calls[model.name] += 1
            self.items += int(parsed.get("ScannedCount", 0))


@dataclass(frozen=True)
class Listing:
    stack: Stack
    seeded: Seeded


@pytest.fixture(scope="module")
def listing() -> Iterator[Listing]:
    with pytest.MonkeyPatch.context() as monkeypatch, deployed(monkeypatch) as stack:
        seeded = seed_runs(stack.dynamodb, table=TABLES["checkpoints"], runs=RUNS, steps=STEPS)
        assert seeded.items > RUNS * STEPS
        yield Listing(stack, seeded)


@pytest.fixture
def reads() -> Iterator[Reads]:
    """The requests of the handlers' own DynamoDB client (`_wiring.runtime`), from here on."""
    counted = Reads()
    events = _wiring.runtime().dynamodb.meta.events
    events.register("after-call.dynamodb", counted, unique_id="listing-scale")
    try:
        yield counted
    finally:
        events.unregister("after-call.dynamodb", unique_id="listing-scale")


def _newest(listing: Listing, run_ids: list[str]) -> list[str]:
    changed = listing.seeded.changed
    return sorted(run_ids, key=lambda r: (changed[r], r), reverse=True)


def test_a_page_of_done_runs_reads_the_page_not_the_table(listing: Listing, reads: Reads):
    """At most 107 items read: the page's 51 runs (50 and the one that says a `next` follows)
    plus one 14-item Query's worth for each of the done status's 4 shards; at most 7 Queries
    (4 at once, then at most 3 as the merge draws on). The table holds ~51,000 items, 333 of
    them done heads."""
    event = api_event("GET", "/runs", None, query={"status": ["done"], "limit": [str(LIMIT)]})

    response = api.handler(event, FakeContext("ratchet-api", "arn:ratchet-api"))

    assert response["statusCode"] == 200
    page = json.loads(response["body"])
    assert [r["run_id"] for r in page["runs"]] == _newest(listing, listing.seeded.done)[:LIMIT]
    assert {(r["status"], r["agent"]) for r in page["runs"]} == {("done", "bench")}
    assert page["next"]
    assert dict(reads.calls) == {"Query": reads.calls["Query"]}, "Queries only: no Scan"
    assert LIST_SHARDS <= reads.calls["Query"] <= 7
    bound = LIMIT + 1 + LIST_SHARDS * _chunk(LIMIT)
    assert bound == 107
    print(f"\nGET /runs?status=done&limit=50: {reads.calls['Query']} Queries, {reads.items} items")
    assert LIMIT + 1 <= reads.items <= bound


def test_the_dashboards_runs_page_makes_one_list_query(
    listing: Listing, reads: Reads, monkeypatch: pytest.MonkeyPatch
):
    """One `list_page` of the store, no `list_runs` and no head read: one round of Queries,
    one per partition of the index (6 statuses x 4 shards = 24, at once), each asking for 27
    (a page of 100 asks the store for 101), then at most 3 more as the merge draws on the 8
    partitions that hold runs (done and running; 11 Queries of 27 at most between them to
    give 101). So at most 101 + 8 x 27 = 317 items read, of the 1,000 runs' index items and
    the table's ~51,000."""
    store = _wiring.runtime().store
    lists: Counter[str] = Counter()
    for name in ("list_page", "list_runs"):
        real = getattr(store, name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            lists[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(store, name, counted)
    app = local_app(_wiring.runs_services().client, _wiring.approval_desk(), operator="dana")
    http = HttpClient(wsgi_app([("/dashboard", app)]))

    response = http.get("/dashboard")

    assert response.status_code == 200
    html = response.get_data(as_text=True)
    newest = _newest(listing, listing.seeded.run_ids)[:RUNS_PER_PAGE]
    assert html.count("<tr><td><a href='/dashboard/runs/") == RUNS_PER_PAGE
    assert f">{newest[0]}</a>" in html
    assert f">{newest[-1]}</a>" in html
    assert "id='older'" in html
    assert dict(lists) == {"list_page": 1}
    assert dict(reads.calls) == {"Query": reads.calls["Query"]}, "Queries only: no Scan"
    partitions = len(RunStatus) * LIST_SHARDS
    assert partitions <= reads.calls["Query"] <= partitions + 3
    print(f"\nGET /dashboard: {reads.calls['Query']} Queries, {reads.items} items")
    assert RUNS_PER_PAGE + 1 <= reads.items <= RUNS_PER_PAGE + 1 + 2 * LIST_SHARDS * _chunk(100)
