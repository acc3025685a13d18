"""How each command's help reads: its arguments named as they are typed, and an example.

Typer marks a required argument `{RUN}` in the usage line and types it `RUN <str>` in the list
of arguments; `Command` writes `RUN` in both, as click and man pages do (`[RUN]` when it may
be left out). `EXAMPLES` holds one short command line for every command, shown under its help
as `Example:` (a test parses each one against its command).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

EXAMPLES = {
    "start": "ratchet start --scenario migration --param batches=2 --run-id m1",
    "run": "ratchet run --scenario migration --param batches=2 --run-id m1",
    "worker": "ratchet worker --until-idle",
    "status": "ratchet status m1",
    "history": "ratchet history m1 --last 5",
    "list": "ratchet list --status waiting",
    "watch": "ratchet watch m1",
    "show": "ratchet show m1 --step 2 --json",
    "approve": "ratchet approve m1 --comment 'backups verified'",
    "reject": "ratchet reject m1 --reason 'not before the backup'",
    "link": "ratchet link m1",
    "send": 'ratchet send m1 ci-finished --data \'{"conclusion": "success"}\'',
    "wake": "ratchet wake m1",
    "hook": "ratchet hook m1 ci-finished",
    "deliveries": "ratchet deliveries m1 --json",
    "serve": "ratchet serve --port 8765",
    "verify": "ratchet verify m1",
    "migrate": "ratchet migrate --dry-run",
    "gc": "ratchet gc --older-than 30 --dry-run",
    "demo": "ratchet demo",
    "retry": "ratchet retry m1",
    "resume": "ratchet resume m1",
    "cancel": "ratchet cancel m1 --reason 'wrong table'",
    "fork": "ratchet fork m1 --from-step 2 --run-id m1-again",
    "replay": "ratchet replay m1 --step 2",
    "init": "ratchet init my-agents",
    "synth": "ratchet synth my-agents --context ratchet:notifyEmails=ops@example.com",
    "deploy": "ratchet deploy my-agents --profile prod --require-approval never",
    "doctor": 'ratchet doctor --run --agent payout --input \'{"recipient": "ada", "amount": 1}\'',
    "check": "ratchet check migration --param batches=2 --budget 60",
    "schedule": "ratchet schedule add nightly --agent migration --cron '0 2 * * *'",
    "schedule add": "ratchet schedule add nightly --agent migration --cron '0 2 * * *' "
    "--input '{\"batches\": 2}'",
    "schedule list": "ratchet schedule list",
    "schedule pause": "ratchet schedule pause nightly",
    "schedule resume": "ratchet schedule resume nightly",
    "schedule remove": "ratchet schedule remove nightly",
    "budget": "ratchet budget raise support --usd 5",
    "budget raise": "ratchet budget raise support --usd 5",
}
"""A command line for each command (by its path under `ratchet`) that runs as it is typed,
given a store where run m1 (or schedule nightly) is at the point the command acts on."""


def example(command: str) -> str:
    """The help's epilog for `command`: its example, kept on one line (`\\b` stops click from
    wrapping it)."""
    return f"Example:\n\n\b\n  {EXAMPLES[command]}"


class Command(TyperCommand):
    """A typer command whose help names its arguments without typer's marks."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                pieces += param.get_usage_pieces(ctx)
                continue
            name = _argument_name(param)
            name += "..." if param.nargs != 1 else ""
            pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append((_argument_name(param), record[1]))
            else:
                options.append(record)
        for title, records in (("Arguments", arguments), ("Options", options)):
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def _argument_name(param: Any) -> str:
    return str(param.metavar or (param.name or "").upper())
