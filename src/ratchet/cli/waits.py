"""Settling what a run waits for, other than a person: `send` an event to a run, `wake` a
sleeping one. What the worker and `ratchet run` say when a run parks is
`ratchet.cli.foreground.parked_line`, which loads no typer.

Both commands act through the Python client, and so through the event desk every channel
shares (`ratchet.waiting.desk`): an event is taken once per id, kept in the run's mailbox if
the run does not wait for it yet, and delivered at most once. A refusal (no such run, a run
that has ended, a bad name or id, a payload that is not JSON, over the bound or refused by the
wait's schema, an event the agent does not declare) is one line on stderr, exit code 2, and
nothing written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ratchet.cli.context import (
    open_client,
    operator_name,
    print_json,
    require_local_store,
    say,
)
from ratchet.cli.options import JsonOption, RunArgument, not_empty
from ratchet.errors import InvalidInput, JsonOverLimit, WaitError

if TYPE_CHECKING:
    pass

MAX_DATA_CHARS = 1024 * 1024
"""The longest `--data` text taken before it is parsed: the payload's bound
(`ratchet.state.MAX_EVENT_BYTES`, 256 KiB as compact JSON) with room for whitespace and
escapes; the desk then holds the parsed payload to the bound itself."""


def send(
    run_id: RunArgument,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The event's name, as the run waits for it.")
    ],
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            metavar="JSON",
            help='The event\'s payload, as JSON (\'{"conclusion": "success"}\'), or @FILE to '
            "read it from a file (a payload larger than a command line holds); none: null.",
        ),
    ] = None,
    event_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            metavar="EVENT_ID",
            callback=not_empty,
            help="The event's id: sent again with the same id, it is taken once (default: a "
            "new id).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Send an event to a run: delivered now if the run waits for it, else kept in its
    mailbox until it does."""
    require_local_store("send")
    _check_names(name, event_id)
    payload = _data(data)
    client = open_client(create=False)
    try:
        sent = client.send_event(run_id, name, payload, event_id=event_id)
    except (InvalidInput, WaitError) as refused:
        said = _for_cli(str(refused))
        if said == str(refused):
            raise
        raise InvalidInput(said) from None
    finally:
        client.close()
    if as_json:
        print_json(sent.model_dump(mode="json"))
        return
    say(sent_text(sent.model_dump(mode="json")))


def wake(
    run_id: RunArgument,
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            metavar="NAME",
            callback=not_empty,
            help="Who wakes it (default: your user name).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Wake a sleeping run now, before its time; the next free worker resumes it."""
    require_local_store("wake")
    client = open_client(create=False)
    try:
        run = client.wake(run_id, by=by or operator_name())
    finally:
        client.close()
    if as_json:
        print_json(run.model_dump(mode="json"))
        return
    say(
        f"{run.run_id}: woken at step {run.step}; the next free worker resumes it "
        f"(or: ratchet run --run-id {run.run_id})"
    )


def _check_names(name: str, event_id: str | None) -> None:
    """The desk's checks of the name and id, before the store is opened, naming the
    command's own argument and flag."""
    from ratchet.waiting.desk import check_event_id, check_event_name

    try:
        check_event_name(name)
        if event_id is not None:
            check_event_id(event_id)
    except InvalidInput as refused:
        field, _, reason = str(refused).partition(": ")
        raise InvalidInput(f"{_FLAGS.get(field, field)}: {reason}") from None


_FLAGS = {"name": "NAME", "event_id": "--id"}


def _for_cli(message: str) -> str:
    """A refusal naming the payload (`data`, `data.conclusion`, as the desk and the API
    name it) names the flag it came in: `--data: conclusion: ...`."""
    field, colon, reason = message.partition(": ")
    if not colon or not (field == "data" or field.startswith("data.")):
        return message
    inner = field.removeprefix("data").removeprefix(".").removesuffix("(the payload)")
    return f"--data: {inner}: {reason}" if inner else f"--data: {reason}"


def _data(text: str | None) -> Any:
    """`--data` as JSON: refused, naming the flag, if it is not JSON (or nested too deep, or
    far too long to be a payload), before the store is opened."""
    from ratchet.untrusted import loads

    if text is None:
        return None
    if text.startswith("@"):
        text = _read_data_file(text[1:])
    try:
        return loads(text, field="--data", max_chars=MAX_DATA_CHARS)
    except JsonOverLimit:
        raise
    except ValueError as error:
        raise InvalidInput(f"--data is not JSON: {error}") from None


def _read_data_file(name: str) -> str:
    """The text of `--data @FILE`, read only up to the bound (one byte more says it is over),
    as UTF-8."""
    try:
        with open(name, "rb") as file:
            raw = file.read(MAX_DATA_CHARS * 4 + 1)
    except OSError as error:
        raise InvalidInput(f"--data: cannot read {name!r}: {error.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"--data: {name!r} is not UTF-8 text") from None


def sent_text(answer: dict[str, Any]) -> str:
    """The desk's answer in words (`Sent.answer()`): delivered at step N, queued in the
    mailbox, refused by the wait, each saying when it was a repeat of an event sent before."""
    run_id, name, event_id = answer["run_id"], answer["name"], answer["event_id"]
    status = answer["status"]
    if status == "delivered":
        said = (
            f"{run_id}: event {name!r} ({event_id}) delivered at step {answer['step']}; the "
            f"next free worker resumes the run (or: ratchet run --run-id {run_id})"
        )
    elif status == "queued":
        said = (
            f"{run_id}: event {name!r} ({event_id}) queued in the mailbox: the run takes it "
            f"when it waits for {name!r}"
        )
    else:
        said = f"{run_id}: event {name!r} ({event_id}) kept but refused: {answer['refused']}"
    if answer["duplicate"]:
        said += " (sent before with this id: nothing changed)"
    return said
