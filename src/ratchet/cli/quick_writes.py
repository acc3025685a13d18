"""`ratchet start`, `run`, `approve` and `reject` answered before the full CLI loads.

Typer loads itself and every command of the CLI, then builds a pydantic adapter for each option
of the command it runs, before the command begins: about half of what `start` took (issue 36).
For the command lines this module is sure of (options it knows, each given once, with a value
the full CLI takes as typed), the entry point (`ratchet.cli.quick`) reads the options here and
calls what the full CLI's command calls (`ratchet.cli.writes`, and `ratchet.cli.foreground` for
`run`), which validates the run or the answer with the same models, writes through the same
client and says the same lines; a refusal
ends as `ratchet.cli.app.main` ends it: one line on stderr and its exit code. Anything else (an
option it does not know or that is given twice, a value the full CLI checks, `--help`) goes to
the full CLI, which answers or refuses as it always does.

tests/integration/test_quick_writes.py holds both paths' output, exit codes and stores equal.
"""

from __future__ import annotations

import os
import sys

from ratchet.cli.argv import LOG_JSON, STORE, arrange
from ratchet.untrusted import is_utf8

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

MAX_STEPS = 10_000
"""`ratchet.cli.options.MAX_STEPS`, and the others below theirs (a unit test holds them equal):
`ratchet.cli.options` loads typer, which this module is here to skip."""
MAX_BATCHES = 500
MAX_TOOL_LATENCY_MS = 30_000
MAX_APPROVAL_TIMEOUT_SECONDS = 365 * 24 * 3600
MAX_PRIORITY = 9

TEXT = "text"
MANY = "many"
"""A text option that may be given more than once (`--param`, `--notify`), kept in order."""

START: dict[str, tuple[str, str | tuple[int, int]]] = {
    "--goal": ("goal", TEXT),
    "--scenario": ("scenario", TEXT),
    "--run-id": ("run_id", TEXT),
    "--agent": ("agent_ref", TEXT),
    "--model": ("model", TEXT),
    "--max-steps": ("max_steps", (1, MAX_STEPS)),
    "--input": ("input_json", TEXT),
    "--param": ("params", MANY),
    "--batches": ("batches", (1, MAX_BATCHES)),
    "--tool-latency-ms": ("tool_latency_ms", (0, MAX_TOOL_LATENCY_MS)),
    "--notify": ("notify", MANY),
    "--notify-slack": ("notify_slack", TEXT),
    "--approval-timeout": ("approval_timeout", (1, MAX_APPROVAL_TIMEOUT_SECONDS)),
    "--key": ("concurrency_key", TEXT),
    "--priority": ("priority", (0, MAX_PRIORITY)),
    "--budget": ("budget", TEXT),
}
"""`ratchet start`'s options (`ratchet.cli.runs.start`): the field each sets of
`ratchet.cli.writes.NewRun`, and what it takes (text, repeated text, or a whole number
within bounds)."""
APPROVE: dict[str, tuple[str, str | tuple[int, int]]] = {
    "--comment": ("comment", TEXT),
    "--reason": ("comment", TEXT),
    "--by": ("by", TEXT),
    "--answer": ("answer", TEXT),
}
REJECT: dict[str, tuple[str, str | tuple[int, int]]] = {
    "--reason": ("reason", TEXT),
    "--comment": ("reason", TEXT),
    "--by": ("by", TEXT),
}
COMMANDS = {"start": START, "run": START, "approve": APPROVE, "reject": REJECT}
"""The commands this path answers, with their options; `approve` and `reject` take the run.
`run` takes `start`'s options, and its own `--json` only through the full CLI."""


def main(args: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Run the write command `args` if this path is sure of it (and say so with True); False
    when the full CLI should answer."""
    command = write_command(args, environ)
    if command is None:
        return False
    from ratchet.cli import writes
    from ratchet.cli.context import refuse, refuse_error, use_global_options
    from ratchet.errors import AnswerInvalid, RatchetError

    name, store, log_json, given = command
    use_global_options(store, log_json)
    acts: dict[str, Callable[..., None]] = {
        "start": writes.start_run,
        "approve": writes.approve_run,
        "reject": writes.reject_run,
    }
    if name == "run":
        # Its lines of steps and of where the run stands, which the others never load.
        from ratchet.cli.foreground import run_in_foreground

        acts["run"] = run_in_foreground
    try:
        if name in ("start", "run"):
            # Each keyword is one of NewRun's fields, of the kind its option reads (START).
            acts[name](writes.NewRun(**given))  # type: ignore[arg-type]
        else:
            acts[name](**given)
    except KeyboardInterrupt:
        sys.exit(130)  # as typer ends a command interrupted by Ctrl-C, saying nothing
    except BrokenPipeError:
        # As typer ends a command whose reader went away (`| head -0`): exit 1, and no
        # complaint at exit about the output it could not flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except AnswerInvalid as refused:
        refuse(refused.for_cli())  # how to give the answer: `approve`'s --answer
    except RatchetError as error:
        refuse_error(error)
    return True


def write_command(
    args: Sequence[str], environ: Mapping[str, str]
) -> tuple[str, str | None, bool, dict[str, object]] | None:
    """The command, its `--store` (typed, else `RATCHET_STORE`), `--log-json`, and the keywords
    of the function in `ratchet.cli.writes` that runs it, for the forms this path answers:
    `[--store URL] [--log-json] start|run|approve RUN|reject RUN [OPTION VALUE | OPTION=VALUE]...`.
    None for anything else."""
    if not all(is_utf8(arg) for arg in args):
        return None  # the full CLI names the argument that is not UTF-8
    rest = arrange(list(args))
    store, log_json = environ.get("RATCHET_STORE") or None, False
    typed_store = False
    while rest and rest[0].startswith("-"):
        flag, equals, value = rest[0].partition("=")
        if rest[0] == LOG_JSON and not log_json:
            log_json, rest = True, rest[1:]
        elif flag == STORE and not typed_store and (equals or len(rest) > 1):
            store = value if equals else rest[1]
            rest = rest[1:] if equals else rest[2:]
            typed_store = True
        else:
            return None
    if store is not None and (not store.strip() or store.startswith("-")):
        return None  # the full CLI refuses an empty --store
    if not rest or rest[0] not in COMMANDS:
        return None
    name, options = rest[0], COMMANDS[rest[0]]
    given: dict[str, object] = {}
    operands: list[str] = []
    tokens = iter(rest[1:])
    for token in tokens:
        if not token.startswith("-"):
            operands.append(token)
            continue
        flag, equals, text = token.partition("=")
        if flag not in options:
            return None  # `--help`, `--`, an option this command does not take, a typo
        value = text if equals else next(tokens, "")
        keyword, kind = options[flag]
        if not value.strip() or value.startswith("-"):
            return None
        if kind == MANY:
            listed = given.setdefault(keyword, [])
            assert isinstance(listed, list)
            listed.append(value)
            continue
        if keyword in given:
            return None  # given twice: the full CLI keeps the last, and this path need not
        if isinstance(kind, tuple):
            low, high = kind
            number = _whole(value)
            if number is None or not low <= number <= high:
                return None  # the full CLI says the bounds
            given[keyword] = number
        else:
            given[keyword] = value
    if name in ("start", "run"):
        return (name, store, log_json, given) if not operands else None
    if len(operands) != 1:
        return None
    defaults: dict[str, object] = (
        {"comment": "", "answer": None} if name == "approve" else {"reason": ""}
    )
    return name, store, log_json, {**defaults, "by": None, **given, "run_id": operands[0]}


def _whole(text: str) -> int | None:
    """A whole number written plainly (`7`, not `07`, `+7`, `7_000` or ` 7`), else None."""
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)
