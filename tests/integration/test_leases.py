"""Leases and live worker ids on a real SQLite store, with a clock the tests move by hand."""

from __future__ import annotations

import math

import pytest

from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.adapters.sqlite.leases import SqliteLeases, WorkerIdInUse
from ratchet.errors import InvalidInput
from ratchet.ports import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS, check_lease_seconds
from tests.support import Harness, StubModel


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path):
    harness = Harness(tmp_path, StubModel(total=3))
    harness.start("run")
    return harness


def _leases(store: Harness, clock: FakeClock) -> SqliteLeases:
    """SqliteLeases on a connection of their own: another worker's view of the same file."""
    return SqliteLeases(SqliteDatabase(store.root / "ratchet.db"), clock=clock)


def test_a_renewed_lease_keeps_another_worker_out_past_its_first_expiry(store, clock):
    mine, theirs = _leases(store, clock), _leases(store, clock)
    assert mine.claim("a", 10) == "run"

    clock.advance(8)
    assert mine.renew("run", "a", 10)
    clock.advance(7)  # 15 s after the claim: past the first expiry, inside the renewed one

    assert theirs.claim("b", 10) is None
    assert theirs.holder("run") == ("a", clock.now + 3)


def test_a_lapsed_lease_goes_to_another_worker_and_the_first_can_no_longer_renew_it(store, clock):
    mine, theirs = _leases(store, clock), _leases(store, clock)
    mine.claim("a", 10)

    clock.advance(11)
    assert theirs.claim("b", 10) == "run"

    assert mine.renew("run", "a", 10) is False
    assert theirs.holder("run") == ("b", clock.now + 10)


def test_releasing_a_lapsed_lease_leaves_the_new_holders_lease_alone(store, clock):
    mine, theirs = _leases(store, clock), _leases(store, clock)
    mine.claim("a", 10)
    clock.advance(11)
    theirs.claim("b", 10)

    mine.release("run", "a")

    assert theirs.holder("run") == ("b", clock.now + 10)
    assert mine.claim("a", 10) is None


def test_a_worker_releases_its_own_lease(store, clock):
    mine, theirs = _leases(store, clock), _leases(store, clock)
    mine.claim("a", 10)

    mine.release("run", "a")

    assert mine.holder("run") is None
    assert theirs.claim("b", 10) == "run"


def test_runs_to_skip_are_neither_claimed_nor_counted_as_running(store, clock):
    store.start("other")
    leases = _leases(store, clock)

    assert leases.running_runs(skip={"run"}) == 1
    assert leases.claim("a", 10, skip={"run"}) == "other"
    assert leases.claim("b", 10, skip={"run"}) is None
    assert leases.running_runs(skip={"run", "other"}) == 0
    assert leases.running_runs() == 2


@pytest.mark.parametrize(
    "seconds",
    [math.inf, -math.inf, math.nan, float("1e309"), 0, -1, 0.05, MAX_LEASE_SECONDS + 1],
)
def test_a_lease_length_no_worker_can_honour_is_refused_before_any_write(store, clock, seconds):
    leases = _leases(store, clock)

    with pytest.raises(InvalidInput, match=r"lease seconds must be a number from 0\.1 to 3600"):
        check_lease_seconds(seconds)
    for attempt in (
        lambda: leases.claim("a", seconds),
        lambda: leases.renew("run", "a", seconds),
        lambda: leases.register_worker("a", "token", seconds),
    ):
        with pytest.raises(InvalidInput):
            attempt()

    assert leases.holder("run") is None


@pytest.mark.parametrize("seconds", [MIN_LEASE_SECONDS, 30, MAX_LEASE_SECONDS])
def test_lease_lengths_in_range_are_taken(store, clock, seconds):
    assert _leases(store, clock).claim("a", seconds) == "run"


def test_a_live_worker_id_cannot_be_registered_twice(store, clock):
    first, second = _leases(store, clock), _leases(store, clock)
    first.register_worker("w", "first", 10, host="box", pid=41)

    clock.advance(9)
    with pytest.raises(WorkerIdInUse) as refused:
        second.register_worker("w", "second", 10, host="box", pid=42)

    assert isinstance(refused.value, InvalidInput)
    assert str(refused.value) == (
        "worker id 'w' is in use by a live worker (pid 41 on box); pick another worker id, "
        "or wait 1 s for its heartbeat to lapse if that worker is gone"
    )


def test_a_dead_workers_id_can_be_taken_once_its_registration_lapses(store, clock):
    dead, new = _leases(store, clock), _leases(store, clock)
    dead.register_worker("w", "dead", 10)

    clock.advance(10)
    new.register_worker("w", "new", 10)

    assert new.beat("w", "new", 10, None).registered
    assert not dead.beat("w", "dead", 10, None).registered, "the old holder learns it lost it"


def test_a_heartbeat_keeps_the_registration_and_the_lease_alive(store, clock):
    mine, theirs = _leases(store, clock), _leases(store, clock)
    mine.register_worker("w", "mine", 10)
    mine.claim("w", 10)

    for _ in range(5):  # 40 s in all, four leases long
        clock.advance(8)
        assert mine.beat("w", "mine", 10, "run").holds_lease

    assert theirs.claim("other", 10) is None
    with pytest.raises(WorkerIdInUse):
        theirs.register_worker("w", "theirs", 10)


def test_a_heartbeat_tells_the_worker_when_its_lease_went_to_another(store, clock):
    mine, theirs = _leases(store, clock), _leases(store, clock)
    mine.register_worker("a", "mine", 10)
    mine.claim("a", 10)
    clock.advance(11)
    theirs.claim("b", 10)

    beat = mine.beat("a", "mine", 10, "run")

    assert (beat.registered, beat.holds_lease) == (True, False)
    assert theirs.holder("run") == ("b", clock.now + 10)


def test_a_worker_unregisters_only_its_own_registration(store, clock):
    dead, new = _leases(store, clock), _leases(store, clock)
    dead.register_worker("w", "dead", 10)
    clock.advance(11)
    new.register_worker("w", "new", 10)

    dead.unregister_worker("w", "dead")
    with pytest.raises(WorkerIdInUse):
        dead.register_worker("w", "dead", 10)

    new.unregister_worker("w", "new")
    dead.register_worker("w", "dead", 10)


def test_a_store_made_before_live_workers_were_registered_gets_their_table(store, clock):
    store.db.connection.execute("DROP TABLE IF EXISTS workers")

    leases = _leases(store, clock)
    leases.register_worker("w", "token", 10)

    assert leases.beat("w", "token", 10, None).registered
