"""What every command acts through: the store the options name (its settings, runtime and
client), the consoles it prints to, and who runs it.

The runtime, the client, the logger and whatever else is built on the run models are imported
inside the functions that use them, here and in the command modules: typer reads the options of
every command before it runs one, and `ratchet --help` or an option refused should not wait for
them (the run models alone would about double that time).

Nothing here loads typer, nor rich until a command prints through `out` or `err` (rich's
consoles, made at first use): the commands that write which the entry point answers before the
full CLI (`ratchet.cli.quick_writes`) act through this module too, and say their lines with
`say_line`, which writes the bytes rich would.
"""

from __future__ import annotations

import getpass
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ratchet.errors import (
    AbandonedCallRunning,
    ImportInterrupted,
    InvalidInput,
    RatchetError,
    RunNotFound,
)
from ratchet.store_urls import sqlite_file, store_url
from ratchet.untrusted import for_terminal

if TYPE_CHECKING:
    from rich.console import Console

    from ratchet.state import RunState

    out: Console
    err: Console
else:

    def __getattr__(name: str) -> Any:
        """`out` and `err`, rich's consoles on stdout and stderr, made when a command first
        prints through them: rich takes longer to load than `ratchet start` takes to write a run
        (issue 36), and the commands that write print without it (`say_line`)."""
        if name not in ("out", "err"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return _consoles()[name]


def _consoles() -> dict[str, Console]:
    made = globals()
    if "out" not in made:
        from rich.console import Console

        made["out"] = Console(highlight=False, soft_wrap=True, emoji=False)
        made["err"] = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    return {"out": made["out"], "err": made["err"]}


class _Globals:
    store: str | None = None
    log_json: bool = False
    log_file: Any = None


DISTRIBUTION = "ratchet-agents"


def installed_version() -> str:
    """The installed distribution's version, as `ratchet --version` prints it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed)"


def use_global_options(store: str | None, log_json: bool) -> None:
    """What `ratchet --store URL --log-json` set for the command that runs."""
    _Globals.store = store
    _Globals.log_json = log_json
    # A run started with `--agent my_module:agent` is later worked and verified by other
    # `ratchet` processes; the console script does not put the current directory on the path.
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def command(*words: str) -> str:
    """A `ratchet` command line to print for the user to run next: on the store this one
    was given with `--store`, which the next command would not otherwise know."""
    import shlex

    from ratchet.store_urls import shown_url

    # Its password, if the URL holds one, as `***`: a line to copy is no place for it.
    store = ["--store", shown_url(_Globals.store)] if _Globals.store else []
    return shlex.join(["ratchet", *words, *store])


def settings(store: str | None = None) -> Any:
    """The local settings from the environment, on the store `store` or `--store` names."""
    from ratchet.runtime.local import LocalSettings  # the run models (see above)

    from_env = LocalSettings.from_env()
    chosen = store_url(store or _Globals.store or "") or None
    return from_env.model_copy(update={"store": chosen}) if chosen else from_env


def check_worker_settings() -> None:
    """Refuse, before a store is opened or a run made, what a worker of this process would
    refuse when it starts: a `RATCHET_MAX_CONCURRENT` key that names no agent it loads."""
    from ratchet.runtime.local import concurrency_limits

    concurrency_limits(settings())


def open_runtime(*, create: bool, store: str | None = None) -> Any:
    from ratchet.runtime import runtime_for

    chosen = settings(store)
    if create:
        check_store_folder(chosen.store)
    return runtime_for(chosen, create=create)


def check_store_folder(store: str) -> None:
    """A command makes a new local store in a folder that exists, or in a folder of its own
    inside one that does (as the default's `.ratchet`), never down a path of folders that do
    not exist: a mistyped `--store` is refused, not made somewhere no one will read it."""
    from ratchet.store_urls import sqlite_file

    path = sqlite_file(store)
    if path is None or path == ":memory:":
        return
    folder = Path(path).parent
    if not folder.is_dir() and not folder.absolute().parent.is_dir():
        raise InvalidInput(
            f"no folder {folder} for the store {path}: check --store (or RATCHET_STORE), or "
            "make the folder first"
        )


def store_named(store: str) -> str:
    """The store as a person finds it: a local store's file, in full; any other's URL without
    its password."""
    from ratchet.store_urls import shown_url, sqlite_file

    path = sqlite_file(store)
    return str(Path(path).resolve()) if path is not None else shown_url(store)


def open_client(*, create: bool, worker_id: str | None = None, logs: bool = True) -> Any:
    """The Python client the commands act through, on the store the options name. A read
    command (`logs=False`) logs nothing, and so skips loading the JSON logger."""
    from ratchet.client import Client  # the run models (see above)
    from ratchet.faults import FaultPlan
    from ratchet.runtime import runtime_for

    chosen = settings()
    if create:
        check_store_folder(chosen.store)
    return Client(
        runtime_for(chosen, create=create),
        worker_id=worker_id or cli_worker_id(),
        logger=cli_logger() if logs else None,
        faults=FaultPlan.parse(chosen.fault),
        channel="cli",
    )


_ON_AWS = {
    "start": "runs on AWS start through the stack's API",
    "run": "runs on AWS start through the stack's API, and the state machine works them",
    "worker": "on AWS the state machine works runs; there is no worker to start",
    "approve": "on AWS a person decides through the emailed link or Slack, and a program "
    "through POST /runs/RUN/approve on the stack's API",
    "reject": "on AWS a person decides through the emailed link or Slack, and a program "
    "through POST /runs/RUN/reject on the stack's API",
    "send": "use POST /runs/RUN/events/NAME on the stack's API, which also wakes the "
    "parked execution",
    "wake": "use POST /runs/RUN/wake on the stack's API, which also wakes the parked execution",
    "demo": "the demo runs on a local store of its own",
    "link": "on AWS approval links are sent by email or Slack when a run parks",
    # On AWS a steered run needs its execution started or stopped, which only the API does.
    "retry": "on AWS use POST /runs/RUN/retry on the stack's API, which also starts a new "
    "execution",
    "cancel": "on AWS use POST /runs/RUN/cancel on the stack's API, which also stops the execution",
    "fork": "on AWS use POST /runs/RUN/fork on the stack's API, which also starts the fork's "
    "execution",
    "gc": "there the tables' TTL expires old records",
    "deliveries": "on AWS a run's status changes are EventBridge events (docs/following-runs.md)",
}


def require_local_store(command: str) -> None:
    """The commands that write, or work on the store itself, take a local store only: refuse
    a dynamodb:// one before touching anything, saying what to do on AWS instead. A
    postgresql:// store takes them all, but the demo, which makes a store of its own."""
    from ratchet.store_urls import DYNAMODB_SCHEME, POSTGRES_SCHEMES

    store = settings().store
    if store.startswith(DYNAMODB_SCHEME):
        raise InvalidInput(
            f"ratchet {command} needs a local sqlite:// store, not a dynamodb:// one: "
            f"{_ON_AWS[command]}"
        )
    if store.startswith(POSTGRES_SCHEMES) and command == "demo":
        raise InvalidInput(
            "ratchet demo runs on a fresh sqlite:// store of its own, not on a postgresql:// "
            "one: run it without --store (docs/postgres.md has what runs on Postgres)"
        )


def check_run_id(run_id: str) -> str:
    """`ratchet.runs.check_run_id`, imported when a command first needs it."""
    from ratchet.runs import check_run_id as check  # the run models (see above)

    return check(run_id)


def load_head(runtime: Any, run_id: str) -> RunState:
    state: RunState | None = runtime.store.load_head(check_run_id(run_id))
    if state is None:
        raise RunNotFound(run_id)
    return state


def print_json(payload: Any) -> None:
    from ratchet.cli.readout import json_text  # the read commands' text, which a write has none of

    sys.stdout.write(json_text(payload))


def say(text: str, *, console: Console | None = None, lines: bool = False) -> None:
    """Print a line that may hold stored or tool-given text (on `console`, else `out`): never
    as rich markup, and with every control character escaped (`ratchet.untrusted.for_terminal`)."""
    (console or _consoles()["out"]).print(for_terminal(text, lines=lines), markup=False)


def say_line(text: str, *, stderr: bool = False) -> None:
    """`say(text)` (on `err` with `stderr`) without loading rich, in the same bytes: escaped,
    the text has no tab or newline, the only characters rich would change in text it prints
    without markup, and it goes out with its newline and a flush, as rich writes a line
    (tests/unit/test_cli_lines.py holds the two equal)."""
    stream = sys.stderr if stderr else sys.stdout
    stream.write(f"{for_terminal(text)}\n")
    stream.flush()


def refuse(message: str, *, code: int = 2) -> NoReturn:
    """End the command as bad input ends: one line on stderr, `ratchet: ...`, and `code`."""
    say_line(f"ratchet: {' '.join(message.split())}", stderr=True)
    sys.exit(code)


def refuse_error(error: RatchetError) -> NoReturn:
    """End the command on Ratchet's `error`, in one line: exit 130 for an agent module
    interrupted while it was imported, 1 for a worker that must stop beside a call it abandoned
    (nothing typed was wrong), and 2, bad input, for every other."""
    if isinstance(error, ImportInterrupted):
        refuse(str(error), code=130)
    if isinstance(error, AbandonedCallRunning):
        refuse(str(error), code=1)
    refuse(str(error))


def cli_logger() -> Any:
    """The JSON logger of the commands, at `RATCHET_LOG_LEVEL`. Its lines go to stderr when
    stderr is not a terminal (CI, containers, a pipe) or with `--log-json`; on a terminal, where
    a person reads the step lines, they are appended to the log beside a local store
    (`log_path`) instead."""
    from ratchet.observability import AppendedLines, json_logger

    chosen = settings()
    path = None if _Globals.log_json or not sys.stderr.isatty() else log_path(chosen.store)
    if path is None:
        return json_logger(sys.stderr, level=chosen.log_level)
    if _Globals.log_file is None:
        _Globals.log_file = AppendedLines(path)
    return json_logger(_Globals.log_file, level=chosen.log_level)


def logs_on_terminal() -> bool:
    """Whether the log lines go to a terminal (`--log-json` there): a live display, which
    redraws its lines, would then draw over them."""
    return _Globals.log_json and sys.stderr.isatty()


def log_path(store: str) -> Path | None:
    """The JSON log beside a local store, named as its other files are (`.ratchet/ratchet.db`
    logs to `.ratchet/ratchet.log`); None for a store with no directory of its own."""
    path = sqlite_file(store)
    if path is None:
        return None
    database = Path(path)
    logged = database.with_suffix(".log")
    return logged if logged != database else database.with_name(f"{database.name}.log")


def cli_worker_id() -> str:
    from ratchet.runtime.local import default_worker_id  # the run models (see above)

    return default_worker_id()


def operator_name() -> str:
    """Who runs this command, as the local approval links name them."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local operator"


def prints_links(runtime: Any) -> bool:
    """Whether a command prints the operator's approval link when a run parks: on a store of
    this machine alone (`one_host`) whose links point at this machine (a loopback
    `public_url`), where who reads the output is who sits at it. Elsewhere (a store workers on
    many hosts share, links served to others) a worker's output ends in a service's log, and a
    link there would let whoever reads the log decide: the request goes to whom the run
    notifies, and `ratchet link RUN` prints a link to whoever asks for one."""
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(runtime.public_url).hostname or "").lower()
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return bool(runtime.one_host) and loopback


def approval_link(runtime: Any, run_id: str) -> str:
    """The operator's own link to the run's approval page (opening the request, and writing
    its messages to the outbox, if no one has yet)."""
    from ratchet.runtime.local import log_failures

    logger = cli_logger()
    desk = runtime.approval_desk(worker_id=cli_worker_id(), logger=logger)
    opened = desk.open(
        run_id,
        timeout_seconds=runtime.settings.approval_timeout_seconds,
        operator=operator_name(),
    )
    log_failures(opened.failures, run_id, logger)
    for failure in opened.failures:
        # Said by whoever opened the request, once: the others were sent, the outbox holds
        # every message, and the link below decides it all the same.
        say_line(f"{run_id}: the approval request was not sent through {failure}", stderr=True)
    return str(desk.link(opened.approval, operator_name()))
