"""Reading runs: `status`, `history` and `list` (which `ratchet.cli.quick` answers first on a
SQLite store, through the same `ratchet.cli.readout`), `watch`, `show`, `verify` and `replay`.
They read any store, the tables of a deployed stack included."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ratchet.cli import readout
from ratchet.cli.context import open_client, out, print_json, settings
from ratchet.cli.options import MAX_ROWS, MAX_STEPS, JsonOption, RunArgument, not_empty
from ratchet.cli.progress import ProgressPrinter, line_of_checkpoint
from ratchet.cli.store_file import RunMarks
from ratchet.untrusted import for_terminal, json_for_terminal

if TYPE_CHECKING:
    from ratchet.client import Client
    from ratchet.state import RunState, RunStatus


def status_payload(state: RunState) -> dict[str, Any]:
    """What `ratchet status --json` prints of `state`."""
    return readout.status_payload(state.model_dump(mode="json"))


def status(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """Where a run stands, with its token usage and estimated cost."""
    client = open_client(create=False, logs=False)
    try:
        payload = status_payload(client.head(run_id))
    finally:
        client.close()
    sys.stdout.write(readout.json_text(payload) if as_json else readout.status_text(payload))


def history(
    run_id: RunArgument,
    as_json: JsonOption = False,
    after: Annotated[
        int,
        typer.Option(
            "--after",
            metavar="V",
            min=0,
            help="Only the checkpoints of a later version (the last you read).",
        ),
    ] = 0,
    last: Annotated[
        int | None,
        typer.Option(
            "--last", metavar="N", min=1, max=MAX_ROWS, help="Only the last N checkpoints."
        ),
    ] = None,
) -> None:
    """One row per checkpoint: what happened (in words), the tool, its arguments and result,
    who decided, worker, bytes, time, model tokens. Versions without a row are explained."""
    client = open_client(create=False, logs=False)
    try:
        every = [
            readout.history_row(c.model_dump(mode="json"))
            for c in client.history(run_id, after=after)
        ]
        head_version = client.head(run_id).version
    finally:
        client.close()
    rows, first = readout.history_window(every, after=after, last=last)
    if as_json:
        payload = readout.history_payload(run_id, rows, head_version, first=first)
        sys.stdout.write(readout.json_text(payload))
    else:
        width = readout.terminal_width()
        sys.stdout.write(readout.history_text(rows, head_version, first=first, width=width))


def list_runs(
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            callback=not_empty,
            help="Only runs in this status (running, waiting, done, failed, stopped, cancelled).",
        ),
    ] = None,
    as_json: JsonOption = False,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit", metavar="N", min=1, max=MAX_ROWS, help="Only the N most recently updated."
        ),
    ] = None,
    after: Annotated[
        str | None,
        typer.Option(
            "--after",
            metavar="TOKEN",
            callback=not_empty,
            help="Go on where an earlier list stopped: the token it printed as `next`.",
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            metavar="KEY",
            callback=not_empty,
            help="Only the runs started with this --key (it reads every run).",
        ),
    ] = None,
) -> None:
    """Every run in the store, most recently updated first. A list cut short by `--limit`
    ends with a `next` token; `--after TOKEN` lists the runs after it."""
    if key is not None:
        from ratchet.runs import check_concurrency_key  # the run models (ratchet.cli.context)

        check_concurrency_key(key, "--key")
    client = open_client(create=False, logs=False)
    try:
        rows, more = _listed_rows(client, status=status, limit=limit, after=after, key=key)
    finally:
        client.close()
    if as_json:
        sys.stdout.write(readout.json_text({"runs": rows, "next": more}))
        return
    sys.stdout.write(readout.list_text(rows))
    if more is not None:
        again = f" --status {status}" if status else ""
        again += f" --limit {limit}" if limit else ""
        again += f" --key {key}" if key else ""
        sys.stdout.write(f"more: ratchet list{again} --after {more}\n")


def _listed_rows(
    client: Client,
    *,
    status: str | None,
    limit: int | None,
    after: str | None,
    key: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Up to `limit` rows (all, without one), read a page of the store's listing at a time
    (on DynamoDB an index, never a Scan), and the token of what is left, if any."""
    from ratchet.client import MAX_PAGE_RUNS  # the run models (see ratchet.cli.context)

    rows: list[dict[str, Any]] = []
    token = after
    while True:
        wanted = MAX_PAGE_RUNS if limit is None else min(MAX_PAGE_RUNS, limit - len(rows))
        page = client.runs_page(status=status, limit=wanted, after=token, key=key)
        rows += [readout.listed(r.model_dump(mode="json")) for r in page.runs]
        token = page.next
        if token is None or (limit is not None and len(rows) >= limit):
            return rows, token


def watch(
    run_id: RunArgument,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the run's feed: one JSON object per event, each with its id "
            "(docs/following-runs.md).",
        ),
    ] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval", metavar="S", help="Seconds between reads of the store.", min=0.01, max=60
        ),
    ] = 0.2,
    after: Annotated[
        int,
        typer.Option(
            "--after",
            metavar="ID",
            min=0,
            help="Only what was written after this id (an event's id, a checkpoint's version).",
        ),
    ] = 0,
) -> None:
    """Follow a run: a line per checkpoint, from the first, until the run is done, stopped,
    cancelled, failed or waiting for a person. Exit 1 if it failed, else 0."""
    from ratchet.state import RunStatus  # the run models (see ratchet.cli.context)

    client = open_client(create=False, logs=False)
    try:
        if as_json:
            status = _watch_feed(client, run_id, after=after, interval=interval)
        else:
            status = _watch_lines(client, run_id, after=after, interval=interval)
    finally:
        client.close()
    if status is RunStatus.FAILED:
        raise typer.Exit(1)


def _watch_feed(client: Client, run_id: str, *, after: int, interval: float) -> RunStatus:
    """`watch --json`: the run's feed (`Client.follow`), a line per event, until it ends or
    parks; the status it ended in."""
    from ratchet.feed import PARKED_OR_ENDED

    for event in client.follow(run_id, after=after, until=PARKED_OR_ENDED, poll=interval):
        text = json.dumps(event.data(), ensure_ascii=False, separators=(",", ":"))
        sys.stdout.write(json_for_terminal(text) + "\n")
        sys.stdout.flush()
    return client.head(run_id).status


def _watch_lines(client: Client, run_id: str, *, after: int, interval: float) -> RunStatus:
    """`watch`: a line per checkpoint until the run ends or parks; the status it ended in."""
    from ratchet.state import RunStatus

    poll = WatchPoll(client, run_id, settings().store)
    printed = after
    seen_version = 0
    try:
        with ProgressPrinter() as printer:
            while True:
                head = poll.head()
                if head.version != seen_version:
                    # Only what was written since the last read: one range read a poll.
                    for checkpoint in client.history(run_id, after=printed):
                        before = printer.before(run_id)
                        params = head.options.params
                        printer.show(line_of_checkpoint(run_id, checkpoint, params, before))
                        printed = checkpoint.version
                    seen_version = head.version
                if head.status is not RunStatus.RUNNING:
                    return head.status
                time.sleep(interval)
    finally:
        poll.close()


class WatchPoll:
    """What `watch` reads of the run each poll: its head, read again only when the run has
    moved. On a SQLite store a poll first reads the run's version and status alone
    (`ratchet.cli.store_file.RunMarks`, one row): the same mark as the last poll's means no write
    since, and the head read then is kept. On another store each poll reads the head."""

    def __init__(self, client: Client, run_id: str, store: str) -> None:
        self.client, self.run_id = client, run_id
        self.marks = RunMarks.open(store)
        self.mark: tuple[int, str] | None = None
        self.last: RunState | None = None

    def head(self) -> RunState:
        # The mark is read before the head: the head kept is never older than the mark, and
        # any write after it changes the next poll's mark.
        mark = self.marks.of(self.run_id) if self.marks is not None else None
        if self.last is None or mark is None or mark != self.mark:
            self.last = self.client.head(self.run_id)
            self.mark = mark
        return self.last

    def close(self) -> None:
        if self.marks is not None:
            self.marks.close()


def show(
    run_id: RunArgument,
    step: Annotated[
        int | None,
        typer.Option(
            "--step", metavar="N", help="Show the state as of this step.", min=0, max=MAX_STEPS
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The run's state, now or as of the checkpoint of an earlier step."""
    client = open_client(create=False)
    try:
        state = client.head(run_id) if step is None else client.state_at(run_id, step=step)
    finally:
        client.close()
    payload = state.model_dump(mode="json")
    if as_json:
        print_json(payload)
    else:
        # Rich writes JSON with text as it is; JSON escapes the C0 controls, and where the
        # state holds DEL, C1 or bidirectional controls, everything but ASCII is escaped.
        text = json.dumps(payload, ensure_ascii=False)
        out.print_json(data=payload, ensure_ascii=json_for_terminal(text) != text)


def verify(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """Check the run's invariants (for migration: rows, duplicates, emails), a line each. Exit 1
    if not ok."""
    client = open_client(create=False)
    try:
        payload: dict[str, Any] = {"run_id": run_id, **client.verify(run_id)}
    finally:
        client.close()
    sys.stdout.write(readout.json_text(payload) if as_json else readout.verify_text(payload))
    if not payload.get("ok"):
        raise typer.Exit(1)


def replay(
    run_id: RunArgument,
    step: Annotated[
        int,
        typer.Option(
            "--step", metavar="N", min=1, max=MAX_STEPS, help="The step whose prompt to show."
        ),
    ],
    as_json: JsonOption = False,
) -> None:
    """Print the exact prompt a step's model saw, rendered from the recorded state."""
    client = open_client(create=False)
    try:
        prompt = client.replay(run_id, step=step)
    finally:
        client.close()
    if as_json:
        print_json({"run_id": run_id, "step": step, "prompt": prompt})
    else:
        shown = for_terminal(prompt, lines=True)
        sys.stdout.write(shown if shown.endswith("\n") else shown + "\n")
