"""The `ratchet` command: start runs, work them, inspect them, decide on them, run the demo.

Bad input never ends in a traceback or a changed store: it is one line on stderr and exit
code 2. Read commands print one JSON object with `--json`.

The store is a local SQLite file (`sqlite:///path.db`, the default) or, for the read commands
(`status`, `history`, `show`, `verify`), the tables of a deployed stack:
`dynamodb://<checkpoints table>?ledger=<idempotency table>&app=<app table>&region=<region>`,
plus `&endpoint=<url>` for DynamoDB Local or moto. Runs on AWS start and are decided through
the stack's API, so the commands that write refuse a `dynamodb://` store.

Here are the typer app, its commands (each from the module of its group) and `main`, which
makes bad input of any kind one line and an exit code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

# Typer vendors click; its usage errors are only importable from the vendored package.
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from ratchet.cli import (
    budget,
    check,
    decisions,
    deliveries,
    doctor,
    hooks,
    housekeeping,
    inspection,
    project,
    runs,
    schedules,
    serve,
    waits,
)
from ratchet.cli.argv import STORE, arrange
from ratchet.cli.context import (
    DISTRIBUTION,
    installed_version,
    out,
    refuse,
    refuse_error,
    use_global_options,
)
from ratchet.cli.options import LogJsonOption, StoreOption
from ratchet.cli.usage import Command, example
from ratchet.errors import InvalidInput, RatchetError
from ratchet.untrusted import is_utf8

COMMANDS: dict[str, Callable[..., None]] = {
    "start": runs.start,
    "run": runs.run,
    "worker": runs.worker,
    "status": inspection.status,
    "history": inspection.history,
    "list": inspection.list_runs,
    "watch": inspection.watch,
    "show": inspection.show,
    "approve": decisions.approve,
    "reject": decisions.reject,
    "link": decisions.link,
    "send": waits.send,
    "wake": waits.wake,
    "hook": hooks.hook,
    "serve": serve.serve,
    "deliveries": deliveries.deliveries,
    "verify": inspection.verify,
    "migrate": housekeeping.migrate,
    "gc": housekeeping.gc,
    "demo": serve.demo,
    "retry": decisions.retry,
    "resume": decisions.resume,
    "cancel": decisions.cancel,
    "fork": decisions.fork,
    "replay": inspection.replay,
    "init": project.init,
    "synth": project.synth,
    "deploy": project.deploy,
    "doctor": doctor.doctor,
    "check": check.check,
}
"""Every command, in the order `ratchet --help` lists them."""


def _print_version(wanted: bool) -> None:
    if wanted:
        out.print(f"{DISTRIBUTION} {installed_version()}", markup=False)
        raise typer.Exit()


VersionOption = Annotated[
    bool,
    typer.Option(
        "--version",
        callback=_print_version,
        is_eager=True,
        expose_value=False,
        help="Print the installed version (of the ratchet-agents distribution) and exit.",
    ),
]


def global_options(
    store: StoreOption = None, log_json: LogJsonOption = False, version: VersionOption = False
) -> None:
    use_global_options(store, log_json)


app = typer.Typer(
    name="ratchet",
    help="Run long LLM agents that survive crashes, deploys and week-long waits for a person.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.callback()(global_options)
for name, command in COMMANDS.items():
    app.command(name, cls=Command, epilog=example(name))(command)
app.add_typer(schedules.app, name="schedule", epilog=example("schedule"))
app.add_typer(budget.app, name="budget", epilog=example("budget"))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point. Bad input of any kind (a usage error, text that is not UTF-8, a value out
    of range, a store that is not Ratchet's) is one line on stderr and exit code 2; an agent
    module interrupted while it is imported is one line and exit code 130; a worker that must
    stop beside a call it abandoned (nothing the user typed was wrong) is one line and exit 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        _check_text(args)
        _check_store_value(args)
        code = app(args=arrange(args), prog_name="ratchet", standalone_mode=False)
    except NoArgsIsHelpError as error:
        error.show()
        sys.exit(2)
    except UsageError as error:
        refuse(_usage_line(error))
    except typer.Abort:
        refuse("aborted", code=1)
    except RatchetError as error:
        refuse_error(error)
    sys.exit(code if isinstance(code, int) else 0)


def _check_text(args: Sequence[str]) -> None:
    """Refuse an argument that is not UTF-8 before any command runs. Python decodes such
    bytes as lone surrogates, which no store, log line or terminal can take."""
    for index, arg in enumerate(args):
        if is_utf8(arg):
            continue
        name, equals, value = arg.partition("=")
        if arg.startswith("--") and equals:
            what, arg = name, value
        elif index > 0 and args[index - 1].startswith("-") and "=" not in args[index - 1]:
            what = args[index - 1]
        else:
            what = f"argument {index + 1}"
        raise InvalidInput(f"{what} is not valid UTF-8: {os.fsencode(arg)!r}")


def _check_store_value(args: Sequence[str]) -> None:
    """Refuse a `--store` typed last, with no value after it, saying so: `arrange` leaves it
    where it was, and click would call it an option the command does not have (or, typed
    alone, ask for its argument without saying where it goes)."""
    if not args or args[-1] != STORE or "--" in args[:-1]:
        return
    import shlex  # only for this refusal: its example quotes what was typed, as a shell takes it

    typed = " ".join(shlex.quote(arg) for arg in args[:-1]) or "COMMAND"
    raise InvalidInput(
        f"{STORE} needs a value, and goes before the command: ratchet {STORE} URL {typed}"
    )


def _usage_line(error: UsageError) -> str:
    """Click's usage error in one line: what is wrong, the range of a number out of it, and
    where to read the usage."""
    message = error.format_message()
    param = getattr(error, "param", None)
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if low is not None and high is not None:
        kind = "a number" if isinstance(low, float) or isinstance(high, float) else "a whole number"
        hint = "/".join(getattr(param, "opts", [])) or getattr(param, "name", "the value")
        got = _bad_input(error)
        message = f"{hint} must be {kind} from {low:g} to {high:g}" + (
            f", not {got!r}" if got is not None else ""
        )
    command = error.ctx.command_path if error.ctx is not None else "ratchet"
    return f"{message} (see: {command} --help)"


def _bad_input(error: UsageError) -> Any:
    cause = error.__cause__
    errors = getattr(cause, "errors", None)
    if callable(errors):
        found = errors()
        if found and "input" in found[0]:
            return found[0]["input"]
    return None
