"""A run's feed through the library (issue 35): `Client.follow` yields each event once, in
order, with ids that only increase, from the store's own records; it ends where the run ends
or parks, as asked; a follower that resumes after the last id it read misses nothing and sees
nothing twice; a parked run that was answered since does not end a feed that waits for the
end; and refusals are typed, with nothing written."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import ratchet
from ratchet.errors import InvalidInput, RunNotFound
from ratchet.feed import PARKED_OR_ENDED, FeedEvent
from ratchet.state import RunStatus
from tests.waits_agent import AGENT

PATIENCE = 30.0


@pytest.fixture
def client(tmp_path: Path) -> Iterator[ratchet.Client]:
    with ratchet.connect(f"sqlite:///{tmp_path}/runs.db", environ={}) as connected:
        yield connected


def _kinds(events: list[FeedEvent]) -> list[tuple[str, str | None]]:
    return [(e.type, e.tool) for e in events]


def test_the_feed_of_a_run_that_parks_is_answered_and_ends(client):
    client.run(run_id="m1", scenario="migration", input={"batches": 2})

    parked = list(client.follow("m1", until=PARKED_OR_ENDED, timeout=PATIENCE))
    client.approve("m1", by="dana", comment="ok")
    client.work("m1")
    rest = list(client.follow("m1", after=parked[-1].id, timeout=PATIENCE))
    whole = list(client.follow("m1", timeout=PATIENCE))

    assert _kinds(parked) == [
        ("started", None),
        ("step", "inspect_table"),
        ("step", "copy_batch"),
        ("step", "copy_batch"),
        ("waiting", "request_approval"),
    ]
    waiting = parked[-1]
    assert waiting.wait is not None
    assert (waiting.wait.kind, waiting.wait.answer) == (
        "person",
        {"approve": "/runs/m1/approve", "reject": "/runs/m1/reject"},
    )
    assert _kinds(rest) == [
        ("decided", None),
        ("step", "drop_table"),
        ("step", "send_email"),
        ("done", None),
    ]
    assert (rest[0].approved, rest[0].by, rest[0].comment) == (True, "dana", "ok")
    assert rest[-1].summary
    assert rest[-1].status is RunStatus.DONE
    # One sequence: resuming after an id is the rest of the whole, nothing repeated.
    assert whole == parked + rest
    ids = [e.id for e in whole]
    assert ids == sorted(set(ids))
    assert [c.version for c in client.history("m1")] == ids


def test_a_feed_to_the_parking_spot_goes_past_waits_the_run_has_left(client):
    # Given a run that parked, was answered and has ended
    client.run(run_id="m2", scenario="migration", input={"batches": 1})
    client.approve("m2", by="dana")
    client.work("m2")

    # When a feed that ends where the run parks reads it from its start
    events = list(client.follow("m2", until=PARKED_OR_ENDED, timeout=PATIENCE))

    # Then it reads past the old wait to where the run stands now: done
    assert [e.type for e in events].count("waiting") == 1
    assert events[-1].type == "done"


def test_follow_yields_what_another_thread_writes_as_it_is_written(client, tmp_path):
    client.run(run_id="w1", agent=AGENT, input={"merge": True})
    seen: list[FeedEvent] = []
    following = threading.Thread(
        target=lambda: seen.extend(client_for(tmp_path).follow("w1", poll=0.02, timeout=PATIENCE))
    )
    following.start()

    client.send_event("w1", "ci-finished", {"conclusion": "success"}, event_id="gh-1")
    client.work("w1")
    following.join(PATIENCE)

    assert not following.is_alive()
    assert [e.type for e in seen] == ["started", "waiting", "event_received", "step", "done"]
    assert seen[2].name == "ci-finished"
    assert seen[2].event_id == "gh-1"
    assert seen[1].wait is not None
    assert seen[1].wait.answer["hook"] == "/runs/w1/hooks/ci-finished"


def client_for(tmp_path: Path) -> ratchet.Client:
    # A follower of its own, as another process would be (the store's connection is per thread).
    return ratchet.connect(f"sqlite:///{tmp_path}/runs.db", environ={})


def test_the_async_follow_yields_the_same_events(client):
    client.run(run_id="a1", scenario="migration", input={"batches": 1})

    async def follow() -> list[FeedEvent]:
        async_client = ratchet.AsyncClient(client)  # not closed: `client` is the fixture's
        return [e async for e in async_client.follow("a1", until=["waiting"])]

    events = asyncio.run(follow())

    assert events == list(client.follow("a1", until=["waiting"], timeout=PATIENCE))
    assert events[-1].type == "waiting"


@pytest.mark.parametrize(
    ("run_id", "options", "error"),
    [
        ("nope", {}, RunNotFound),
        ("m3", {"after": -1}, InvalidInput),
        ("m3", {"after": "7"}, InvalidInput),
        ("m3", {"until": []}, InvalidInput),
        ("m3", {"until": ["sleeping"]}, InvalidInput),
    ],
)
def test_follow_refuses_what_is_not_a_feed(client, run_id, options, error):
    client.run(run_id="m3", scenario="migration", input={"batches": 1})
    before = client.head("m3").version

    with pytest.raises(error):
        next(client.follow(run_id, **options))

    assert client.head("m3").version == before
