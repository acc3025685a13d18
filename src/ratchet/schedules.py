"""Schedules: start a run of an agent on a cron expression or at a fixed interval.

One expression syntax everywhere: five-field cron (`minute hour day-of-month month
day-of-week`, as `crontab(5)` reads it: `*/15 * * * *`, `0 9 * * 1-5`), matched against the
wall clock of the schedule's time zone (an IANA name, default UTC) by `croniter`; or an
interval (`--every 15m`, at least a minute), counted from when the schedule was added.

Daylight saving time: a wall time that occurs twice when the clocks go back fires once, at its
first occurrence; a wall time skipped when they go forward fires at the offset before the
change (`30 2 * * *` in Europe/Berlin on the last Sunday of March fires at 03:30 CEST). Each
instant fires at most once.

Each fire starts a run whose id derives from the schedule and the fire time
(`nightly-20261201T020000Z`), so a fire delivered twice, or by two workers, starts one run.
A fire missed while no worker ran is made up once, for the latest missed time, when a worker
comes back (not once per missed time); a fire due while the schedule is paused is skipped. A
pause, resume or removal that answered stays done, even one that lands while a fire is starting
its run (that run is started; the schedule fires no more unless resumed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from ratchet.errors import InvalidInput, ScheduleInvalid, is_transient

SCHEDULE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MIN_EVERY_SECONDS = 60
MAX_EVERY_SECONDS = 366 * 24 * 3600
MAX_SCHEDULES = 1000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"^([1-9][0-9]{0,7})([smhd])$")
_JUST_AFTER = timedelta(microseconds=1)
"""croniter's `get_prev` is strictly before its start: from just after `now`, `now` itself."""
_CLOCK_CHANGE = timedelta(hours=3)
"""More than any zone's clock moves at once."""
_FIRE_LOOKAHEAD = 1000
"""A cron expression's next fire is found in at most this many candidates (the wall-clock
guard below skips at most a handful)."""


def parse_every(text: str) -> int:
    """`90s`, `15m`, `2h`, `1d` as seconds; `ScheduleInvalid` naming `every` otherwise."""
    found = _EVERY.fullmatch(text.strip())
    if found is None:
        raise ScheduleInvalid("every", f"{text!r} is not an interval: use 15m, 2h, 1d or 90s")
    seconds = int(found.group(1)) * _UNITS[found.group(2)]
    if seconds < MIN_EVERY_SECONDS:
        raise ScheduleInvalid("every", f"{text} is under a minute, the shortest interval")
    if seconds > MAX_EVERY_SECONDS:
        raise ScheduleInvalid("every", f"{text} is over 366 days, the longest interval")
    return seconds


class ScheduleSpec(BaseModel):
    """What `ratchet schedule add` (and the client) take: checked before anything is written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=SCHEDULE_NAME.pattern)
    agent: str = Field(min_length=1, max_length=300)
    cron: str | None = Field(default=None, max_length=200)
    every_seconds: int | None = Field(default=None, ge=MIN_EVERY_SECONDS, le=MAX_EVERY_SECONDS)
    input: dict[str, JsonValue] = Field(default_factory=dict)
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if len(value.split()) != 5 or not _croniter().is_valid(value):
            raise ValueError(
                f"{value!r} is not a five-field cron expression (minute hour day-of-month "
                "month day-of-week, e.g. '0 9 * * 1-5')"
            )
        return " ".join(value.split())

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"{value!r} is not a time zone: use an IANA name such as 'Europe/Berlin' or 'UTC'"
            ) from None
        return value

    @model_validator(mode="after")
    def _one_rule(self) -> ScheduleSpec:
        if (self.cron is None) == (self.every_seconds is None):
            raise ValueError("give either cron or every, not both or neither")
        return self

    @property
    def rule(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron} ({self.timezone})"
        return f"every {_interval(self.every_seconds or 0)}"


class Schedule(BaseModel):
    """A schedule as kept: its spec, since when it counts, whether it is paused, and when it
    fires next (UTC)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: ScheduleSpec
    anchor: datetime
    next_fire: datetime
    paused: bool = False
    last_run: str | None = None
    """The id of the run its last fire started."""

    @property
    def name(self) -> str:
        return self.spec.name


def new_schedule(spec: ScheduleSpec, now: datetime) -> Schedule:
    """A schedule added at `now`: an interval counts from its whole second."""
    anchor = now.astimezone(UTC).replace(microsecond=0)
    return Schedule(spec=spec, anchor=anchor, next_fire=next_fire(spec, anchor, after=now))


def next_fire(spec: ScheduleSpec, anchor: datetime, *, after: datetime) -> datetime:
    """The first fire time strictly after `after` (UTC)."""
    if spec.every_seconds is not None:
        every = timedelta(seconds=spec.every_seconds)
        passed = max(0, (after - anchor) // every + 1)
        return (anchor + passed * every).astimezone(UTC)
    assert spec.cron is not None
    zone = ZoneInfo(spec.timezone)
    wall = after.astimezone(zone).replace(tzinfo=None)
    candidates = _croniter()(spec.cron, wall)
    for _ in range(_FIRE_LOOKAHEAD):
        # The wall time, placed in the zone at its first occurrence (fold 0: a skipped one
        # at the offset before the change): each instant after `after` once.
        wall_fire: datetime = candidates.get_next(datetime)
        fire = wall_fire.replace(tzinfo=zone).astimezone(UTC)
        if fire > after:
            return fire
    raise InvalidInput(f"cron: {spec.cron!r} has no fire time after {after:%Y-%m-%d %H:%M}")


def latest_due(schedule: Schedule, now: datetime) -> datetime | None:
    """The latest fire time at or before `now` from the schedule's next one on (a worker that
    was down makes up its missed fires once, for the latest), or None if none is due. Found
    from `now` backwards, not by stepping through every fire missed."""
    if schedule.next_fire > now:
        return None
    spec = schedule.spec
    if spec.every_seconds is not None:
        every = timedelta(seconds=spec.every_seconds)
        last = schedule.anchor + (now - schedule.anchor) // every * every
        return max(last.astimezone(UTC), schedule.next_fire)
    assert spec.cron is not None
    zone = ZoneInfo(spec.timezone)
    # The wall times around `now`, placed in the zone as `next_fire` places them; a clock
    # change reorders them (a repeated hour's wall times map before `now`'s, a skipped
    # hour's after later ones), so the latest at or before `now` is sought within a window
    # wider than any change, not taken as the first found.
    wall_now = now.astimezone(zone).replace(tzinfo=None)
    candidates = _croniter()(spec.cron, wall_now + _CLOCK_CHANGE + _JUST_AFTER)
    latest: datetime | None = None
    for _ in range(_FIRE_LOOKAHEAD):
        wall_fire: datetime = candidates.get_prev(datetime)
        fire = wall_fire.replace(tzinfo=zone).astimezone(UTC)
        if fire <= now and (latest is None or fire > latest):
            latest = fire
        if latest is not None and wall_fire < wall_now - _CLOCK_CHANGE:
            break
    return max(latest, schedule.next_fire) if latest is not None else schedule.next_fire


def fire_run_id(name: str, at: datetime) -> str:
    """The run a fire starts: the same for the same schedule and fire time, however often the
    fire is delivered."""
    return f"{name}-{at.astimezone(UTC):%Y%m%dT%H%M%SZ}"


def _interval(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class ScheduleBook(Protocol):
    """Where a store keeps its schedules (`ratchet.ports` has the runs' ports; this one is
    the schedules' own)."""

    def add(self, schedule: Schedule) -> bool:
        """False (and nothing written) if a schedule of that name exists."""
        ...

    def get(self, name: str) -> Schedule | None: ...

    def all(self) -> list[Schedule]: ...

    def due(self, now: datetime) -> list[Schedule]:
        """The schedules not paused whose next fire is at or before `now`."""
        ...

    def remove(self, name: str) -> bool: ...

    def replace(self, schedule: Schedule, *, expected: Schedule) -> bool:
        """Write `schedule` over the stored one if that is still `expected`, the schedule as
        read (what a pause or a resume writes): False, and nothing written, if anything of
        it changed meanwhile, so the caller reads it again rather than undo that change."""
        ...

    def move_on(self, fired: Schedule, *, next_fire: datetime, last_run: str) -> bool:
        """Record a fire of `fired` (the schedule as the fire read it): write its next fire
        and last run, the fields a fire owns, and nothing else, if the stored schedule is
        still `fired` but for whether it is paused. Of two workers firing the same time one
        moves it on; a pause that landed while the fire started its run stays; a resume
        (which set the next fire), a removal or a schedule added again under the name leave
        nothing for this fire to move."""
        ...


Starter = Callable[[str, ScheduleSpec, datetime], Any]
"""Starts the run of one fire: (run id, the schedule, the fire time)."""


def fire_due(book: ScheduleBook, start: Starter, now: datetime, *, logger: Any) -> Sequence[str]:
    """Start a run for each schedule that is due at `now`, and move its next fire on; the
    run ids started. A start the agent refuses (a module that no longer imports, input its
    model refuses, a `prepare` hook that raises) is logged, and the schedule still moves on,
    so it is not tried forever; a transient failure (a busy store) is raised, and the next
    pass fires the same time under the same run id."""
    started = []
    for schedule in book.due(now):
        due = latest_due(schedule, now)
        if due is None:
            continue
        run_id = fire_run_id(schedule.name, due)
        try:
            start(run_id, schedule.spec, due)
        except Exception as refused:
            if is_transient(refused):
                raise  # a busy store: the next pass fires it, under the same run id
            logger.error(
                "schedule fire refused",
                extra={"schedule": schedule.name, "run_id": run_id, "error": str(refused)},
            )
        # Only the fire's own fields, and only over the schedule it read: a pause, resume or
        # removal that landed while the run started has answered its caller, and writing
        # the schedule as read back over it (paused=False) would undo it. The run this fire
        # started stays started; a paused schedule fires no more.
        if book.move_on(
            schedule,
            next_fire=next_fire(schedule.spec, schedule.anchor, after=now),
            last_run=run_id,
        ):
            logger.info("schedule fired", extra={"schedule": schedule.name, "run_id": run_id})
            started.append(run_id)
    return started


def paused(schedule: Schedule, now: datetime, *, pause: bool) -> Schedule:
    """The schedule paused, or resumed: a resumed one fires next at its first time after
    `now` (what fell due while it was paused is skipped)."""
    if not pause:
        return schedule.model_copy(
            update={
                "paused": False,
                "next_fire": next_fire(schedule.spec, schedule.anchor, after=now),
            }
        )
    return schedule.model_copy(update={"paused": True})


def _croniter() -> Any:
    """`croniter.croniter`, imported when a cron is first read: with `dateutil` it takes longer
    to load than the rest of this module, and the client that imports this module starts and
    decides runs (`ratchet start`, `approve`) with no cron to read (bench/cli_start.py)."""
    from croniter import croniter

    return croniter
