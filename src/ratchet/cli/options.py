"""What the commands take: the options more than one command group shares, and the bounds
the options check."""

from __future__ import annotations

from typing import Annotated, TypeVar

import typer

# The bounds the options check, as the modules that own them define them (a unit test holds
# them equal). Importing those modules here would load the SQLite adapter, the engine and the
# scripted model before `--help` or any command could answer.
MIN_LEASE_SECONDS = 0.1  # ratchet.ports
MAX_LEASE_SECONDS = 3600.0  # ratchet.ports
MAX_STEPS = 10_000  # ratchet.runs
MAX_TOOL_LATENCY_MS = 30_000  # ratchet.runs
MAX_BATCHES = 500  # ratchet.runs
MAX_PRIORITY = 9  # ratchet.state
MAX_APPROVAL_TIMEOUT_SECONDS = 365 * 24 * 3600
"""The longest `--approval-timeout`: a year."""
MAX_ROWS = 100_000
"""The most rows `list --limit` and `history --last` may ask for."""

_Text = TypeVar("_Text", str, list[str], None)


def not_empty(value: _Text) -> _Text:
    """An option given as "" is refused, never taken for the option left out."""
    values = value if isinstance(value, list) else [value]
    if any(v is not None and not v.strip() for v in values):
        raise typer.BadParameter("must not be empty")
    return value


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        callback=not_empty,
        envvar="RATCHET_STORE",
        metavar="URL",
        help="Store URL, or a SQLite file's path. Default: sqlite:///.ratchet/ratchet.db. Read "
        "commands also take dynamodb://TABLE?ledger=TABLE&app=TABLE&region=REGION[&endpoint=URL]. "
        "Before or after the command.",
        show_default=False,
    ),
]
LogJsonOption = Annotated[
    bool,
    typer.Option(
        "--log-json",
        help="Write the JSON log lines to stderr even on a terminal, where they go by default "
        "to the log beside the store (.ratchet/ratchet.log). Before or after the command.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run id.")]
