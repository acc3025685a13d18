"""`ratchet budget raise AGENT --usd N [--day D]`: let an agent's runs spend more than its daily
budget (`Agent.max_cost_usd_per_day`) on one UTC day, and wake its runs that wait for the day's
budget. It acts through the Python client; a refusal (an amount that is not a number of dollars
above 0 and at most 10,000, a day that is not a date) is one line, exit 2, nothing written."""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer

from ratchet.cli.context import open_client, operator_name, print_json, say
from ratchet.cli.options import JsonOption, not_empty
from ratchet.cli.usage import Command, example
from ratchet.errors import InvalidInput

app = typer.Typer(
    name="budget",
    help="Raise an agent's daily budget for a day, waking its runs that wait for it.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


@app.command("raise", cls=Command, epilog=example("budget raise"))
def raise_day(
    agent: Annotated[
        str,
        typer.Argument(metavar="AGENT", help="The agent's name (Agent.name)."),
    ],
    usd: Annotated[
        str,
        typer.Option(
            "--usd",
            metavar="USD",
            help="How much more its runs may spend that day: above 0, at most 10,000.",
        ),
    ],
    day: Annotated[
        str | None,
        typer.Option(
            "--day", metavar="YYYY-MM-DD", callback=not_empty, help="The UTC day (default: today)."
        ),
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(
            "--by", metavar="NAME", callback=not_empty, help="Who raises it (default: you)."
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Raise it even if no run in the store is of an agent of that name (yet).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Let the agent's runs spend USD more on a UTC day than its max_cost_usd_per_day, on every
    worker; its runs waiting for today's budget are woken."""
    from ratchet.tools import check_budget, check_day  # the run models (see ratchet.cli.context)

    # Checked before the store is opened: a refusal touches nothing.
    try:
        amount = float(usd)
        if not math.isfinite(amount):
            raise ValueError(usd)
    except ValueError:
        raise InvalidInput(f"--usd: {usd!r} is not a number of US dollars") from None
    try:
        check_budget(amount, "--usd")
        check_day(day, "--day")
    except ValueError as refused:
        raise InvalidInput(str(refused)) from None
    client = open_client(create=False)
    try:
        named, unnamed = _agents_with_runs(client)
        if agent not in named and not unnamed and not force:
            # The budget is kept by name, so a typo'd one would be raised for no run, and the
            # runs that wait for it would go on waiting: refused, unless the raise is meant
            # ahead of the agent's first run here.
            listed = ", ".join(sorted(named)) or "none"
            raise InvalidInput(
                f"no run of agent {agent!r} is in this store: check the name (the agents with "
                f"runs: {listed}), or give --force to raise it before its first run"
            )
        raised = client.raise_day_budget(agent, amount, day=day, by=by or operator_name())
    finally:
        client.close()
    if as_json:
        print_json(raised.model_dump(mode="json"))
        return
    woken = f"woke {', '.join(raised.woken)}" if raised.woken else "no run waited for it"
    unsure = ""
    if agent not in named:
        # A worker may load what this process cannot: the raise stands, and the line says
        # which agents it could not name, so that a typo is still seen.
        unsure = (
            f" (no run here is of an agent named {agent!r} that this process can load; it "
            f"cannot load {', '.join(sorted(unnamed))})"
            if unnamed
            else f" (no run here is of agent {agent!r} yet)"
        )
    say(
        f"agent {raised.agent}'s daily budget for {raised.day} raised by ${amount:,.4f} "
        f"(${raised.raised_usd:,.4f} raised that day, ${raised.spent_usd:,.4f} spent); "
        f"{woken}{unsure}"
    )


def _agents_with_runs(client: Any) -> tuple[set[str], set[str]]:
    """The names (`Agent.name`, which the daily budget is kept by) of the agents of the store's
    runs, and the references of those this process cannot load to read a name from (a module
    only a worker has, a head that does not say)."""
    from ratchet.agents import load_agent
    from ratchet.errors import RatchetError

    named: set[str] = set()
    unnamed: set[str] = set()
    for reference in {r.agent for r in client.runtime.store.list_runs()}:
        if reference is None:
            unnamed.add("(a run whose head does not say)")
            continue
        try:
            named.add(load_agent(reference).name)
        except RatchetError:
            unnamed.add(reference)
    return named, unnamed
