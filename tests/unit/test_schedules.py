"""Schedules' next fire times against a table, daylight saving changes in non-UTC zones
included; the run id a fire derives; and the input `schedule add` refuses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from ratchet.errors import InvalidInput
from ratchet.schedules import (
    ScheduleSpec,
    fire_run_id,
    latest_due,
    new_schedule,
    next_fire,
    parse_every,
)

ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


# (expression, zone, after, next fire): times in UTC unless they say otherwise.
TABLE = [
    ("*/15 * * * *", "UTC", "2026-12-01T10:07:00+00:00", "2026-12-01T10:15:00+00:00"),
    ("*/15 * * * *", "UTC", "2026-12-01T10:15:00+00:00", "2026-12-01T10:30:00+00:00"),
    # Weekdays at 09:00 in Berlin: from a Friday to the Monday, in CET (+01:00).
    ("0 9 * * 1-5", "Europe/Berlin", "2026-12-04T09:00:00+01:00", "2026-12-07T09:00:00+01:00"),
    # Clocks go forward at 02:00 on 29 March 2026: 02:30 does not exist, and fires at the
    # offset before the change (01:30 UTC, 03:30 CEST); the next day at 02:30 CEST.
    ("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00+00:00", "2026-03-29T01:30:00+00:00"),
    ("30 2 * * *", "Europe/Berlin", "2026-03-29T01:30:00+00:00", "2026-03-30T02:30:00+02:00"),
    # Clocks go back at 03:00 on 25 October 2026: 02:30 happens twice and fires once, at
    # the first (CEST); the next fire is the next day's.
    ("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00+00:00", "2026-10-25T02:30:00+02:00"),
    ("30 2 * * *", "Europe/Berlin", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"),
    ("0 * * * *", "Europe/Berlin", "2026-10-25T02:30:00+02:00", "2026-10-25T03:00:00+01:00"),
    # New York springs forward at 02:00 on 8 March 2026: 02:00 fires at 03:00 EDT.
    ("0 2 * * *", "America/New_York", "2026-03-07T12:00:00+00:00", "2026-03-08T07:00:00+00:00"),
    ("0 2 * * *", "America/New_York", "2026-03-08T07:00:00+00:00", "2026-03-09T02:00:00-04:00"),
    ("0 0 29 2 *", "UTC", "2026-03-01T00:00:00+00:00", "2028-02-29T00:00:00+00:00"),
    ("0 12 1 * *", "Asia/Kolkata", "2026-12-01T06:30:00+00:00", "2027-01-01T12:00:00+05:30"),
]


@pytest.mark.parametrize(("cron", "zone", "after", "expected"), TABLE)
def test_a_cron_schedule_fires_next_at_the_time_the_table_says(cron, zone, after, expected):
    spec = ScheduleSpec(name="s", agent="migration", cron=cron, timezone=zone)
    assert next_fire(spec, ANCHOR, after=at(after)) == at(expected)


def test_an_interval_counts_from_when_the_schedule_was_added():
    spec = ScheduleSpec(name="s", agent="migration", every_seconds=parse_every("15m"))
    anchor = at("2026-12-01T10:00:20+00:00")
    assert next_fire(spec, anchor, after=anchor) == at("2026-12-01T10:15:20+00:00")
    assert next_fire(spec, anchor, after=at("2026-12-01T10:31:00+00:00")) == at(
        "2026-12-01T10:45:20+00:00"
    )


def test_a_worker_that_was_down_makes_up_the_latest_missed_fire_once():
    spec = ScheduleSpec(name="nightly", agent="migration", cron="0 2 * * *")
    schedule = new_schedule(spec, at("2026-12-01T12:00:00+00:00"))
    assert schedule.next_fire == at("2026-12-02T02:00:00+00:00")
    assert latest_due(schedule, at("2026-12-02T01:59:59+00:00")) is None
    # Down for three nights: the latest missed fire, once.
    assert latest_due(schedule, at("2026-12-04T09:00:00+00:00")) == at("2026-12-04T02:00:00+00:00")


def test_a_fire_time_gives_one_run_id():
    moment = at("2026-12-02T02:00:00+01:00")
    assert fire_run_id("nightly", moment) == "nightly-20261202T010000Z"
    assert fire_run_id("nightly", moment) == fire_run_id("nightly", moment.astimezone(UTC))


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"cron": "61 * * * *"}, "is not a five-field cron expression"),
        ({"cron": "* * * *"}, "is not a five-field cron expression"),
        ({"cron": "* * * * * *"}, "is not a five-field cron expression"),
        ({"cron": "0 9 * * 1-5", "timezone": "Mars/Olympus"}, "is not a time zone"),
        ({}, "give either cron or every"),
        ({"cron": "* * * * *", "every_seconds": 60}, "give either cron or every"),
        ({"every_seconds": 30}, "greater than or equal to 60"),
        ({"cron": "* * * * *", "name": "Bad Name"}, "String should match pattern"),
    ],
)
def test_a_schedule_that_cannot_fire_is_refused_naming_why(fields, said):
    with pytest.raises(ValidationError, match=said):
        ScheduleSpec.model_validate({"name": "s", "agent": "migration", **fields})


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("30s", "every: 30s is under a minute"),
        ("59s", "every: 59s is under a minute"),
        ("367d", "over 366 days"),
        ("fortnightly", "is not an interval"),
        ("0m", "is not an interval"),
    ],
)
def test_an_interval_under_a_minute_or_unreadable_is_refused(text, said):
    with pytest.raises(InvalidInput, match=said):
        parse_every(text)
    assert parse_every("90s") == 90
    assert parse_every("1d") == 86400


def _stepped(schedule, now):
    """The latest due fire found the long way: every fire from the next one on."""
    due = schedule.next_fire
    while (later := next_fire(schedule.spec, schedule.anchor, after=due)) <= now:
        due = later
    return due


@pytest.mark.parametrize(
    ("cron", "zone", "start", "end"),
    [
        ("*/30 * * * *", "Europe/Berlin", "2026-03-28T22:00:00+00:00", "2026-03-29T04:00:00+00:00"),
        ("*/30 * * * *", "Europe/Berlin", "2026-10-24T22:00:00+00:00", "2026-10-25T04:00:00+00:00"),
        ("30 2 * * *", "Europe/Berlin", "2026-03-27T00:00:00+00:00", "2026-03-31T00:00:00+00:00"),
        ("0 2 * * *", "America/New_York", "2026-03-07T00:00:00+00:00", "2026-03-10T00:00:00+00:00"),
        ("0 9 * * 1-5", "UTC", "2026-12-03T00:00:00+00:00", "2026-12-08T00:00:00+00:00"),
    ],
)
def test_the_latest_due_fire_is_the_one_stepping_through_every_fire_finds(cron, zone, start, end):
    spec = ScheduleSpec(name="s", agent="migration", cron=cron, timezone=zone)
    schedule = new_schedule(spec, at(start))
    now = schedule.next_fire
    while now < at(end):
        assert latest_due(schedule, now) == _stepped(schedule, now), now
        assert latest_due(schedule, now + timedelta(minutes=7)) == _stepped(
            schedule, now + timedelta(minutes=7)
        )
        now += timedelta(minutes=10)


def test_a_year_of_missed_fires_is_made_up_once_without_stepping_through_them():
    spec = ScheduleSpec(name="s", agent="migration", cron="* * * * *")
    schedule = new_schedule(spec, at("2025-12-01T00:00:30+00:00"))
    assert latest_due(schedule, at("2026-12-01T10:07:45+00:00")) == at("2026-12-01T10:07:00+00:00")
    every = ScheduleSpec(name="e", agent="migration", every_seconds=60)
    interval = new_schedule(every, at("2025-12-01T00:00:30+00:00"))
    assert latest_due(interval, at("2026-12-01T10:07:45+00:00")) == at("2026-12-01T10:07:30+00:00")
