"""`ratchet doctor`: one line per check of a deployed stack (`ratchet.runtime.doctor`), exit 1
if any failed."""

from __future__ import annotations

from typing import Annotated

import typer

from ratchet.cli.context import out, say, settings
from ratchet.cli.options import not_empty
from ratchet.errors import InvalidInput

MARKS = {True: "ok  ", False: "FAIL", None: "skip"}
MAX_RUN_TIMEOUT_SECONDS = 3600


def doctor(
    run: Annotated[
        bool,
        typer.Option(
            "--run",
            help="Also start a scripted run through the API and follow it to its end (this "
            "writes the run to the stack's tables; the other checks only read).",
        ),
    ] = False,
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            metavar="NAME",
            callback=not_empty,
            help="The agent --run starts, by the name the deployment registers (default: the "
            "built-in notebook scenario, which writes one note).",
            show_default=False,
        ),
    ] = None,
    input_json: Annotated[
        str | None,
        typer.Option(
            "--input",
            metavar="JSON",
            callback=not_empty,
            help="The input of the agent --run starts, a JSON object; choose one that needs "
            "no approval.",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        int,
        typer.Option(
            "--timeout",
            min=1,
            max=MAX_RUN_TIMEOUT_SECONDS,
            metavar="SECONDS",
            help="How long --run waits for the run to end.",
        ),
    ] = 300,
) -> None:
    """Check a deployed stack with your AWS credentials, from its StoreUrl output (--store
    dynamodb://...): its tables, state machine and functions, the secrets they read, the API
    and, with --run, a run through it. One line per check; exit 1 if any failed."""
    from ratchet.cli.writes import input_object
    from ratchet.runtime.doctor import RunWanted, check_stack
    from ratchet.store_urls import DYNAMODB_SCHEME

    url = settings().store
    if not url.startswith(DYNAMODB_SCHEME):
        raise InvalidInput(
            "ratchet doctor checks a deployed stack: give --store with the stack's StoreUrl "
            "output (dynamodb://...)"
        )
    if (agent is not None or input_json is not None) and not run:
        raise InvalidInput("--agent and --input choose the run --run starts: add --run")
    given = input_object(input_json) if input_json is not None else None
    wanted = RunWanted(agent=agent, input=given, timeout_seconds=timeout) if run else None
    failed = 0
    for check in check_stack(url, run=wanted):
        failed += check.ok is False
        say(f"{MARKS[check.ok]}  {check.name}: {check.detail}")
    if failed:
        out.print(f"{failed} check{'s' if failed > 1 else ''} failed", markup=False)
        raise typer.Exit(1)
