"""The `ratchet` command's entry point: read commands on a local store answer at once.

`ratchet status RUN`, `ratchet history RUN` and `ratchet list` (with `--json`, `--status`,
`--store`) are what a person types most, often in a loop. Loading the full CLI (typer, rich)
and the run models (pydantic) costs more than ten times what reading the answer does, so on a
SQLite store these commands read the store's JSON with `sqlite3` and say it through
`ratchet.cli.readout`, the functions the full CLI says it with. Anything else, and anything this
path is not sure of (another store, a head of an older schema, a run that is not there, an
option it does not know, a `RATCHET_*` setting the full CLI would check, a store others may
read, of which the full CLI warns), goes on: to `ratchet.cli.quick_writes` for `start`, `run`,
`approve` and `reject` (which it reads without typer), else to the full CLI
(`ratchet.cli.app`), which answers or refuses as it always does. Nothing here writes.

`bench/cli_start.py` measures both paths; `tests/integration/test_quick_reads.py` holds their
output equal, byte for byte.
"""

from __future__ import annotations

import os
import sys

from ratchet import quickjson as json
from ratchet.cli.argv import LOG_JSON, arrange
from ratchet.cli.store_file import connect
from ratchet.store_urls import DEFAULT_STORE, sqlite_file, store_url

# Nothing here loads a module that takes longer to load than a read takes to answer: not
# `typing` nor `pathlib`, nor `json` or `re` (`ratchet.quickjson` reads and writes JSON as
# `json` does), nor `sqlite3`'s Python half (its `dbapi2` loads `datetime` and `collections`
# to register adapters this path never uses; `_sqlite3` is the C module it wraps, loaded by the
# reads alone, since it loads `functools`, which `--help` has no need of).
# tests/integration/test_quick_reads.py checks which modules a read loads.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from sqlite3 import Connection
    from typing import Any

SCHEMA_VERSION = 4
"""`ratchet.state.SCHEMA_VERSION`: a head of another schema goes to the full CLI, which
upgrades it in memory (a unit test holds the two equal)."""
MAX_MEMORY_WINDOW = 50
"""`ratchet.state.MAX_MEMORY_WINDOW`: the window's records are among the newest
`4 * (MAX_MEMORY_WINDOW + 1)` (`ratchet.stored.window_reads`)."""
STATUSES = frozenset({"running", "waiting", "done", "failed", "stopped", "cancelled"})
"""`ratchet.state.RunStatus`, by value."""
SETTINGS_READ = frozenset({"RATCHET_STORE", "RATCHET_PRICES"})
"""The only `RATCHET_*` variables this path reads; with any other set, the full CLI checks it,
but for those in `SETTINGS_UNREAD` with a value it would take."""
LOG_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})
"""`ratchet.runtime.local.LocalSettings.log_level`'s values, in any case."""


def _a_level(value: str) -> bool:
    return value.upper() in LOG_LEVELS


def _a_public_url(value: str) -> bool:
    """`LocalSettings.public_url`'s pattern, `^https?://[^\\s?#]+$`, without loading `re`."""
    scheme, _, rest = value.partition("://")
    return (
        scheme in ("http", "https")
        and bool(rest)
        and not any(c.isspace() or c in "?#" for c in rest)
    )


def _any_text(value: str) -> bool:
    return True


SETTINGS_UNREAD = {
    "RATCHET_LOG_LEVEL": _a_level,
    "RATCHET_PUBLIC_URL": _a_public_url,
    "RATCHET_WEBHOOK_SECRET": _any_text,
    "RATCHET_SLACK_SIGNING_SECRET": _any_text,
}
"""Settings the full CLI checks and a read then ignores: a read logs nothing (whatever the
level), prints no link (whatever the public URL) and signs nothing. With a value the full CLI
would take (ASCII, as it takes only UTF-8 text, and as its check below says; empty is unset),
what a read prints is the same either way, so this path answers; with any other, the full CLI
refuses it in one line. Every other setting goes on to the full CLI: a payload key changes what
a read can open; the webhooks, bounds and timeouts are each checked in ways not worth
repeating here, and an unknown `RATCHET_*` name may be one a newer full CLI reads."""
MAX_ROWS = 100_000
"""`ratchet.cli.options.MAX_ROWS`, the most `list --limit` and `history --last` take: past it,
the full CLI refuses the count, whichever path is asked (a unit test holds the two equal)."""


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    said = help_text(os.environ) if args == ["--help"] else answer(args, os.environ)
    if said is None:
        from ratchet.cli import quick_writes

        if quick_writes.main(args, os.environ):
            return
        from ratchet.cli.app import main as full

        full(args)
        return
    sys.stdout.write(said)
    sys.stdout.flush()


HELP_FILE = "help.txt"
"""`ratchet --help` as the full CLI prints it 80 columns wide or wider, kept beside this module:
`COLUMNS=80 python -m ratchet.cli --help > src/ratchet/cli/help.txt` writes it again, and
`tests/integration/test_quick_reads.py` fails when the two differ."""
HELP_COLUMNS = 80
"""Click wraps help at the terminal's width, up to 80 columns: from 80 on it never changes."""


def help_text(environ: Mapping[str, str]) -> str | None:
    """What `ratchet --help` prints, or None on a terminal too narrow for the kept text."""
    if _columns(environ) < HELP_COLUMNS:
        return None
    try:
        with open(os.path.join(os.path.dirname(__file__), HELP_FILE), encoding="utf-8") as file:
            return file.read()
    except OSError:
        return None


def _columns(environ: Mapping[str, str]) -> int:
    """The width `shutil.get_terminal_size` gives click: `COLUMNS`, else the terminal's, else 80."""
    given = environ.get("COLUMNS", "")
    if given.isascii() and given.isdigit() and int(given) > 0:
        return int(given)
    try:
        columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return HELP_COLUMNS
    return columns or HELP_COLUMNS


def answer(args: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """What the read command `args` prints, or None when the full CLI should answer."""
    if any(_checked_by_the_full_cli(name, value) for name, value in environ.items()):
        return None
    command = _read_command(arrange(list(args)), environ.get("RATCHET_STORE") or DEFAULT_STORE)
    if command is None:
        return None
    if _exposed(command.store):
        # Others may read the store: the full CLI says so in one line (as every command that
        # opens the store does) before it answers, and this path leaves that line to it.
        return None
    documents = _Documents.open(command.store)
    if documents is None:
        return None
    import _sqlite3

    try:
        with documents:
            return _say(documents, command)
    except (_sqlite3.Error, ValueError, KeyError, TypeError, AttributeError):
        # Not what this path expects (a damaged row, a store mid-upgrade): the full CLI reads
        # it with the models and says what is wrong.
        return None
    except Exception as error:
        # A setting refused (a malformed `RATCHET_PRICES`, as `status` prices the run): the
        # full CLI refuses it in one line, exit 2. Ratchet's errors are loaded by then (by
        # what raised it), not before: a read that prices nothing has no need of them.
        from ratchet.errors import InvalidInput

        if isinstance(error, InvalidInput):
            return None
        raise


def _checked_by_the_full_cli(name: str, value: str) -> bool:
    """Whether the setting `name=value` is one the full CLI should check before a read."""
    if not name.startswith("RATCHET_") or name in SETTINGS_READ:
        return False
    takes = SETTINGS_UNREAD.get(name)
    return takes is None or not (value == "" or (value.isascii() and takes(value)))


def _exposed(store: str) -> bool:
    """Whether others than its owner may read the store's file
    (`ratchet.adapters.sqlite.database` warns of it)."""
    path = sqlite_file(store)
    try:
        return path is not None and bool(os.stat(path).st_mode & 0o077)
    except OSError:
        return False


def _say(documents: _Documents, command: _Command) -> str | None:
    from ratchet import summary
    from ratchet.cli import readout

    if command.name == "list":
        listed = [readout.listed(r) for r in readout.newest_first(documents.runs())]
        rows = [r for r in listed if command.operand is None or r["status"] == command.operand]
        if command.last is not None and len(rows) > command.last:
            return None  # cut short by `--limit`: the full CLI pages, and says what is left
        if command.as_json:
            return readout.json_text({"runs": rows, "next": None})
        return readout.list_text(rows)
    run_id = command.operand
    assert run_id is not None
    head = documents.head(run_id)
    if head is None:
        return None
    if command.name == "status":
        payload = readout.status_payload(head)
        return readout.json_text(payload) if command.as_json else readout.status_text(payload)
    records = documents.records(run_id, after=command.after)
    every = [summary.checkpoint_fields(r) for r in records]  # already `history --json` rows
    shown, first = readout.history_window(every, after=command.after, last=command.last)
    if command.as_json:
        return readout.json_text(
            readout.history_payload(run_id, shown, head["version"], first=first)
        )
    width = readout.terminal_width()
    return readout.history_text(shown, head["version"], first=first, width=width)


_OPTIONS = {"status": (), "history": ("--after", "--last"), "list": ("--status", "--limit")}
"""The options (each with a value) each read command takes on this path, besides `--json`."""


def _read_command(args: Sequence[str], store: str) -> _Command | None:
    """What to read, for the forms this path answers (with `--log-json` anywhere, which a
    read has no use for): `[--store URL] status RUN [--json]`,
    `[--store URL] history RUN [--json] [--after V] [--last N]` and
    `[--store URL] list [--status S] [--limit N] [--json]` (an option's value after a space
    or `=`)."""
    rest = [arg for arg in args if arg != LOG_JSON]  # where logs go: a read writes none
    if rest[:1] == ["--store"] and len(rest) > 1:
        store, rest = rest[1], rest[2:]
    elif rest and rest[0].startswith("--store="):
        store, rest = rest[0].removeprefix("--store="), rest[1:]
    store = store_url(store)
    if not rest or rest[0] not in _OPTIONS:
        return None
    name, tokens = rest[0], iter(rest[1:])
    as_json, operands, given = False, [], {}
    for token in tokens:
        if token == "--json":
            as_json = True
            continue
        if not token.startswith("-"):
            operands.append(token)
            continue
        flag, equals, value = token.partition("=")
        if flag not in _OPTIONS[name] or flag in given:
            return None
        value = value if equals else next(tokens, "")
        if not value:
            return None
        given[flag] = value
    count = given.get("--last") or given.get("--limit")  # how many rows to keep, at most
    last = _whole(count) if count is not None else None
    if count is not None and not (last and last <= MAX_ROWS):
        return None
    if name == "list":
        status = given.get("--status")
        if operands or (status is not None and status not in STATUSES):
            return None
        return _Command(name, store, status, as_json, last=last)
    if len(operands) != 1:
        return None
    after = _whole(given.get("--after", "0"))
    if after is None:
        return None
    return _Command(name, store, operands[0], as_json, after, last)


def _whole(text: str | None) -> int | None:
    """A whole number as the full CLI takes it, or None (the full CLI then says what is wrong)."""
    return int(text) if text is not None and text.isascii() and text.isdigit() else None


class _Command:
    """A read this path answers: `name` (status, history, list) on `store`, about `operand`
    (a run id, or the status `list` keeps); `after` and `last` are history's `--after` and
    `--last`, `last` also list's `--limit`."""

    __slots__ = ("after", "as_json", "last", "name", "operand", "store")

    def __init__(
        self,
        name: str,
        store: str,
        operand: str | None,
        as_json: bool,
        after: int = 0,
        last: int | None = None,
    ) -> None:
        self.name, self.store, self.operand, self.as_json = name, store, operand, as_json
        self.after, self.last = after, last


class _Documents:
    """A SQLite store read as JSON documents, in one read transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    @classmethod
    def open(cls, store: str) -> _Documents | None:
        connection = connect(store)
        return None if connection is None else cls(connection)

    def __enter__(self) -> _Documents:
        self.connection.execute("BEGIN")
        return self

    def __exit__(self, *_: object) -> None:
        self.connection.execute("ROLLBACK")
        self.connection.close()

    def head(self, run_id: str) -> dict[str, Any] | None:
        """The run's head with its static part, as `RunState.model_dump(mode="json")` has it
        but for fields at their defaults; None if there is no such run or its head is not of
        the current schema (written whole, before schema 3, or not yet upgraded)."""
        row = self.connection.execute(
            "SELECT r.version, r.attempts, r.state, s.state, r.status FROM runs AS r "
            "LEFT JOIN run_static AS s ON s.run_id = r.run_id WHERE r.run_id = ?",
            (run_id,),
        ).fetchone()
        if row is None or row[3] is None or row[4] not in STATUSES:
            return None  # a tampered status column: the full CLI says the run is damaged
        version, attempts, head, static, _ = row
        document: dict[str, Any] = {**json.loads(static), **json.loads(head)}
        if document.get("schema_version") != SCHEMA_VERSION:
            return None
        # The records of the window, which the full CLI reads with the head: a damaged one
        # (not UTF-8, not JSON) is handed to it, which names the run in one line.
        for (event,) in self.connection.execute(
            "SELECT event FROM checkpoints WHERE run_id = ? ORDER BY version DESC LIMIT ?",
            (run_id, 4 * (MAX_MEMORY_WINDOW + 1)),
        ):
            json.loads(event)
        return {**document, "version": version, "attempts": attempts}

    def records(self, run_id: str, *, after: int = 0) -> list[dict[str, Any]]:
        rows = self.connection.execute(
            "SELECT version, step, status, worker_id, bytes, created_at, event "
            "FROM checkpoints WHERE run_id = ? AND version > ? ORDER BY version",
            (run_id, after),
        )
        return [
            {
                "version": version,
                "step": step,
                "status": status,
                "worker": worker,
                "bytes": size,
                "time": created_at,
                "event": json.loads(event),
            }
            for version, step, status, worker, size, created_at, event in rows
        ]

    def runs(self) -> list[dict[str, Any]]:
        """Every run; `ValueError` (or `sqlite3.Error`, for text that is not UTF-8) if one
        is damaged: the full CLI lists it as damaged, saying why."""
        rows = self.connection.execute(
            "SELECT r.run_id, r.status, r.step, r.version, r.updated_at, r.state, s.state "
            "FROM runs AS r LEFT JOIN run_static AS s ON s.run_id = r.run_id "
            "ORDER BY r.updated_at, r.run_id DESC"  # ties, once reversed: the pages' order
        )
        runs = []
        for run_id, status, step, version, updated_at, head, static in rows:
            if status not in STATUSES:
                raise ValueError(f"run {run_id!r} has no run status")
            json.loads(head), static is None or json.loads(static)
            runs.append(
                {
                    "run_id": run_id,
                    "status": status,
                    "step": step,
                    "version": version,
                    "updated_at": updated_at,
                }
            )
        return runs


if __name__ == "__main__":
    main()
