"""How a run's head is stored: only what changes, written once per commit.

A `RunState` in memory holds everything a step needs. Its stored head leaves out two parts:

- the static part (`STATIC_FIELDS`: the goal, the options, the agent), written once when the
  run is created and kept beside the head;
- the window (`WINDOW_FIELDS`: the last steps in full and the last result), which the step
  records already hold: the store reads the window's records back with the head, in one range
  read, and `with_window` folds them into the state.

So a commit writes the counters, the status, the digest and the references, and what a step
writes does not grow with its arguments, its results or the goal. Every store (SQLite,
DynamoDB) uses these functions; `tests/conformance` checks that a state read back equals the
state written.

With a payload codec (`RATCHET_PAYLOAD_KEY`, `ratchet.sealing`), each of the three texts is
sealed whole and stored as a small JSON envelope, `{"sealed":"<base64>",...}`: what it says of
the world (the goal, inputs and params, decisions' arguments, tool results, answers, comments,
summaries, the digest's texts) is in the sealed value, bound to its run and its part. What the
stores search or condition on is in their own columns and attributes (ids, status, step,
version, times, sizes), and the envelope keeps in clear only what is read without the models:
the static part's run id, agent and creation time (a worker's concurrency bound counts runs by
agent in SQL), and the digests of the blobs a text references (`ratchet gc` keeps them;
under a codec they are keyed hashes, `PayloadCodec.address`). Without a codec every text is
written as before, byte for byte, and a sealed one is refused in one line naming its key.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable
from typing import Any

from pydantic import TypeAdapter

from ratchet.errors import PayloadKeyMissing, PayloadTampered
from ratchet.migrations import load_state, load_state_raw
from ratchet.sealing import PayloadCodec, header_of, is_sealed
from ratchet.state import (
    MIN_PRIORITY,
    CheckpointEvent,
    Created,
    Message,
    PersonDecided,
    RecordRow,
    RunState,
    StepCompleted,
    StoredCheckpoint,
    ToolOutput,
    WaitSettled,
    answer_in_place,
    message_of,
    preview_of,
)

STATIC_FIELDS = frozenset(
    {"run_id", "agent", "goal", "options", "created_at", "concurrency_key", "priority"}
)
"""Set when the run is created and never changed by a step: stored once."""
WINDOW_FIELDS = frozenset({"messages", "tool_results", "last_result"})
"""Read back from the step records of the window: never stored in the head."""
RECORDS_PER_STEP = 4
"""At most this many records share a step number: two failed attempts, the step, a decision.
A store reading the window back reads `window_reads(size)` records, newest first."""


SEALED_PREFIX = '{"sealed":"'
"""How every sealed text begins; no text of a model does (none has a field `sealed`)."""


def head_json(state: RunState, codec: PayloadCodec | None = None) -> str:
    """What a commit writes of the head: neither the static part nor the window, nor a field
    at its default (no usage yet, nothing pinned). So a field's default must keep its meaning
    for good: changing one needs a schema version and a migration."""
    head = state.model_dump(
        mode="json", exclude=set(STATIC_FIELDS | WINDOW_FIELDS), exclude_defaults=True
    )
    head["schema_version"] = state.schema_version  # always stored: loading reads it first
    text = json.dumps(head, separators=(",", ":"), ensure_ascii=False)
    return text if codec is None else _sealed(text, codec, _context("head", state.run_id))


def static_json(state: RunState, codec: PayloadCodec | None = None) -> str:
    """The static part of the head, written once with the run's first checkpoint."""
    # A run at the default priority stores none: its static part is as it was before runs
    # had one.
    left_out = {"priority"} if state.priority == MIN_PRIORITY else set()
    text = state.model_dump_json(
        include={*STATIC_FIELDS, "schema_version"} - left_out, exclude_none=True
    )
    return sealed_static_text(text, codec, run_id=state.run_id)


STATIC_CLEAR = ("run_id", "agent", "created_at", "concurrency_key", "priority")
"""What a sealed static part keeps in clear: SQL counts a worker's runs by agent and key, and
orders the runs waiting for a slot by priority."""


def sealed_static_text(text: str, codec: PayloadCodec | None, *, run_id: str) -> str:
    """A static part's text (`static_json`'s, unsealed) as a store writes it."""
    if codec is None:
        return text
    parsed = json.loads(text)
    clear = {name: parsed[name] for name in STATIC_CLEAR if name in parsed}
    return _sealed(text, codec, _context("static", run_id), clear)


EVENTS: TypeAdapter[CheckpointEvent] = TypeAdapter(CheckpointEvent)


def event_json(checkpoint: StoredCheckpoint, codec: PayloadCodec | None = None) -> str:
    """A checkpoint record's event, without the fields it leaves unset, and a step's without
    what the record's row says (`StepCompleted.stored_exclusions`): its step, its key, its
    output's step and tool, some 60 B of a step's 1.5 KB record."""
    event = checkpoint.event
    if isinstance(event, StepCompleted):
        left = event.stored_exclusions(checkpoint.run_id, checkpoint.step)
        text = event.model_dump_json(exclude_none=True, exclude=left)
    else:
        text = EVENTS.dump_json(event, exclude_none=True).decode()
    return text if codec is None else _sealed(text, codec, _context("event", checkpoint.run_id))


def parse_event(
    text: str | bytes, *, run_id: str, step: int, codec: PayloadCodec | None = None
) -> CheckpointEvent:
    """The event of a record stored by `event_json`, read with its row's run and step, which
    fill in what a step record leaves out; a record stored whole reads as it is."""
    opened = opened_text(text, codec, context=_context("event", run_id))
    return EVENTS.validate_json(opened, context=RecordRow(run_id, step))


def sealed_text(text: str, codec: PayloadCodec | None, *, part: str, run_id: str) -> str:
    """`text` as a store writes it: sealed, bound to the run and the `part` it is (a ledger's
    decision, ...), if there is a codec; as it is if not."""
    return text if codec is None else _sealed(text, codec, _context(part, run_id))


def open_sealed_text(text: str, codec: PayloadCodec | None, *, part: str, run_id: str) -> str:
    """The text `sealed_text` was given (see `opened_text` for what it raises)."""
    opened = opened_text(text, codec, context=_context(part, run_id))
    return opened if isinstance(opened, str) else opened.decode()


def sealed_record_text(
    text: str, codec: PayloadCodec | None, *, part: str, run_id: str, names_blobs: bool = True
) -> str:
    """`sealed_text` for a record read back without its run's id at hand (an approval listed
    with every pending one): the envelope names the run in clear, and is bound to it. Not
    `names_blobs` for a text that references no blob and may hold other 64-hex words (an
    email's signed link): the envelope lists none of them."""
    if codec is None:
        return text
    return _sealed(text, codec, _context(part, run_id), {"run_id": run_id}, names_blobs=names_blobs)


def open_record_text(text: str, codec: PayloadCodec | None, *, part: str) -> str:
    """The text `sealed_record_text` was given."""
    if not is_sealed_text(text):
        return text
    envelope = json.loads(text)
    run_id = envelope.get("run_id", "") if isinstance(envelope, dict) else ""
    return open_sealed_text(text, codec, part=part, run_id=str(run_id))


def sealed_args_hash(digest: str, codec: PayloadCodec | None, *, run_id: str) -> str:
    """A ledger entry's hash of its decision's arguments as a store writes it: with a codec,
    sealed (a plain hash lets whoever reads the store confirm a guess of a call's arguments),
    bound to its run, and naming no blob (the hash is 64 hex, as a blob's digest is). Sealed
    rather than keyed: the ledger compares a retry's hash with the stored one, and hands it
    back (`LedgerEntry.args_hash`) for a step a person said did not run, so it must read back
    as it was given, under any key of the keyring and after a rotation."""
    if codec is None:
        return digest
    return _sealed(digest, codec, _context("args", run_id), names_blobs=False)


def opened_args_hash(text: str, codec: PayloadCodec | None, *, run_id: str) -> str:
    """The hash `sealed_args_hash` was given (one stored in clear reads as it is)."""
    return open_sealed_text(text, codec, part="args", run_id=run_id)


def sealed_value(value: str, codec: PayloadCodec | None, *, part: str, run_id: str) -> str:
    """A value a run's code chose (`RunData`'s) as a store writes it: sealed if there is a
    codec, whatever it looks like, so that no value of the run's is taken for an envelope."""
    return value if codec is None else _sealed(value, codec, _context(part, run_id))


def opened_value(value: str, codec: PayloadCodec | None, *, part: str, run_id: str) -> str:
    """The value `sealed_value` was given. A value is an envelope only if it is a whole one (its
    sealed value begins with the marker): any other text, even one that begins as an envelope
    does, was written without a codec and reads as it is."""
    if not is_sealed_text(value):
        return value
    try:
        envelope = json.loads(value)
        if not is_sealed(base64.b64decode(envelope["sealed"], validate=True)):
            return value
    except (ValueError, TypeError, KeyError, binascii.Error):
        return value
    return open_sealed_text(value, codec, part=part, run_id=run_id)


def _context(part: str, run_id: str) -> bytes:
    """What a sealed text is bound to: a head, a static part or a record of one run. A text
    copied to another run, or a record put where a head was, fails its authentication."""
    return f"ratchet:{part}:{run_id}".encode()


def _sealed(
    text: str,
    codec: PayloadCodec,
    context: bytes,
    clear: dict[str, str] | None = None,
    *,
    names_blobs: bool = True,
) -> str:
    envelope: dict[str, Any] = {
        "sealed": base64.b64encode(codec.seal(text.encode(), context=context)).decode("ascii"),
        **(clear or {}),
    }
    blobs = sorted(blob_digests(text)) if names_blobs else []
    if blobs:
        envelope["blobs"] = blobs
    return json.dumps(envelope, separators=(",", ":"))


def is_sealed_text(text: str | bytes) -> bool:
    prefix = SEALED_PREFIX if isinstance(text, str) else SEALED_PREFIX.encode()
    return text.startswith(prefix)  # type: ignore[arg-type]


def sealed_key_id(text: str) -> str | None:
    """The id of the key a stored text is sealed with (read from its envelope's header, in
    clear), or None for a text written in clear: a whole envelope only, as `opened_value`
    takes one."""
    if not is_sealed_text(text):
        return None
    try:
        envelope = json.loads(text)
        sealed = base64.b64decode(envelope["sealed"], validate=True)
        return header_of(sealed)[0] if is_sealed(sealed) else None
    except (ValueError, TypeError, KeyError, binascii.Error, PayloadTampered):
        return None


def opened_text(text: str | bytes, codec: PayloadCodec | None, *, context: bytes) -> str | bytes:
    """`text` as written before it was sealed (as it is, if it was not): `PayloadKeyMissing`
    naming the key, if there is no codec or not that key; `PayloadTampered` if it fails its
    authentication (or its envelope is not whole); `ValueError` if it is not JSON."""
    if not is_sealed_text(text):
        return text
    envelope = json.loads(text)
    try:
        sealed = base64.b64decode(envelope["sealed"], validate=True)
    except (binascii.Error, TypeError, KeyError):
        raise PayloadTampered("?", "a stored payload's envelope") from None
    if codec is None:
        raise PayloadKeyMissing(
            header_of(sealed)[0],
            "this process has no payload key (set RATCHET_PAYLOAD_KEY as it was set when "
            "the payload was written)",
        )
    return codec.open(sealed, context=context).decode()


def window_reads(size: int) -> int:
    """How many records, newest first, hold every step of a window of `size` steps."""
    return RECORDS_PER_STEP * (size + 1)


def load_head(
    head: str,
    static: str | None,
    *,
    version: int,
    attempts: int,
    codec: PayloadCodec | None = None,
) -> RunState:
    """The state from its stored parts, the head and the static part (None for a head written
    whole, by schema 2 and earlier), without its window (`with_window` adds it from the
    records). Raises `ValueError` for a part that is not a state."""
    if static is None:
        return load_state(head, version=version, attempts=attempts)
    parsed_static = json.loads(static)
    run_id = parsed_static.get("run_id", "") if isinstance(parsed_static, dict) else ""
    if is_sealed_text(static):
        parsed_static = json.loads(opened_text(static, codec, context=_context("static", run_id)))
    opened_head = opened_text(head, codec, context=_context("head", run_id))
    raw: dict[str, Any] = {**parsed_static, **json.loads(opened_head)}
    return load_state_raw(raw, version=version, attempts=attempts)


def with_window(state: RunState, recent: Iterable[CheckpointEvent]) -> RunState:
    """`state` with its window rebuilt from its most recent records (oldest first): the last
    `memory_window` completed steps with their results, a person's answer in place of the
    result of the step that asked, and the last result. Records of steps past the state's
    (none, for a consistent read) and before the window are skipped."""
    first = window_start(state)
    messages: list[Message] = []
    results: dict[int, ToolOutput] = {}
    last_result: str | None = None
    asked_at: int | None = None  # the step waiting for a person: the fold's `waiting.step`
    asked: Any = None  # what it asked: the fold's `waiting.request`
    for event in recent:
        if isinstance(event, Created):
            # A run forked from another starts with the window its source had, and waits
            # where its source waited: a person's answer after it is the asking step's result.
            seeded = event.state
            messages = [m for m in seeded.messages if m.step >= first]
            results = {r.step: r for r in seeded.tool_results if r.step >= first}
            last_result = seeded.last_result
            asked_at = seeded.waiting.step if seeded.waiting is not None else None
            asked = seeded.waiting.request if seeded.waiting is not None else None
        elif isinstance(event, StepCompleted) and first <= event.step <= state.step:
            messages.append(message_of(event))
            results[event.step] = preview_of(event)
            last_result = results[event.step].text
            asked_at = event.step if event.wait is not None else None
            asked = event.wait
        elif isinstance(event, PersonDecided | WaitSettled) and asked_at is not None:
            answered, last_result = answer_in_place(list(results.values()), asked_at, event, asked)
            results = {r.step: r for r in answered}
            asked_at = None
    if state.step == 0 or not messages:
        # A state with no window (a fresh run, or one whose records are gone) keeps whatever
        # it was stored with: a schema-2 head holds its window itself.
        return state
    kept = {m.step for m in messages}
    return state.model_copy(
        update={
            "messages": messages,
            "tool_results": [results[s] for s in sorted(results) if s in kept],
            "last_result": last_result,
        }
    )


def window_start(state: RunState) -> int:
    """The first step of the state's window: after the last step the model summarised, or the
    last `memory_window` steps."""
    if state.options.model_summary:
        return state.memory_through + 1
    return max(1, state.step - state.options.memory_window + 1)


_HEX_DIGEST = re.compile(r"\b[0-9a-f]{64}\b")


def blob_digests(text: str) -> set[str]:
    """Every blob digest a stored text may reference: any 64-hex word, wherever it is (a
    `BlobRef`, a damaged record, a ledger result). When unsure, a blob is kept."""
    return set(_HEX_DIGEST.findall(text))
