"""A schedule's rule in EventBridge Scheduler's words: five-field cron as `cron(...)`, an
interval as `rate(...)`. Pure functions, no CDK: the stack and the unit tests call them.

Scheduler's cron has six fields, `minute hour day-of-month month day-of-week year`, and differs
from crontab(5) where it matters:

- exactly one of day-of-month and day-of-week is `?` (no value). crontab fires on either when
  both are restricted (`0 0 1 * 1`: the 1st and every Monday); Scheduler cannot say that, so
  such an expression is refused rather than deployed to fire on different days;
- day-of-week counts 1-7 from Sunday, where crontab counts 0-6 (7 is Sunday too). The days are
  written as names (`MON-FRI`), which both read alike;
- a step counts from a value (`0/15`), not from `*`.

Each field is read with croniter, the parser the local workers use, so an expression means the
same days and times on both runtimes; it is written back as the values it matches (a step that
runs to the end of the field as `first/step`, else ranges and lists).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

from croniter import croniter

_ANY = "*"
_DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12))
_DAY_OF_MONTH, _DAY_OF_WEEK = 2, 4
MAX_EXPRESSION_CHARS = 256
"""The longest `ScheduleExpression` Scheduler takes."""


class NotExpressible(ValueError):
    """The rule has no EventBridge Scheduler form; the message says why, in one line."""


def eventbridge_cron(cron: str) -> str:
    """`0 9 * * 1-5` as `cron(0 9 ? * MON-FRI *)`; `NotExpressible` if Scheduler cannot fire
    on the times crontab would."""
    try:
        expanded, nth_weekdays = croniter.expand(cron)
    except (ValueError, KeyError) as error:
        raise NotExpressible(f"{cron!r} is not a five-field cron expression: {error}") from None
    if nth_weekdays:
        raise NotExpressible(
            f"{cron!r}: '#' or 'L' (the nth or last weekday) is not converted; give the days"
        )
    # The first four fields; day-of-week is written as names below.
    fields = [
        _field(values, *bounds, cron) for values, bounds in zip(expanded[:4], _FIELDS, strict=True)
    ]
    day_of_month, day_of_week = expanded[_DAY_OF_MONTH], expanded[_DAY_OF_WEEK]
    if day_of_month != [_ANY] and day_of_week != [_ANY]:
        raise NotExpressible(
            f"{cron!r} restricts both day-of-month and day-of-week, which crontab reads as "
            "either and EventBridge Scheduler cannot express: make one of them '*'"
        )
    if day_of_week == [_ANY]:
        weekdays = "?"
    else:
        fields[_DAY_OF_MONTH] = "?"
        weekdays = _weekdays(day_of_week, cron)
    minute, hour, month_day, month = fields
    expression = f"cron({minute} {hour} {month_day} {month} {weekdays} *)"
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise NotExpressible(
            f"{cron!r} lists more values than EventBridge Scheduler's {MAX_EXPRESSION_CHARS} "
            "characters hold: use ranges or steps that run to the end of the field"
        )
    return expression


def eventbridge_rate(seconds: int) -> str:
    """An interval as `rate(15 minutes)`, `rate(1 hour)`, `rate(2 days)`; `NotExpressible` if
    it is not a whole number of minutes (Scheduler's smallest unit)."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"rate({count} {unit}{'' if count == 1 else 's'})"
    raise NotExpressible(
        f"{seconds} seconds is not a whole number of minutes, the unit of EventBridge "
        "Scheduler's rate()"
    )


def _field(values: list[int | str], name: str, low: int, high: int, cron: str) -> str:
    if values == [_ANY]:
        return _ANY
    if not all(isinstance(v, int) for v in values):
        raise NotExpressible(f"{cron!r}: 'L' in {name} is not converted; give the days")
    numbers = sorted(int(v) for v in values)
    if numbers == list(range(low, high + 1)):
        return _ANY
    steps = {b - a for a, b in pairwise(numbers)}
    if len(numbers) >= 3 and len(steps) == 1 and steps != {1} and numbers[-1] + max(steps) > high:
        return f"{numbers[0]}/{steps.pop()}"
    return ",".join(_ranges(numbers, str))


def _weekdays(values: list[int | str], cron: str) -> str:
    if not all(isinstance(v, int) for v in values):
        raise NotExpressible(f"{cron!r}: 'L' in day-of-week is not converted; give the days")
    days = sorted({int(v) % 7 for v in values})  # crontab's 7 is Sunday, as 0 is
    return ",".join(_ranges(days, lambda day: _DAY_NAMES[day]))


def _ranges(numbers: list[int], spell: Callable[[int], str]) -> list[str]:
    """Runs of consecutive numbers as `a-b`, the rest one by one."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return [spell(run[0]) if len(run) == 1 else f"{spell(run[0])}-{spell(run[-1])}" for run in runs]
