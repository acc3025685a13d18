"""Bounded state from any agent: what the records keep of arguments held by reference, and how
an older head is read."""

from __future__ import annotations

import hashlib
import json

import pytest

from ratchet.engine.decisions import (
    ARGUMENT_PREVIEW_KEYS,
    arguments_preview,
    canonical,
    payload_hash,
    payload_of,
)
from ratchet.engine.fold import apply_event
from ratchet.errors import UnsupportedSchema
from ratchet.migrations import load_state, upgrade_state
from ratchet.state import (
    INLINE_BYTES,
    SCHEMA_VERSION,
    BlobRef,
    Done,
    RunState,
    StepCompleted,
    ToolCall,
    ToolOutput,
    utcnow,
)


def test_a_preview_keeps_small_values_and_replaces_large_ones_by_their_size():
    arguments = {"batch": 7, "dry_run": False, "rows": ["r" * 100] * 1000}

    preview = arguments_preview(arguments)

    size = len(canonical(arguments["rows"]).encode())
    assert preview == {"batch": 7, "dry_run": False, "rows": f"[{size:,} bytes, by reference]"}


def test_a_preview_stays_small_whatever_the_arguments():
    arguments = {f"{'k' * 500}{n}": "v" * 10_000 for n in range(500)}

    preview = arguments_preview(arguments)

    assert len(preview) == ARGUMENT_PREVIEW_KEYS + 1
    assert preview["…"] == f"{500 - ARGUMENT_PREVIEW_KEYS} more arguments"
    assert len(canonical(preview).encode()) < INLINE_BYTES


def test_a_call_kept_inline_hashes_as_it_did_before_references_existed():
    call = ToolCall(name="copy_batch", arguments={"batch": 3})

    payload = payload_of(call)

    assert payload == {"name": "copy_batch", "arguments": {"batch": 3}}
    legacy = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert payload_hash(payload) == hashlib.sha256(legacy.encode()).hexdigest()
    assert payload_of(Done(summary="ok")) == {"summary": "ok"}


def test_the_head_keeps_the_preview_and_the_reference_of_a_call_kept_by_reference():
    state = RunState(run_id="r", agent="a", goal="g")
    ref = BlobRef(sha256="ab" * 32, size=80_000)
    call = ToolCall(name="load", arguments={"payload": "[80,000 bytes, by reference]"}, blob=ref)
    event = StepCompleted(
        step=1,
        key="r/step-1",
        call=call,
        output=ToolOutput(step=1, tool="load", text="ok"),
        attempt=1,
        duration_ms=1.0,
    )

    head = apply_event(state, event, version=2, at=utcnow())

    assert head.messages[-1].arguments == call.arguments
    assert head.messages[-1].blob == ref


def test_a_head_of_schema_1_is_read_and_upgraded():
    stored = RunState(run_id="r", agent="a", goal="g").model_dump(mode="json")
    stored["schema_version"] = 1

    state = load_state(json.dumps(stored), version=4, attempts=1)

    assert (state.schema_version, state.version, state.attempts) == (SCHEMA_VERSION, 4, 1)
    assert SCHEMA_VERSION == 4


def test_an_older_ratchet_refuses_a_head_that_may_hold_references():
    stored = RunState(run_id="r", agent="a", goal="g").model_dump(mode="json")

    with pytest.raises(UnsupportedSchema, match="reads schema 1 at most"):
        upgrade_state(stored, current=1)
