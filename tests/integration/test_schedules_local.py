"""Schedules on a local store (and a sealed Postgres one), fired through the client's start path
on the test's clock: each fire time starts one run with the derived id; a fire repeated after a
crash between the start and the schedule's move starts no second run; a worker down for several
fire times makes up the latest once; a paused schedule's fires are skipped; a pause, resume or
removal that lands while a fire starts its run, or a removal and a new schedule of the name that
land while a pause or resume is under way, stays done."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ratchet.client import Client
from ratchet.runtime import runtime_for
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.schedules import Schedule, ScheduleBook, fire_due
from tests.postgres_support import Cluster, shared_keyring

LOG = logging.getLogger("ratchet.tests.schedules")
ADDED = datetime(2026, 12, 1, 10, 0, 30, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres-sealed"])
def settings(request, tmp_path, monkeypatch) -> Iterator[LocalSettings]:
    """A local store, or a Postgres one whose records a payload key seals (the schedules'
    inputs among them): the same schedules hold on both."""
    if request.param == "sqlite":
        yield LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db")
        return
    # What a Postgres store's processes keep on their host is in the working directory: the
    # test's.
    monkeypatch.chdir(tmp_path)
    postgres: Cluster = request.getfixturevalue("postgres")
    name = postgres.fresh_database(store=True)
    yield LocalSettings(store=postgres.url(name), payload_key=shared_keyring(tmp_path))
    postgres.drop_database(name)


@pytest.fixture
def client(settings, monkeypatch):
    monkeypatch.setattr("ratchet.client.utcnow", lambda: ADDED)
    client = Client(runtime_for(settings, create=True), worker_id="test", logger=LOG)
    yield client
    client.close()


@pytest.fixture
def other(settings, client):
    """Another process's client on the same store: its commands land while this one's are
    under way."""
    other = Client(runtime_for(settings, create=True), worker_id="other", logger=LOG)
    yield other
    other.close()


def _fire(client: Client, at: datetime) -> list[str]:
    def start(run_id, spec, _):
        client.start(run_id=run_id, agent=spec.agent, input=spec.input)

    return list(fire_due(_book(client), start, at, logger=LOG))


def _book(client: Client) -> ScheduleBook:
    runtime = client.runtime
    assert isinstance(runtime, LocalRuntime)
    return runtime.schedules


def _runs(client: Client) -> list[str]:
    return sorted(r.run_id for r in client.runs())


def test_each_fire_time_starts_one_run_named_after_it(client):
    client.schedule_add("hourly", agent="migration", cron="0 * * * *", input={"batches": 2})

    assert _fire(client, ADDED + timedelta(minutes=10)) == []  # not due before 11:00
    assert _fire(client, datetime(2026, 12, 1, 11, 0, 5, tzinfo=UTC)) == ["hourly-20261201T110000Z"]
    assert _fire(client, datetime(2026, 12, 1, 11, 30, tzinfo=UTC)) == []
    assert _fire(client, datetime(2026, 12, 1, 12, 0, tzinfo=UTC)) == ["hourly-20261201T120000Z"]
    assert _runs(client) == ["hourly-20261201T110000Z", "hourly-20261201T120000Z"]
    assert client.head("hourly-20261201T110000Z").options.params["batches"] == 2
    (kept,) = client.schedules()
    assert kept.last_run == "hourly-20261201T120000Z"
    assert kept.next_fire == datetime(2026, 12, 1, 13, 0, tzinfo=UTC)


def test_a_fire_repeated_after_a_crash_before_the_schedule_moved_starts_no_second_run(
    client, monkeypatch
):
    client.schedule_add("hourly", agent="migration", cron="0 * * * *")
    book_type = type(_book(client))
    real_move_on = book_type.move_on

    def crash(self, fired, *, next_fire, last_run):
        raise KeyboardInterrupt  # the worker dies after the run was started

    monkeypatch.setattr(book_type, "move_on", crash)
    with pytest.raises(KeyboardInterrupt):
        _fire(client, datetime(2026, 12, 1, 11, 0, 5, tzinfo=UTC))
    monkeypatch.setattr(book_type, "move_on", real_move_on)

    assert _fire(client, datetime(2026, 12, 1, 11, 0, 9, tzinfo=UTC)) == ["hourly-20261201T110000Z"]
    assert _runs(client) == ["hourly-20261201T110000Z"]


def test_fires_missed_while_no_worker_ran_are_made_up_once_for_the_latest(client):
    client.schedule_add("every-15", agent="migration", every="15m")

    started = _fire(client, ADDED + timedelta(hours=2, minutes=1))

    assert started == ["every-15-20261201T120030Z"]  # 8 missed, one run
    assert _fire(client, ADDED + timedelta(hours=2, minutes=2)) == []


def test_a_paused_schedule_skips_its_fires_and_resumed_fires_from_then_on(client, monkeypatch):
    client.schedule_add("hourly", agent="migration", cron="0 * * * *")
    client.schedule_pause("hourly")
    assert _fire(client, datetime(2026, 12, 1, 13, 0, tzinfo=UTC)) == []

    later = datetime(2026, 12, 1, 13, 20, tzinfo=UTC)
    monkeypatch.setattr("ratchet.client.utcnow", lambda: later)
    resumed = client.schedule_pause("hourly", pause=False)

    assert resumed.next_fire == datetime(2026, 12, 1, 14, 0, tzinfo=UTC)  # 11-13 skipped
    assert _fire(client, datetime(2026, 12, 1, 14, 0, tzinfo=UTC)) == ["hourly-20261201T140000Z"]
    assert _runs(client) == ["hourly-20261201T140000Z"]


def test_a_pause_resume_or_removal_landing_while_a_fire_starts_its_run_stays_done(
    client, other, monkeypatch
):
    # Given four schedules due at 11:00.
    for name in ("paused", "removed", "replaced", "resumed"):
        client.schedule_add(name, agent="migration", cron="0 * * * *")
    fired_at = datetime(2026, 12, 1, 11, 0, 5, tzinfo=UTC)
    monkeypatch.setattr("ratchet.client.utcnow", lambda: fired_at)
    answered: dict[str, Schedule] = {}

    def land(name: str) -> None:
        if name == "paused":
            answered[name] = other.schedule_pause(name)
        elif name == "resumed":
            other.schedule_pause(name)
            answered[name] = other.schedule_pause(name, pause=False)
        else:
            other.schedule_remove(name)
            if name == "replaced":
                answered[name] = other.schedule_add(name, agent="migration", cron="30 * * * *")

    def start(run_id, spec, _):
        # The fire has read the schedule and not yet written it back: each command lands here.
        land(spec.name)
        client.start(run_id=run_id, agent=spec.agent, input=spec.input)

    # When the fire runs with each command landing inside it (another process's client).
    started = fire_due(_book(client), start, fired_at, logger=LOG)

    # Then each command's answer is what is kept, and the schedules fire only as it says.
    assert answered["paused"].paused
    assert not answered["resumed"].paused
    kept = {s.name: s for s in client.schedules()}
    assert sorted(kept) == ["paused", "replaced", "resumed"]  # removed stays removed
    assert kept["paused"].paused
    assert kept["paused"].last_run == "paused-20261201T110000Z"  # the fire under way, recorded
    assert kept["resumed"] == answered["resumed"]
    assert kept["replaced"] == answered["replaced"]  # the fire's move is not the new one's
    assert started == ["paused-20261201T110000Z"]
    half_hours = [fired_at + timedelta(minutes=30 * n) for n in range(1, 5)]
    assert [_fire(client, at) for at in half_hours] == [
        ["replaced-20261201T113000Z"],
        ["resumed-20261201T120000Z"],
        ["replaced-20261201T123000Z"],
        ["resumed-20261201T130000Z"],
    ]
    assert client.schedules()[0].paused  # "paused" sorts first
    assert [r for r in _runs(client) if r.endswith("T110000Z")] == [
        "paused-20261201T110000Z",
        "removed-20261201T110000Z",
        "replaced-20261201T110000Z",
        "resumed-20261201T110000Z",
    ]


@pytest.mark.parametrize("pause", [True, False], ids=["pause", "resume"])
def test_a_schedule_removed_and_added_again_while_a_pause_or_resume_is_under_way_stays_added(
    client, other, monkeypatch, pause
):
    # Given a schedule of one batch a run, paused for the resume.
    client.schedule_add("hourly", agent="migration", cron="0 * * * *", input={"batches": 1})
    if not pause:
        client.schedule_pause("hourly")
    book_type = type(_book(client))
    real_get = book_type.get
    landed: list[Schedule] = []

    def get_then_land(self, name):
        # The pause (or resume) has read the schedule and not yet written it: another process
        # removes it and adds one of the same name and rule, of two batches a run.
        read = real_get(self, name)
        if not landed:
            other.schedule_remove(name)
            landed.append(
                other.schedule_add(name, agent="migration", cron="0 * * * *", input={"batches": 2})
            )
        return read

    monkeypatch.setattr(book_type, "get", get_then_land)

    # When the pause (or resume) goes on to its write.
    answered = client.schedule_pause("hourly", pause=pause)

    # Then the schedule kept is the one added again, paused (or resumed) as answered.
    (kept,) = client.schedules()
    assert kept == answered
    assert kept.spec == landed[0].spec
    assert kept.paused is pause
    assert _fire(client, datetime(2026, 12, 1, 11, 0, 5, tzinfo=UTC)) == (
        [] if pause else ["hourly-20261201T110000Z"]
    )


def test_a_schedule_that_cannot_start_is_refused_and_nothing_is_written(client):
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"agent": "no.such.module:agent", "cron": "0 * * * *"}, "field agent"),
        ({"agent": "migration", "cron": "0 * * * *", "input": {"tables": 3}}, "tables"),
        ({"agent": "migration", "every": "59s"}, "under a minute"),
    ]
    for fields, said in refusals:
        with pytest.raises(Exception, match=said):
            client.schedule_add("nightly", **fields)
    assert client.schedules() == []
