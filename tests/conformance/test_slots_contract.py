"""The contract of `ratchet.ports.Slots`, the bound on a deployed agent's concurrent steps:
DynamoDB (on moto), its one backend (a local worker's lease is its run's slot instead)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from ratchet.adapters.dynamodb.slots import DynamoDbSlots
from tests.dynamodb_support import SETTINGS, serialized_moto_tables

AGENT = "tests.bounded_agent:agent"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def slots(clock: Clock) -> Iterator[DynamoDbSlots]:
    with serialized_moto_tables() as client:
        yield DynamoDbSlots(client, SETTINGS.checkpoints_table, clock=clock)


def test_a_name_has_at_most_its_limit_of_holders(slots):
    assert [slots.take(AGENT, 3, f"run-{n}", 60) for n in range(5)] == [True] * 3 + [False] * 2
    assert sorted(slots.holders(AGENT)) == ["run-0", "run-1", "run-2"]
    assert slots.take("another agent", 3, "run-3", 60)  # each name has slots of its own


def test_a_holder_taking_again_keeps_its_one_slot_and_renews_it(slots, clock):
    assert slots.take(AGENT, 2, "run-a", 60)
    clock.now += 50
    assert slots.take(AGENT, 2, "run-a", 60)  # a retried step of the same run
    assert slots.take(AGENT, 2, "run-b", 60)
    clock.now += 30  # past the first take's time, within the renewal's
    assert not slots.take(AGENT, 2, "run-c", 60)
    assert slots.holders(AGENT) == {"run-a": clock.now + 30, "run-b": clock.now + 30}


def test_a_released_slot_is_free_and_a_release_never_frees_anothers(slots):
    assert slots.take(AGENT, 1, "run-a", 60)
    slots.release(AGENT, "run-b")
    assert not slots.take(AGENT, 1, "run-b", 60)
    slots.release(AGENT, "run-a")
    assert slots.take(AGENT, 1, "run-b", 60)
    slots.release(AGENT, "run-a")  # no longer held by run-a: nothing happens
    assert list(slots.holders(AGENT)) == ["run-b"]


def test_a_dead_holders_slot_lapses_at_its_time_and_not_before(slots, clock):
    assert slots.take(AGENT, 1, "dead", 60)
    clock.now += 59.9
    assert not slots.take(AGENT, 1, "next", 60)
    clock.now += 0.1
    assert slots.take(AGENT, 1, "next", 60)
    slots.release(AGENT, "dead")  # its late release leaves the new holder's slot alone
    assert list(slots.holders(AGENT)) == ["next"]


def test_a_taker_that_read_the_slots_before_another_took_the_last_is_refused(slots, monkeypatch):
    stale = slots._held(AGENT)  # what a second taker read: every slot free
    assert slots.take(AGENT, 1, "first", 60)
    monkeypatch.setattr(slots, "_held", lambda name: stale)

    assert not slots.take(AGENT, 1, "second", 60)  # its write's condition turns it away
    monkeypatch.undo()
    assert list(slots.holders(AGENT)) == ["first"]


def test_racing_takers_never_share_a_slot(slots):
    barrier = threading.Barrier(12)
    taken: list[str] = []

    def take(holder: str) -> None:
        barrier.wait()
        if slots.take(AGENT, 3, holder, 60):
            taken.append(holder)

    threads = [threading.Thread(target=take, args=(f"run-{n}",)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(taken) == 3
    assert sorted(slots.holders(AGENT)) == sorted(taken)
