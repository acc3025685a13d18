"""`ratchet schedule add|list|pause|resume|remove`: runs started on a cron expression or an
interval, fired by the store's workers (`ratchet.schedules` says how, and what happens to a
fire missed while no worker ran). Each command acts through the Python client; a refusal (a
cron expression that does not parse, an interval under a minute, an unknown time zone or
agent, input its model refuses, a name taken or unknown) is one line, exit 2, nothing written.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ratchet.cli import readout
from ratchet.cli.context import open_client, print_json, require_local_store, say
from ratchet.cli.options import JsonOption, not_empty
from ratchet.cli.usage import Command, example
from ratchet.cli.writes import input_object
from ratchet.errors import InvalidInput

app = typer.Typer(
    name="schedule",
    help="Start runs on a schedule: a cron expression or an interval, fired by the workers.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]


@app.command("add", cls=Command, epilog=example("schedule add"))
def add(
    name: NameArgument,
    agent: Annotated[
        str,
        typer.Option(
            "--agent", metavar="REF", callback=not_empty, help="A scenario or module:attr."
        ),
    ],
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron",
            metavar="EXPR",
            callback=not_empty,
            help="Five-field cron: minute hour day-of-month month day-of-week ('0 2 * * *').",
        ),
    ] = None,
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            metavar="DURATION",
            callback=not_empty,
            help="An interval: 15m, 2h, 1d, 90s (a minute at least).",
        ),
    ] = None,
    input_json: Annotated[
        str | None,
        typer.Option(
            "--input", metavar="JSON", callback=not_empty, help="The input of every run it starts."
        ),
    ] = None,
    timezone: Annotated[
        str,
        typer.Option(
            "--timezone", metavar="TZ", help="The zone --cron reads the clock of (IANA name)."
        ),
    ] = "UTC",
    as_json: JsonOption = False,
) -> None:
    """Add a schedule: each fire starts a run named after the schedule and the fire time."""
    require_local_store("schedule add")
    if (cron is None) == (every is None):
        raise InvalidInput("give either --cron or --every")
    given = input_object(input_json) if input_json is not None else {}
    client = open_client(create=True)
    try:
        schedule = client.schedule_add(
            name, agent=agent, cron=cron, every=every, input=given, timezone=timezone
        )
    finally:
        client.close()
    if as_json:
        print_json(_row(schedule))
        return
    say(f"schedule {name} added: {schedule.spec.rule}; fires next at {_when(schedule)}")


@app.command("list", cls=Command, epilog=example("schedule list"))
def list_schedules(as_json: JsonOption = False) -> None:
    """The store's schedules: their rule, whether paused, when each fires next."""
    require_local_store("schedule list")
    client = open_client(create=False, logs=False)
    try:
        rows = [_row(s) for s in client.schedules()]
    finally:
        client.close()
    if as_json:
        print_json({"schedules": rows})
        return
    print(
        readout.table(
            ("schedule", "agent", "rule", "state", "next fire", "last run"),
            [
                [
                    r["name"],
                    r["agent"],
                    r["rule"],
                    "paused" if r["paused"] else "active",
                    r["next_fire"],
                    r["last_run"] or "-",
                ]
                for r in rows
            ],
        ),
        end="",
    )


@app.command("pause", cls=Command, epilog=example("schedule pause"))
def pause(name: NameArgument, as_json: JsonOption = False) -> None:
    """Pause a schedule: the fires due while it is paused are skipped."""
    _pause(name, pause=True, as_json=as_json)


@app.command("resume", cls=Command, epilog=example("schedule resume"))
def resume(name: NameArgument, as_json: JsonOption = False) -> None:
    """Resume a paused schedule: it fires next at its first time from now."""
    _pause(name, pause=False, as_json=as_json)


@app.command("remove", cls=Command, epilog=example("schedule remove"))
def remove(name: NameArgument) -> None:
    """Remove a schedule; the runs it started stay."""
    require_local_store("schedule remove")
    client = open_client(create=False)
    try:
        client.schedule_remove(name)
    finally:
        client.close()
    say(f"schedule {name} removed")


def _pause(name: str, *, pause: bool, as_json: bool) -> None:
    require_local_store("schedule pause" if pause else "schedule resume")
    client = open_client(create=False)
    try:
        schedule = client.schedule_pause(name, pause=pause)
    finally:
        client.close()
    if as_json:
        print_json(_row(schedule))
        return
    said = "paused" if pause else f"resumed; fires next at {_when(schedule)}"
    say(f"schedule {name} {said}")


def _row(schedule: Any) -> dict[str, Any]:
    spec = schedule.spec
    return {
        "name": spec.name,
        "agent": spec.agent,
        "rule": spec.rule,
        "cron": spec.cron,
        "every_seconds": spec.every_seconds,
        "timezone": spec.timezone,
        "input": spec.input,
        "paused": schedule.paused,
        "next_fire": schedule.next_fire.isoformat(),
        "last_run": schedule.last_run,
    }


def _when(schedule: Any) -> str:
    return f"{schedule.next_fire:%Y-%m-%d %H:%M:%S} UTC"
