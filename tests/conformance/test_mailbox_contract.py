"""The contract every Mailbox backend must honour (`ratchet.ports.Mailbox`), with the checkpoint
store's half of it: a commit that consumes an event (`Commit.consumes`).

One suite, parametrised over backends (`backend` in conftest.py): SqliteMailbox beside the
SQLite store, DynamoMailbox beside the DynamoDB store (moto). Where the backends differ on
purpose (how long DynamoDB keeps an item), the difference is a test of its own at the end.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from ratchet.adapters.dynamodb.items import DEFAULT_RETENTION_DAYS, TTL_ATTRIBUTE, epoch_seconds
from ratchet.errors import MailboxFull, StaleVersion
from ratchet.ports import Commit, Consumption, LedgerEntry, LedgerStatus
from ratchet.state import (
    EventWait,
    RunState,
    RunStatus,
    StepCompleted,
    ToolCall,
    ToolOutput,
    utcnow,
)
from ratchet.waits import MAX_MAILBOX_EVENTS, SentEvent, event_arrived
from tests.conformance.conftest import BACKENDS, SEALED_BACKENDS
from tests.conformance.test_store_contract import commit_of, new_run, step_commit

if TYPE_CHECKING:
    from tests.conformance.conftest import Backend

T0 = utcnow().replace(microsecond=0)
RACERS = 20


@pytest.fixture(params=[*sorted(BACKENDS), *sorted(SEALED_BACKENDS)])
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Backend]:
    """Each backend, and each with its records sealed (`RATCHET_PAYLOAD_KEY`)."""
    yield from {**BACKENDS, **SEALED_BACKENDS}[request.param](tmp_path)


def sent(
    event_id: str = "ev-1",
    *,
    run_id: str = "r1",
    name: str = "ci-finished",
    payload: object = None,
    seconds: float = 0,
) -> SentEvent:
    return SentEvent(
        run_id=run_id,
        event_id=event_id,
        name=name,
        received_at=T0 + timedelta(seconds=seconds),
        payload={"conclusion": "success", "id": event_id} if payload is None else payload,
        size=40,
    )


def ids(events: list[SentEvent]) -> list[str]:
    return [e.event_id for e in events]


# --- post, get, of_run -------------------------------------------------------------------------


def test_a_posted_event_reads_back_as_it_was_posted_and_pending(backend):
    event = sent(payload={"conclusion": "success", "url": "https://ci.example/1", "n": [1, 2]})

    assert backend.mailbox.post(event) == (event, True)

    assert backend.mailbox.get("r1", "ev-1") == event
    assert backend.mailbox.of_run("r1") == [event]
    assert event.is_pending


def test_an_event_is_found_only_under_its_own_run(backend):
    backend.mailbox.post(sent("ev-1", run_id="r1"))

    assert backend.mailbox.get("r2", "ev-1") is None
    assert backend.mailbox.get("r1", "ev-unknown") is None
    assert backend.mailbox.of_run("r2") == []
    assert backend.mailbox.next_for("r2", "ci-finished") is None


def test_a_second_post_of_an_id_returns_the_first_and_changes_nothing(backend):
    first = sent("ev-1", payload={"conclusion": "success"})
    backend.mailbox.post(first)
    before = backend.everything()

    # A sender's retry, even with another payload and name: the first one stands.
    again = sent("ev-1", name="deploy-done", payload={"conclusion": "failure"}, seconds=5)
    assert backend.mailbox.post(again) == (first, False)

    assert backend.everything() == before
    assert backend.mailbox.of_run("r1") == [first]


def test_an_event_id_is_taken_once_per_run(backend):
    # The same id sent to two runs is two events (a sender's id is unique to it, not to us).
    assert backend.mailbox.post(sent("ev-1", run_id="r1"))[1]
    assert backend.mailbox.post(sent("ev-1", run_id="r2"))[1]

    assert ids(backend.mailbox.of_run("r1")) == ids(backend.mailbox.of_run("r2")) == ["ev-1"]


def test_twenty_concurrent_posts_of_one_id_create_it_exactly_once(backend: Backend) -> None:
    """Twenty senders (a webhook's redeliveries, a client's retries) post one event id at
    once, each through a connection of its own: one creates it, every other one is told it
    exists and gets the stored event back."""
    start = threading.Barrier(RACERS)

    def post(n: int) -> tuple[SentEvent, bool]:
        with backend.connect() as mailbox:
            start.wait(timeout=30)
            return mailbox.post(sent("ev-1", payload={"sender": n}))

    with ThreadPoolExecutor(RACERS) as pool:
        answers = list(pool.map(post, range(RACERS)))

    created = [event for event, new in answers if new]
    assert len(created) == 1
    assert all(event == created[0] for event, _ in answers)
    assert backend.mailbox.of_run("r1") == created


def test_concurrent_posts_of_other_ids_each_land_once_in_one_order(backend: Backend) -> None:
    start = threading.Barrier(RACERS)

    def post(n: int) -> bool:
        with backend.connect() as mailbox:
            start.wait(timeout=30)
            return mailbox.post(sent(f"ev-{n:02d}"))[1]

    with ThreadPoolExecutor(RACERS) as pool:
        created = list(pool.map(post, range(RACERS)))

    assert created == [True] * RACERS
    listed = ids(backend.mailbox.of_run("r1"))
    assert sorted(listed) == [f"ev-{n:02d}" for n in range(RACERS)]
    assert ids(backend.mailbox.of_run("r1")) == listed, "one order of arrival, every read"


def test_of_run_lists_events_in_the_order_they_arrived(backend):
    # Neither the ids' order nor the senders' clocks: the second sender's clock is behind.
    for event_id, seconds in (("ev-c", 0), ("ev-a", -30), ("ev-b", 0)):
        backend.mailbox.post(sent(event_id, seconds=seconds))

    assert ids(backend.mailbox.of_run("r1")) == ["ev-c", "ev-a", "ev-b"]


# --- next_for and refuse -----------------------------------------------------------------------


def test_next_for_is_the_first_pending_event_of_its_name(backend):
    for event_id, name in (
        ("ev-z", "deploy-done"),
        ("ev-y", "ci-finished"),
        ("ev-x", "ci-finished"),
    ):
        backend.mailbox.post(sent(event_id, name=name))

    first = backend.mailbox.next_for("r1", "ci-finished")
    assert first is not None
    assert first.event_id == "ev-y"
    deploy = backend.mailbox.next_for("r1", "deploy-done")
    assert deploy is not None
    assert deploy.event_id == "ev-z"
    assert backend.mailbox.next_for("r1", "never-sent") is None


def test_next_for_skips_refused_and_consumed_events(backend):
    head = parked(backend)
    for event_id in ("ev-1", "ev-2", "ev-3"):
        backend.mailbox.post(sent(event_id))

    backend.mailbox.refuse("r1", "ev-1", "data.conclusion: 'maybe' is not one of the choices")
    after = settle(backend, head, "ev-2")

    third = backend.mailbox.next_for("r1", "ci-finished")
    assert third is not None
    assert third.event_id == "ev-3"
    assert after.status is RunStatus.RUNNING
    backend.mailbox.refuse("r1", "ev-3", "no")
    assert backend.mailbox.next_for("r1", "ci-finished") is None


def test_refuse_marks_a_pending_event_with_why_and_keeps_it(backend):
    backend.mailbox.post(sent("ev-1"))

    backend.mailbox.refuse("r1", "ev-1", "data.conclusion: 'maybe' is not one of the choices")

    refused = backend.mailbox.get("r1", "ev-1")
    assert refused is not None
    assert refused.refused == "data.conclusion: 'maybe' is not one of the choices"
    assert (refused.consumed_step, refused.is_pending) == (None, False)
    assert backend.mailbox.of_run("r1") == [refused]


def test_refuse_changes_only_a_pending_event(backend):
    head = parked(backend)
    backend.mailbox.post(sent("ev-1"))
    backend.mailbox.post(sent("ev-2"))
    settle(backend, head, "ev-1")
    backend.mailbox.refuse("r1", "ev-2", "the first reason")
    before = backend.everything()

    backend.mailbox.refuse("r1", "ev-1", "too late: it was consumed")
    backend.mailbox.refuse("r1", "ev-2", "a second reason")
    backend.mailbox.refuse("r1", "ev-unknown", "never sent")

    assert backend.everything() == before
    consumed, refused = backend.mailbox.of_run("r1")
    assert (consumed.consumed_step, consumed.refused) == (1, None)
    assert refused.refused == "the first reason"


# --- the bound ---------------------------------------------------------------------------------


def fill(backend, count: int = MAX_MAILBOX_EVENTS) -> None:
    for n in range(count):
        backend.mailbox.post(sent(f"ev-{n:03d}"))


def test_a_full_mailbox_refuses_one_more_and_writes_nothing(backend):
    fill(backend)
    before = backend.everything()

    with pytest.raises(MailboxFull, match=f"{MAX_MAILBOX_EVENTS} unread events"):
        backend.mailbox.post(sent("ev-one-more"))

    assert backend.everything() == before
    assert backend.mailbox.get("r1", "ev-one-more") is None
    # A sender's retry of an event it holds is still answered, and changes nothing.
    assert backend.mailbox.post(sent("ev-000")) == (sent("ev-000"), False)
    assert backend.everything() == before
    # Another run's mailbox is its own.
    assert backend.mailbox.post(sent("ev-one-more", run_id="r2"))[1]


def test_a_full_mailbox_takes_one_more_once_one_is_read(backend):
    head = parked(backend)
    fill(backend)

    settle(backend, head, "ev-000")
    assert backend.mailbox.post(sent("ev-100"))[1]
    with pytest.raises(MailboxFull):
        backend.mailbox.post(sent("ev-101"))
    backend.mailbox.refuse("r1", "ev-001", "no")
    assert backend.mailbox.post(sent("ev-101"))[1]

    assert sum(e.is_pending for e in backend.mailbox.of_run("r1")) == MAX_MAILBOX_EVENTS
    assert len(backend.mailbox.of_run("r1")) == MAX_MAILBOX_EVENTS + 2


def test_concurrent_senders_never_fill_a_mailbox_past_its_bound(backend: Backend) -> None:
    """Five places left, twenty senders with events of their own at once: five get in."""
    fill(backend)
    for n in range(5):
        backend.mailbox.refuse("r1", f"ev-{n:03d}", "no")
    start = threading.Barrier(RACERS)

    def post(n: int) -> bool:
        with backend.connect() as mailbox:
            start.wait(timeout=30)
            try:
                return mailbox.post(sent(f"racer-{n:02d}"))[1]
            except MailboxFull:
                return False

    with ThreadPoolExecutor(RACERS) as pool:
        created = list(pool.map(post, range(RACERS)))

    assert sum(created) == 5
    events = backend.mailbox.of_run("r1")
    assert sum(e.is_pending for e in events) == MAX_MAILBOX_EVENTS
    assert len(events) == MAX_MAILBOX_EVENTS + 5


FLOODS = {"sqlite": 10_000, "dynamodb": 500, "postgres": 500}
"""Made-up names sent to a run whose agent declares none, so its mailbox keeps any of them. On
DynamoDB each post past the bound counts the run's pending events with a Query (~10 ms a post
on moto: 10,000 took ten minutes), and 400 refused past the 100 kept take the same path."""


def test_a_flood_of_other_names_never_refuses_the_awaited_or_a_declared_name(
    backend, request: pytest.FixtureRequest
):
    """Names the run neither waits for nor declares fill the room they share; the event it
    waits for and one of a name it declares still get in, each to a room of its own, and the
    wait takes its event."""
    flood = FLOODS[request.node.callspec.params["backend"].removesuffix("-sealed")]
    head = parked(backend)
    reserved = {WAIT.name, "deploy-done"}
    kept, refusals = 0, set()
    for n in range(flood):
        try:
            backend.mailbox.post(sent(f"junk-{n}", name=f"junk-{n}"), reserved=reserved)
            kept += 1
        except MailboxFull as full:
            refusals.add(str(full))

    awaited = backend.mailbox.post(sent("ev-awaited"), reserved=reserved)
    declared = backend.mailbox.post(sent("ev-declared", name="deploy-done"), reserved=reserved)
    settle(backend, head, "ev-awaited")

    print(
        f"\n{flood:,} other names: {kept} kept, {flood - kept:,} refused; the awaited event "
        f"kept: {awaited[1]}, the declared one: {declared[1]}"
    )
    assert kept == MAX_MAILBOX_EVENTS
    assert refusals == {
        f"run 'r1' has {MAX_MAILBOX_EVENTS} unread events of names it neither declares nor "
        "waits for, the most its mailbox keeps of them; nothing was added"
    }
    assert (awaited[1], declared[1]) == (True, True)
    assert backend.mailbox.get("r1", "ev-awaited") == awaited[0].model_copy(
        update={"consumed_step": 1}
    )
    assert backend.mailbox.next_for("r1", "deploy-done") == declared[0]


def test_each_reserved_name_is_bounded_in_a_room_of_its_own(backend):
    reserved = {"ci-finished", "deploy-done"}
    for n in range(MAX_MAILBOX_EVENTS):
        backend.mailbox.post(sent(f"deploy-{n:03d}", name="deploy-done"), reserved=reserved)
    before = backend.everything()

    with pytest.raises(MailboxFull, match=f"{MAX_MAILBOX_EVENTS} unread 'deploy-done' events"):
        backend.mailbox.post(sent("deploy-one-more", name="deploy-done"), reserved=reserved)

    assert backend.everything() == before
    # Full of one reserved name, the mailbox takes another, and any name not reserved.
    assert backend.mailbox.post(sent("ci-1"), reserved=reserved)[1]
    assert backend.mailbox.post(sent("other-1", name="other"), reserved=reserved)[1]


def test_mailbox_items_leave_the_run_as_the_store_reads_it(backend):
    head = parked(backend)
    fill(backend, 30)

    assert backend.store.load_head("r1") == head
    assert len(backend.store.list_checkpoints("r1")) == 2
    assert [(r.run_id, r.version) for r in backend.store.list_runs()] == [("r1", head.version)]


# --- the commit that consumes an event ---------------------------------------------------------

WAIT = EventWait(name="ci-finished")


def parked(backend, run_id: str = "r1") -> RunState:
    """A run waiting at step 1 for a `ci-finished` event."""
    state, checkpoint = new_run(run_id)
    backend.store.create_run(state, checkpoint)
    step = StepCompleted(
        step=1,
        key=f"{run_id}/step-1",
        call=ToolCall(name="wait_for_ci", arguments={}),
        output=ToolOutput(step=1, tool="wait_for_ci", text="waiting for ci-finished"),
        wait=WAIT,
        attempt=1,
        duration_ms=1.0,
    )
    commit = commit_of(state, step, step=1)
    backend.store.commit(commit)
    assert commit.head.status is RunStatus.WAITING
    return commit.head


def settling(backend, head: RunState, event_id: str) -> Commit:
    """The commit that settles the wait with the event, consuming it: as the desk makes it."""
    event = backend.mailbox.get(head.run_id, event_id) or sent(event_id, run_id=head.run_id)
    commit = commit_of(head, event_arrived(WAIT, head.step, event), step=head.step)
    return dataclasses.replace(commit, consumes=Consumption(event_id=event_id, step=head.step))


def settle(backend, head: RunState, event_id: str) -> RunState:
    commit = settling(backend, head, event_id)
    backend.store.commit(commit)
    return commit.head


def test_a_commit_consumes_its_event_in_the_same_write(backend):
    head = parked(backend)
    backend.mailbox.post(sent("ev-1"))
    commit = settling(backend, head, "ev-1")

    backend.store.commit(commit)

    assert backend.store.load_head("r1") == commit.head
    assert commit.head.status is RunStatus.RUNNING
    consumed = backend.mailbox.get("r1", "ev-1")
    assert consumed is not None
    assert (consumed.consumed_step, consumed.refused, consumed.is_pending) == (1, None, False)
    assert consumed == sent("ev-1").model_copy(update={"consumed_step": 1})
    assert backend.mailbox.next_for("r1", "ci-finished") is None


def test_two_commits_consuming_one_event_from_one_head_take_it_once(backend):
    # Two senders (or a sender and a worker's sweep) read the same waiting head.
    head = parked(backend)
    backend.mailbox.post(sent("ev-1"))
    first, second = settling(backend, head, "ev-1"), settling(backend, head, "ev-1")
    backend.store.commit(first)
    before = backend.everything()

    with pytest.raises(StaleVersion):
        backend.store.commit(second)

    assert backend.everything() == before
    assert backend.store.load_head("r1") == first.head
    assert len(backend.store.list_checkpoints("r1")) == 3


def test_a_commit_consuming_a_consumed_event_writes_nothing_even_at_the_right_version(backend):
    head = parked(backend)
    backend.mailbox.post(sent("ev-1"))
    after = settle(backend, head, "ev-1")
    # The next step's commit, at the head's version, with its ledger completion: only the
    # event is wrong, and that alone must stop all of it.
    backend.ledger.begin(
        LedgerEntry(key="r1/step-2", run_id="r1", step=2, args_hash="h", decision={"tool": "x"})
    )
    again = dataclasses.replace(
        step_commit(after, 2), consumes=Consumption(event_id="ev-1", step=2)
    )
    assert again.expected_version == backend.store.load_head("r1").version
    before = backend.everything()

    with pytest.raises(StaleVersion):
        backend.store.commit(again)

    assert backend.everything() == before
    assert backend.store.load_head("r1") == after
    assert backend.ledger.get("r1/step-2").status is LedgerStatus.IN_PROGRESS
    assert backend.mailbox.get("r1", "ev-1").consumed_step == 1


@pytest.mark.parametrize("which", ["refused", "unknown", "of-another-run"])
def test_a_commit_consuming_an_event_that_is_not_pending_writes_nothing(backend, which):
    head = parked(backend)
    backend.mailbox.post(sent("ev-1"))
    if which == "refused":
        backend.mailbox.refuse("r1", "ev-1", "data: not an object")
    elif which == "of-another-run":
        backend.mailbox.post(sent("ev-2", run_id="r2"))
    event_id = {"refused": "ev-1", "unknown": "ev-unknown", "of-another-run": "ev-2"}[which]
    before = backend.everything()

    with pytest.raises(StaleVersion):
        backend.store.commit(settling(backend, head, event_id))

    assert backend.everything() == before
    assert backend.store.load_head("r1") == head


# --- DynamoDB: how long an event is kept -------------------------------------------------------


@pytest.mark.parametrize("backend", ["dynamodb"], indirect=True)
def test_dynamodb_keeps_a_pending_event_and_expires_a_read_one_with_its_record(backend):
    """DynamoDB removes items by the table's TTL: a pending event waits for its run (no TTL),
    a consumed one expires with the checkpoint that consumed it, a refused one a retention
    after its refusal."""
    head = parked(backend)
    for event_id in ("ev-1", "ev-2", "ev-3"):
        backend.mailbox.post(sent(event_id))
    commit = settling(backend, head, "ev-1")
    backend.store.commit(commit)
    refused_at = utcnow()
    backend.mailbox.refuse("r1", "ev-2", "no")

    (checkpoints, _, _) = backend.everything()
    expiry = {i["sk"]["S"]: i.get(TTL_ATTRIBUTE, {}).get("N") for i in checkpoints}
    retention = timedelta(days=DEFAULT_RETENTION_DAYS)
    assert expiry["MAIL#ev-3"] is None
    assert expiry["MAIL#ev-1"] == str(epoch_seconds(commit.checkpoint.created_at + retention))
    assert expiry["MAIL#ev-1"] == expiry[f"CP#{commit.checkpoint.version:012d}"]
    assert abs(int(expiry["MAIL#ev-2"]) - epoch_seconds(refused_at + retention)) <= 5


@pytest.mark.parametrize("backend", ["dynamodb"], indirect=True)
def test_a_dynamodb_post_that_read_a_stale_count_takes_the_next_free_place(backend, monkeypatch):
    """The race the bound rests on, made to happen: a post reads the counter, another post
    goes in, and only then does the first write. Its condition on the counter fails, it reads
    again, and it goes in at the next free place; no two events share a place."""
    mailbox = backend.mailbox
    for event_id in ("ev-1", "ev-2"):
        mailbox.post(sent(event_id))
    read = mailbox._accepted
    reads: list[int] = []

    def stale_first(run_id: str) -> int:
        count = int(read(run_id))
        reads.append(count)
        return count - 1 if len(reads) == 1 else count

    monkeypatch.setattr(mailbox, "_accepted", stale_first)
    assert mailbox.post(sent("ev-3"))[1]

    assert reads == [2, 2]
    items = [i for i in backend.everything()[0] if i["sk"]["S"].startswith("MAIL#")]
    assert sorted(int(i["seq"]["N"]) for i in items) == [1, 2, 3]
