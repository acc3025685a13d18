"""Schedules on a local store, fired through the client's start path on the test's clock: each
fire time starts one run with the derived id; a fire repeated after a crash between the start
and the schedule's move starts no second run; a worker down for several fire times makes up
the latest once; a paused schedule's fires are skipped."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ratchet.adapters.sqlite.schedules import SqliteScheduleBook
from ratchet.client import Client
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.schedules import fire_due

LOG = logging.getLogger("ratchet.tests.schedules")
ADDED = datetime(2026, 12, 1, 10, 0, 30, tzinfo=UTC)


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.setattr("ratchet.client.utcnow", lambda: ADDED)
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db"))
    client = Client(runtime, worker_id="test", logger=LOG)
    yield client
    client.close()


def _fire(client: Client, at: datetime) -> list[str]:
    def start(run_id, spec, _):
        client.start(run_id=run_id, agent=spec.agent, input=spec.input)

    return list(fire_due(_book(client), start, at, logger=LOG))


def _book(client: Client) -> SqliteScheduleBook:
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
    real_replace = book_type.replace

    def crash(self, schedule, *, expected_next):
        raise KeyboardInterrupt  # the worker dies after the run was started

    monkeypatch.setattr(book_type, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        _fire(client, datetime(2026, 12, 1, 11, 0, 5, tzinfo=UTC))
    monkeypatch.setattr(book_type, "replace", real_replace)

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
