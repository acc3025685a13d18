"""Five-field cron and intervals in EventBridge Scheduler's words
(`ratchet/cdk/schedule_expressions.py`): a table of conversions, day-of-week numbering and the
`?` rule included, and the expressions Scheduler cannot say, refused."""

from __future__ import annotations

import pytest

from ratchet.cdk import schedule_expressions
from ratchet.cdk.schedule_expressions import NotExpressible, eventbridge_cron, eventbridge_rate

# (five-field cron, as crontab(5) and the local workers read it; EventBridge Scheduler's form)
CRON_TABLE = [
    ("0 2 * * *", "cron(0 2 * * ? *)"),
    ("*/15 * * * *", "cron(0/15 * * * ? *)"),
    ("5/20 * * * *", "cron(5/20 * * * ? *)"),
    ("5-40/10 * * * *", "cron(5,15,25,35 * * * ? *)"),
    ("0 */6 * * *", "cron(0 0/6 * * ? *)"),
    ("*/30 * * * *", "cron(0,30 * * * ? *)"),
    ("0,30 9-17 * * *", "cron(0,30 9-17 * * ? *)"),
    ("0 0 1 * *", "cron(0 0 1 * ? *)"),
    ("0 0 1,15 * *", "cron(0 0 1,15 * ? *)"),
    ("0 0 1-7,15 * *", "cron(0 0 1-7,15 * ? *)"),
    ("0 12 1 */3 *", "cron(0 12 1 1/3 ? *)"),
    ("0 0 * jan,feb *", "cron(0 0 * 1-2 ? *)"),
    # Day-of-week: crontab counts 0-6 from Sunday (and 7 is Sunday too); Scheduler 1-7 from
    # Sunday, so the days go by name, and day-of-month becomes `?`.
    ("0 9 * * 1-5", "cron(0 9 ? * MON-FRI *)"),
    ("0 9 * * mon-fri", "cron(0 9 ? * MON-FRI *)"),
    ("0 0 * * 0", "cron(0 0 ? * SUN *)"),
    ("0 0 * * 7", "cron(0 0 ? * SUN *)"),
    ("0 0 * * 6", "cron(0 0 ? * SAT *)"),
    ("0 0 * * 6,0", "cron(0 0 ? * SUN,SAT *)"),
    ("0 2 * * 5-7", "cron(0 2 ? * SUN,FRI-SAT *)"),
    ("0 0 * * 1,3,5", "cron(0 0 ? * MON,WED,FRI *)"),
    ("0 0 * * */2", "cron(0 0 ? * SUN,TUE,THU,SAT *)"),
    ("0 0 * * *", "cron(0 0 * * ? *)"),
]


@pytest.mark.parametrize(("cron", "expected"), CRON_TABLE)
def test_a_cron_expression_becomes_the_schedulers_form_the_table_says(cron, expected):
    assert eventbridge_cron(cron) == expected


@pytest.mark.parametrize(
    ("cron", "said"),
    [
        # crontab fires on the 1st and on every Monday; Scheduler takes one of the two.
        ("0 0 1 * 1", "restricts both day-of-month and day-of-week"),
        ("0 0 1-31 * 1", "restricts both day-of-month and day-of-week"),
        # Written out, every weekday still restricts: croniter (as crontab) fires every day.
        ("0 0 1 * 0-6", "restricts both day-of-month and day-of-week"),
        ("0 0 L * *", "'L' in day-of-month is not converted"),
        ("0 0 * * 5#3", "'#' or 'L' (the nth or last weekday) is not converted"),
        ("61 * * * *", "is not a five-field cron expression"),
    ],
)
def test_a_cron_expression_scheduler_cannot_say_is_refused_in_one_line(cron, said):
    with pytest.raises(NotExpressible) as refused:
        eventbridge_cron(cron)

    assert said in str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_expression_longer_than_scheduler_takes_is_refused(monkeypatch: pytest.MonkeyPatch):
    # Runs of two in every field write 238 characters, near the bound; it stands so that
    # Scheduler never refuses one at deploy time, after the synth passed.
    long = "0-58/3,1-58/3 0-22/3,1-22/3 1-31/3,2-31/3 1-12/3,2-12/3 *"
    assert len(eventbridge_cron(long)) == 238
    monkeypatch.setattr(schedule_expressions, "MAX_EXPRESSION_CHARS", 237)

    with pytest.raises(NotExpressible, match="lists more values than EventBridge Scheduler's"):
        eventbridge_cron(long)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (60, "rate(1 minute)"),
        (15 * 60, "rate(15 minutes)"),
        (90 * 60, "rate(90 minutes)"),
        (3600, "rate(1 hour)"),
        (2 * 3600, "rate(2 hours)"),
        (86400, "rate(1 day)"),
        (7 * 86400, "rate(7 days)"),
    ],
)
def test_an_interval_becomes_a_rate_in_its_largest_whole_unit(seconds, expected):
    assert eventbridge_rate(seconds) == expected


def test_an_interval_of_seconds_that_are_not_whole_minutes_is_refused():
    with pytest.raises(NotExpressible, match="90 seconds is not a whole number of minutes"):
        eventbridge_rate(90)
