"""The contract every CheckpointStore and IdempotencyLedger backend must honour.

One suite, parametrised over backends (`backend` fixture in conftest.py): add a backend there
and it must pass all of this unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from ratchet.engine.fold import apply_event
from ratchet.errors import CheckpointTooLarge, IdempotencyConflict, RunNotFound, StaleVersion
from ratchet.ports import (
    MAX_ITEM_BYTES,
    CallStart,
    Commit,
    LedgerCompletion,
    LedgerEntry,
    LedgerStatus,
    RunCursor,
)
from ratchet.state import (
    ApprovalRequest,
    AttemptFailed,
    Budget,
    BudgetAsked,
    CheckpointEvent,
    Created,
    Finished,
    PersonDecided,
    Reserved,
    Retried,
    RunState,
    RunStatus,
    StepCompleted,
    StoredCheckpoint,
    ToolCall,
    ToolOutput,
    utcnow,
)
from tests.conformance.conftest import BACKENDS, SEALED_BACKENDS, Backend


@pytest.fixture(params=[*sorted(BACKENDS), *sorted(SEALED_BACKENDS)])
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Backend]:
    """Each backend, and each with its records sealed (`RATCHET_PAYLOAD_KEY`)."""
    yield from {**BACKENDS, **SEALED_BACKENDS}[request.param](tmp_path)


def new_run(run_id: str = "r1", goal: str = "copy the rows") -> tuple[RunState, StoredCheckpoint]:
    state = RunState(run_id=run_id, agent="fake", goal=goal)
    return state, StoredCheckpoint(
        run_id=run_id,
        version=1,
        step=0,
        status=state.status,
        worker_id="w",
        event=Created(state=state),
    )


def step_commit(head: RunState, step: int, *, text: str = "ok") -> Commit:
    event = StepCompleted(
        step=step,
        key=f"{head.run_id}/step-{step}",
        call=ToolCall(name="write_row", arguments={"n": step}),
        output=ToolOutput(step=step, tool="write_row", text=text),
        attempt=1,
        duration_ms=1.0,
    )
    return commit_of(
        head, event, step=step, completes=LedgerCompletion(f"{head.run_id}/step-{step}", text)
    )


def commit_of(
    head: RunState, event: CheckpointEvent, *, step: int, completes: LedgerCompletion | None = None
) -> Commit:
    """The commit of `event` on `head`: the head it folds into and its checkpoint record."""
    at = utcnow()
    new_head = apply_event(head, event, version=head.version + 1, at=at)
    checkpoint = StoredCheckpoint(
        run_id=head.run_id,
        version=new_head.version,
        step=step,
        status=new_head.status,
        worker_id="w",
        created_at=at,
        event=event,
    )
    return Commit(
        head=new_head, checkpoint=checkpoint, expected_version=head.version, completes=completes
    )


def entry(key: str = "r1/step-1", args_hash: str = "h1") -> LedgerEntry:
    return LedgerEntry(
        key=key, run_id="r1", step=1, args_hash=args_hash, decision={"name": "write_row"}
    )


# --- CheckpointStore ---------------------------------------------------------------------------


def test_create_then_load_returns_the_same_state(backend):
    state, checkpoint = new_run()

    assert backend.store.create_run(state, checkpoint) is True

    assert backend.store.load_head("r1") == state
    assert backend.store.load_head("nope") is None


def test_creating_an_existing_run_changes_nothing(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    other, other_checkpoint = new_run(goal="something else")

    assert backend.store.create_run(other, other_checkpoint) is False

    assert backend.store.load_head("r1") == state
    assert len(backend.store.list_checkpoints("r1")) == 1


def test_commit_moves_the_head_and_appends_one_checkpoint(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    backend.ledger.begin(entry())
    commit = step_commit(state, 1)

    receipt = backend.store.commit(commit)

    assert backend.store.load_head("r1") == commit.head
    checkpoints = backend.store.list_checkpoints("r1")
    assert [c.version for c in checkpoints] == [1, 2]
    assert checkpoints[1].event == commit.checkpoint.event
    assert checkpoints[1].size == receipt.bytes_written > 0
    completed = backend.ledger.get("r1/step-1")
    assert completed is not None
    assert (completed.status, completed.result) == (LedgerStatus.COMPLETED, "ok")
    # The record holds the decision from now on: the ledger keeps no second copy of it.
    assert completed.decision is None
    assert completed.args_hash == "h1"


def test_the_checkpoints_after_a_version_are_those_of_later_versions_in_order(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    other, other_checkpoint = new_run("r2")
    backend.store.create_run(other, other_checkpoint)
    head = state
    for step in range(1, 12):  # past version 9 -> 10, where a text order would differ
        backend.ledger.begin(entry(f"r1/step-{step}"))
        commit = step_commit(head, step)
        backend.store.commit(commit)
        head = commit.head

    every = backend.store.list_checkpoints("r1")

    assert [c.version for c in every] == list(range(1, 13))
    assert backend.store.list_checkpoints("r1", after=0) == every
    assert [c.version for c in backend.store.list_checkpoints("r1", after=9)] == [10, 11, 12]
    assert backend.store.list_checkpoints("r1", after=9) == every[9:]
    assert backend.store.list_checkpoints("r1", after=12) == []
    assert backend.store.list_checkpoints("nope", after=3) == []
    assert [c.run_id for c in backend.store.list_checkpoints("r2", after=0)] == ["r2"]


def test_the_last_checkpoints_are_the_newest_in_order_and_no_more(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    other, other_checkpoint = new_run("r2")
    backend.store.create_run(other, other_checkpoint)
    head = state
    for step in range(1, 12):  # past version 9 -> 10, where a text order would differ
        backend.ledger.begin(entry(f"r1/step-{step}"))
        commit = step_commit(head, step)
        backend.store.commit(commit)
        head = commit.head
    every = backend.store.list_checkpoints("r1")

    assert backend.store.last_checkpoints("r1", limit=3) == every[-3:]
    assert [c.version for c in backend.store.last_checkpoints("r1", limit=3)] == [10, 11, 12]
    assert backend.store.last_checkpoints("r1", limit=1) == every[-1:]
    assert backend.store.last_checkpoints("r1", limit=500) == every
    assert backend.store.last_checkpoints("nope", limit=3) == []
    assert [c.run_id for c in backend.store.last_checkpoints("r2", limit=5)] == ["r2"]


def test_a_commit_on_a_stale_version_is_rejected_and_changes_nothing(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    winner, loser = step_commit(state, 1, text="winner"), step_commit(state, 1, text="loser")

    backend.store.commit(winner)
    with pytest.raises(StaleVersion):
        backend.store.commit(loser)

    assert backend.store.load_head("r1") == winner.head
    assert len(backend.store.list_checkpoints("r1")) == 2


def test_begin_attempt_counts_and_bumps_the_version_only_on_the_version_read(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)

    assert backend.store.begin_attempt("r1", 1) == 2
    with pytest.raises(StaleVersion):
        backend.store.begin_attempt("r1", 1)
    with pytest.raises(RunNotFound):
        backend.store.begin_attempt("missing", 1)

    head = backend.store.load_head("r1")
    assert head is not None
    assert (head.version, head.attempts) == (2, 1)
    assert len(backend.store.list_checkpoints("r1")) == 1, "an attempt is not a checkpoint"


def test_a_commit_after_begin_attempt_must_name_the_bumped_version(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    backend.store.begin_attempt("r1", 1)

    with pytest.raises(StaleVersion):
        backend.store.commit(step_commit(state, 1))
    bumped = state.model_copy(update={"version": 2, "attempts": 1})
    backend.store.commit(step_commit(bumped, 1))

    head = backend.store.load_head("r1")
    assert head is not None
    assert (head.version, head.attempts, head.step) == (3, 0, 1)


def test_every_checkpoint_stays_readable(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    head = state
    for step in range(1, 8):
        commit = step_commit(head, step)
        backend.store.commit(commit)
        head = commit.head

    checkpoints = backend.store.list_checkpoints("r1")

    assert [c.step for c in checkpoints] == list(range(8))
    assert all(c.worker_id == "w" for c in checkpoints)


def test_a_step_record_leaves_out_what_its_row_says_and_reads_back_whole(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    commit = step_commit(state, 1)

    backend.store.commit(commit)

    # The row says the step; the key is `r1/step-1`; the output's step and tool are the step's
    # and the call's name: the record keeps none of them, and reads back with all of them.
    stored = json.loads(backend.record("r1", 2))
    assert not {"step", "key"} & stored.keys()
    assert stored["output"] == {"text": "ok"}
    assert backend.store.list_checkpoints("r1")[1].event == commit.checkpoint.event
    assert backend.store.load_head("r1") == commit.head


def test_step_records_stored_whole_read_as_they_always_did(backend):
    # Given a run whose step records an older Ratchet wrote whole, the row's fields and all
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    head = state
    for step in range(1, 8):
        commit = step_commit(head, step, text=f"copied batch {step}")
        backend.store.commit(commit)
        head = commit.head
    written = backend.store.list_checkpoints("r1")
    for record in written[1:]:
        whole = record.event.model_dump_json(exclude_none=True)
        assert '"key":"r1/step-' in whole
        backend.rewrite_record("r1", record.version, whole)

    # Then every reader sees them as written: the history, and the window of the head
    assert backend.store.list_checkpoints("r1") == written
    assert backend.store.load_head("r1") == head


def test_a_step_record_keeps_what_its_row_does_not_say(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    event = StepCompleted(
        step=1,
        key="elsewhere/step-1",
        call=ToolCall(name="write_row", arguments={"n": 1}),
        output=ToolOutput(step=1, tool="read_row", text="ok"),
        attempt=1,
        duration_ms=1.0,
    )
    commit = commit_of(state, event, step=1)

    backend.store.commit(commit)

    stored = json.loads(backend.record("r1", 2))
    assert (stored["key"], stored["output"]["tool"]) == ("elsewhere/step-1", "read_row")
    assert "step" not in stored["output"]
    assert backend.store.list_checkpoints("r1")[1].event == event
    assert backend.store.load_head("r1") == commit.head


def test_an_oversized_record_is_refused_before_anything_is_written(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)

    with pytest.raises(CheckpointTooLarge, match="bytes, over the"):
        backend.store.commit(step_commit(state, 1, text="x" * (MAX_ITEM_BYTES + 1)))

    assert backend.store.load_head("r1") == state
    assert len(backend.store.list_checkpoints("r1")) == 1


def test_list_runs_reports_each_run_once(backend):
    for run_id in ("a", "b"):
        backend.store.create_run(*new_run(run_id))

    runs = {r.run_id: r for r in backend.store.list_runs()}

    assert set(runs) == {"a", "b"}
    assert runs["a"].status == RunStatus.RUNNING


def test_runs_are_paged_newest_first_each_once_and_by_status(backend):
    base = utcnow() - timedelta(hours=1)
    # Twelve runs; "r03" and "r04" changed at the same moment (ordered by id), and "r07"'s
    # step makes it the newest.
    moments = {f"r{n:02d}": base + timedelta(seconds=n if n != 4 else 3) for n in range(12)}
    for run_id, moment in moments.items():
        state, created = new_run(run_id)
        state = state.model_copy(update={"updated_at": moment, "created_at": moment})
        backend.store.create_run(state, created)
    _write(backend, backend.store.load_head("r07"), "step")
    _write(backend, _write(backend, backend.store.load_head("r02"), "step"), "done")

    pages, cursor = [], None
    while True:
        page = backend.store.list_page(limit=5, after=cursor)
        pages.append([r.run_id for r in page])
        if len(page) < 5:
            break
        cursor = RunCursor(page[-1].updated_at, page[-1].run_id)
    listed = [run_id for page in pages for run_id in page]
    heads = {run_id: backend.store.load_head(run_id) for run_id in moments}
    assert listed == sorted(heads, key=lambda r: (heads[r].updated_at, r), reverse=True)
    assert listed[:2] == ["r02", "r07"]
    assert listed.index("r04") == listed.index("r03") - 1
    assert [len(p) for p in pages] == [5, 5, 2]
    assert [r.agent for r in backend.store.list_page(limit=1)] == ["fake"]
    done = backend.store.list_page(status=RunStatus.DONE.value, limit=5)
    assert [r.run_id for r in done] == ["r02"]
    running = backend.store.list_page(status=RunStatus.RUNNING.value, limit=20)
    assert [r.run_id for r in running] == [r for r in listed if r != "r02"]


# --- IdempotencyLedger -------------------------------------------------------------------------


def test_begin_records_the_decision_once_and_returns_it_on_retry(backend):
    first = backend.ledger.begin(entry())
    again = backend.ledger.begin(entry())

    assert first == again
    assert first.status is LedgerStatus.IN_PROGRESS
    assert first.decision == {"name": "write_row"}
    assert first.expires_at is not None
    assert first.expires_at > utcnow() + timedelta(days=1)


def test_the_same_key_with_other_arguments_is_refused(backend):
    backend.ledger.begin(entry())

    with pytest.raises(IdempotencyConflict):
        backend.ledger.begin(entry(args_hash="h2"))

    stored = backend.ledger.get("r1/step-1")
    assert stored is not None
    assert stored.args_hash == "h1"


def test_complete_records_the_result(backend):
    backend.ledger.begin(entry())

    backend.ledger.complete("r1/step-1", "copied 1000 rows")

    stored = backend.ledger.get("r1/step-1")
    assert stored is not None
    assert (stored.status, stored.result) == (LedgerStatus.COMPLETED, "copied 1000 rows")
    assert stored.decision is None
    assert backend.ledger.get("r1/step-2") is None


def test_a_completed_key_keeps_its_hash_for_a_late_begin(backend):
    # Given a step committed (its decision now only in its record)
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    backend.ledger.begin(entry())
    backend.store.commit(step_commit(state, 1))

    # When a worker that read an older head begins the same key
    late = backend.ledger.begin(entry())

    # Then it gets the completed entry back, with no decision to act on; another hash is
    # still refused
    assert (late.status, late.decision, late.args_hash) == (LedgerStatus.COMPLETED, None, "h1")
    with pytest.raises(IdempotencyConflict):
        backend.ledger.begin(entry(args_hash="h2"))


@pytest.mark.parametrize("name", [*sorted(BACKENDS), *sorted(SEALED_BACKENDS)])
def test_the_arguments_hash_is_sealed_with_a_codec_and_stored_as_given_without(
    name: str, tmp_path: Any
):
    # A call's arguments a reader could guess: with the plain hash stored, the guess is
    # confirmed by hashing it.
    guessed = hashlib.sha256(b'{"name":"refund","arguments":{"amount":120}}').hexdigest()
    for found in {**BACKENDS, **SEALED_BACKENDS}[name](tmp_path):
        found.ledger.begin(entry(args_hash=guessed))

        everything = json.dumps(found.everything(), default=str)
        assert (guessed in everything) is (name in BACKENDS)
        stored = found.ledger.get("r1/step-1")
        assert stored is not None
        assert stored.args_hash == guessed
        assert found.ledger.begin(entry(args_hash=guessed)).args_hash == guessed
        with pytest.raises(IdempotencyConflict):
            found.ledger.begin(entry(args_hash="h2"))


def call_start(by: str = "w1", seconds: float = 120.0) -> CallStart:
    return CallStart(at=utcnow(), seconds=seconds, by=by)


def test_start_call_marks_a_key_called_once_and_never_a_completed_one(backend):
    backend.ledger.begin(entry())
    backend.ledger.begin(entry("r1/step-2"))
    start = call_start()

    first = backend.ledger.start_call("r1/step-1", start)
    again = backend.ledger.start_call("r1/step-1", call_start(by="w2", seconds=5))
    backend.ledger.complete("r1/step-2", "done")

    assert (first, again) == (True, False)
    called = backend.ledger.get("r1/step-1")
    assert called is not None
    assert called.status is LedgerStatus.CALLED
    # The first start stands, as it was recorded, and the call has no result yet.
    assert (called.call, called.result) == (start, None)
    assert backend.ledger.start_call("r1/step-2", call_start()) is False
    completed = backend.ledger.get("r1/step-2")
    assert completed is not None
    assert completed.status is LedgerStatus.COMPLETED
    assert completed.call is None
    with pytest.raises(KeyError):
        backend.ledger.start_call("r1/step-9", call_start())


def test_a_called_key_completes_in_the_steps_commit(backend):
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    backend.ledger.begin(entry())
    backend.ledger.start_call("r1/step-1", call_start())

    backend.store.commit(step_commit(state, 1))

    completed = backend.ledger.get("r1/step-1")
    assert completed is not None
    assert completed.status is LedgerStatus.COMPLETED
    assert completed.call is None
    assert completed.result is not None


def test_release_attempt_takes_back_a_count_only_on_the_version_read(backend):
    # An attempt that found its step's at-most-once call may still be running gives its
    # count back (the step was not taken), only if nothing moved the run since it counted.
    state, checkpoint = new_run()
    backend.store.create_run(state, checkpoint)
    backend.store.begin_attempt("r1", 1)

    with pytest.raises(StaleVersion):
        backend.store.release_attempt("r1", 1)
    assert backend.store.release_attempt("r1", 2) == 3

    head = backend.store.load_head("r1")
    assert head is not None
    assert (head.version, head.attempts) == (3, 0)
    with pytest.raises(StaleVersion):
        backend.store.release_attempt("r1", 3)  # nothing left to take back


def _commit_event(backend, head: RunState, event, step: int) -> RunState:
    commit = commit_of(head, event, step=step)
    backend.store.commit(commit)
    return commit.head


@pytest.mark.parametrize("model_summary", [False, True], ids=["digest", "model-summary"])
def test_the_head_read_back_is_the_head_written_window_and_all(backend, model_summary):
    # The store writes only part of the head and reads its window back from the step records
    # (ratchet.stored): whatever the run did, what comes back must be what the fold made.
    options = RunState(run_id="w", agent="a", goal="g").options.model_copy(
        update={"memory_window": 3, "model_summary": model_summary}
    )
    state = RunState(run_id="w", agent="fake", goal="g" * 500, options=options)
    backend.store.create_run(
        state, new_run("w")[1].model_copy(update={"event": Created(state=state)})
    )
    head = backend.store.load_head("w")
    assert head == state.model_copy(update={"version": 1})
    for step in range(1, 12):
        wait = ApprovalRequest(prompt="ok?") if step == 7 else None
        memory = f"summary through {step - 3}" if model_summary and step % 3 == 0 else None
        event = StepCompleted(
            step=step,
            key=f"w/step-{step}",
            call=ToolCall(name="remember" if step == 2 else "write_row", arguments={"fact": "x"}),
            output=ToolOutput(
                step=step, tool="write_row", text="Remembered: x" if step == 2 else f"r{step}"
            ),
            wait=wait,
            attempt=1,
            duration_ms=1.0,
            memory=memory,
            memory_through=step - 3 if memory else None,
        )
        head = _commit_event(backend, head, event, step)
        if step == 7:
            head = _commit_event(backend, head, PersonDecided(approved=True, by="dana"), step)
        if step == 9:
            failed = AttemptFailed(step=10, attempt=1, error="boom", not_before=utcnow())
            head = _commit_event(backend, head, failed, step)
        assert backend.store.load_head("w") == head, step
    assert head.pinned == ["x"]
    assert [m.step for m in head.messages][-1] == 11


def test_a_fork_waiting_where_its_source_waited_reads_back_the_answer_it_is_given(backend):
    # A fork of a waiting run is created waiting, its window seeded from the source's: the
    # person's answer after its creation must be the asking step's result, read back as the
    # fold made it (issue 22: the window kept "Waiting for a person" and the run went on
    # as if nobody had approved).
    options = RunState(run_id="s", agent="a", goal="g").options.model_copy(
        update={"memory_window": 3}
    )
    source: RunState = RunState(run_id="s", agent="fake", goal="g", options=options)
    at = utcnow()
    for step in range(1, 5):
        wait = ApprovalRequest(prompt="drop it?") if step == 4 else None
        text = "Waiting for a person" if wait else f"r{step}"
        event = StepCompleted(
            step=step,
            key=f"s/step-{step}",
            call=ToolCall(name="write_row", arguments={"n": step}),
            output=ToolOutput(step=step, tool="write_row", text=text),
            wait=wait,
            attempt=1,
            duration_ms=1.0,
        )
        source = apply_event(source, event, version=source.version + 1, at=at)
    assert source.status is RunStatus.WAITING
    forked = source.model_copy(update={"run_id": "f", "version": 1})
    backend.store.create_run(
        forked,
        StoredCheckpoint(
            run_id="f",
            version=1,
            step=4,
            status=forked.status,
            worker_id="w",
            event=Created(state=forked),
        ),
    )
    head = backend.store.load_head("f")
    assert head == forked

    head = _commit_event(backend, head, PersonDecided(approved=True, by="dana"), 4)

    assert head.last_result == "Approved by dana."
    assert backend.store.load_head("f") == head
    after = StepCompleted(
        step=5,
        key="f/step-5",
        call=ToolCall(name="write_row", arguments={"n": 5}),
        output=ToolOutput(step=5, tool="write_row", text="r5"),
        attempt=1,
        duration_ms=1.0,
    )
    head = _commit_event(backend, head, after, 5)
    assert backend.store.load_head("f") == head
    assert [r.text for r in head.tool_results] == ["r3", "Approved by dana.", "r5"]


# --- list_runs after every kind of write -------------------------------------------------------
#
# `list_runs` reads what the store indexes apart from the head's state (SQLite's `runs.status`
# column, DynamoDB's head attributes), which the commit must keep in step: a run left waiting
# but listed as running is one no reader finds waiting, and no worker sees it finish.


def _step_event(head: RunState, *, waits: bool = False) -> StepCompleted:
    step = head.step + 1
    return StepCompleted(
        step=step,
        key=f"{head.run_id}/step-{step}",
        call=ToolCall(name="ask" if waits else "write_row", arguments={"n": step}),
        output=ToolOutput(step=step, tool="ask" if waits else "write_row", text=f"r{step}"),
        wait=ApprovalRequest(prompt="Drop the table?") if waits else None,
        attempt=1,
        duration_ms=1.0,
    )


def _failed_attempt(head: RunState) -> AttemptFailed:
    return AttemptFailed(step=head.step + 1, attempt=1, error="boom", not_before=utcnow())


WRITES: dict[str, Callable[[RunState], CheckpointEvent]] = {
    "step": lambda head: _step_event(head),
    "waiting step": lambda head: _step_event(head, waits=True),
    "decided": lambda head: PersonDecided(approved=True, by="dana"),
    "rejected": lambda head: PersonDecided(approved=False, by="dana", comment="no"),
    "attempt_failed": _failed_attempt,
    "done": lambda head: Finished(status=RunStatus.DONE, summary="copied"),
    "failed": lambda head: Finished(status=RunStatus.FAILED, error="three attempts failed"),
    "stopped": lambda head: Finished(status=RunStatus.STOPPED, summary="step cap"),
    "cancelled": lambda head: Finished(status=RunStatus.CANCELLED, summary="by dana"),
    "retried": lambda head: Retried(by="dana"),
}
"""Every kind of commit a run's head takes after it is created, by name (the head also takes
`begin_attempt`, which commits no event)."""

LIVES = {
    "asks-is-approved-and-finishes": ["step", "waiting step", "decided", "step", "done"],
    "asks-is-rejected-and-asks-again": ["waiting step", "rejected", "waiting step", "decided"],
    "fails-is-retried-and-goes-on": [
        "begin_attempt",
        "attempt_failed",
        "begin_attempt",
        "failed",
        "retried",
        "waiting step",
        "cancelled",
    ],
    "fails-an-attempt-then-waits": ["attempt_failed", "waiting step", "decided", "stopped"],
    "cancelled-while-running": ["step", "cancelled"],
    "retried-after-failing-while-waiting": ["waiting step", "failed", "retried"],
}


def _write(backend, head: RunState, kind: str) -> RunState:
    if kind == "begin_attempt":
        backend.store.begin_attempt(head.run_id, head.version)
    else:
        event = WRITES[kind](head)
        step = event.step if isinstance(event, StepCompleted) else head.step
        backend.store.commit(commit_of(head, event, step=step))
    written: RunState | None = backend.store.load_head(head.run_id)
    assert written is not None
    return written


def assert_listed(backend, heads: dict[str, RunState], after: str) -> None:
    """`list_runs` names every run once, as its head stands, and a status filter applied to it
    (as `Client.runs(status=...)` applies one) finds each run under its status only."""
    listed = backend.store.list_runs()
    assert sorted(r.run_id for r in listed) == sorted(heads), after
    summaries = {r.run_id: (RunStatus(r.status), r.step, r.version) for r in listed}
    assert summaries == {
        run_id: (head.status, head.step, head.version) for run_id, head in heads.items()
    }, f"after {after}"
    for status in RunStatus:
        assert sorted(r.run_id for r in listed if r.status == status) == sorted(
            run_id for run_id, head in heads.items() if head.status is status
        ), f"the runs listed as {status.value} after {after}"
        # A page of one status (DynamoDB: the runs index, whose keys each commit moves).
        paged = backend.store.list_page(status=status.value, limit=100)
        assert sorted(r.run_id for r in paged) == sorted(
            run_id for run_id, head in heads.items() if head.status is status
        ), f"the page of {status.value} runs after {after}"
    page = backend.store.list_page(limit=100)
    assert {
        r.run_id: (RunStatus(r.status), r.step, r.version, r.agent, r.updated_at) for r in page
    } == {
        run_id: (head.status, head.step, head.version, head.agent, head.updated_at)
        for run_id, head in heads.items()
    }, f"the page of every run after {after}"


@pytest.mark.parametrize("life", sorted(LIVES))
def test_list_runs_shows_each_run_as_its_head_stands_after_every_write(backend, life):
    # Another run, waiting, so that a filter has runs to leave out.
    other, other_created = new_run("other")
    backend.store.create_run(other, other_created)
    heads = {"other": _write(backend, backend.store.load_head("other"), "waiting step")}
    state, created = new_run("r1")
    backend.store.create_run(state, created)
    heads["r1"] = backend.store.load_head("r1")
    assert_listed(backend, heads, "create")

    for kind in LIVES[life]:
        heads["r1"] = _write(backend, heads["r1"], kind)
        assert_listed(backend, heads, kind)


@pytest.mark.parametrize("status", [RunStatus.WAITING, RunStatus.RUNNING])
def test_list_runs_shows_a_run_created_waiting_or_running_as_it_was_created(backend, status):
    # A fork of a run that still waits for a person is created waiting, at the source's step.
    source, source_created = new_run("source")
    backend.store.create_run(source, source_created)
    waiting = _write(backend, backend.store.load_head("source"), "waiting step")
    heads = {"source": waiting}
    fork = waiting.model_copy(
        update={"run_id": "fork", "version": 1, "status": status}
        | ({} if status is RunStatus.WAITING else {"waiting": None})
    )
    fork_created = StoredCheckpoint(
        run_id="fork",
        version=1,
        step=fork.step,
        status=fork.status,
        worker_id="w",
        event=Created(state=fork),
    )

    assert backend.store.create_run(fork, fork_created) is True

    heads["fork"] = backend.store.load_head("fork")
    assert heads["fork"].status is status
    assert_listed(backend, heads, "the fork's create")
    heads["fork"] = _write(
        backend, heads["fork"], "decided" if status is RunStatus.WAITING else "step"
    )
    assert_listed(backend, heads, "the fork's first commit")


def test_a_budgeted_runs_reservation_park_and_raise_are_kept_as_written(backend):
    # Given a run with a budget, its attempt counted
    state, created = new_run("b1")
    state = state.model_copy(update={"budget": Budget(usd=0.05)})
    created = created.model_copy(update={"event": Created(state=state)})
    assert backend.store.create_run(state, created)
    head = backend.store.load_head("b1")
    assert head is not None
    assert head.budget == Budget(usd=0.05)
    backend.store.begin_attempt("b1", head.version)
    head = backend.store.load_head("b1")
    assert head is not None

    # When the attempt reserves, finds no room for the next one, and a person raises it
    reserved = Reserved(step=1, attempt=1, usd=0.03, tokens=5000)
    backend.store.commit(commit_of(head, reserved, step=0))
    held = backend.store.load_head("b1")
    assert held is not None
    asked = BudgetAsked(
        step=1,
        request=ApprovalRequest(
            prompt="Spent $0.0300 of $0.0500 in 0 steps; the next step may cost up to "
            "$0.0300. Raise the budget?",
            details={"spent_usd": 0.03, "budget_usd": 0.05, "next_step_usd": 0.03},
            answer_schema={"type": "object", "properties": {"raise_usd": {"type": "number"}}},
            raises_budget=True,
        ),
    )
    backend.store.commit(commit_of(held, asked, step=0))
    parked = backend.store.load_head("b1")
    assert parked is not None
    raised = PersonDecided(approved=True, by="dana", answer={"raise_usd": 0.02})
    backend.store.commit(commit_of(parked, raised, step=0))

    # Then each head reads back as it was folded, and every record as it was written
    assert held.budget == Budget(usd=0.05, reserved_usd=0.03, reserved_tokens=5000)
    assert (parked.status, parked.attempts) == (RunStatus.WAITING, 0)
    assert parked.waiting is not None
    assert parked.waiting.request == asked.request
    assert parked.budget == held.budget
    final = backend.store.load_head("b1")
    assert final is not None
    assert final.status is RunStatus.RUNNING
    assert final.budget == Budget(usd=0.07, reserved_usd=0.03, reserved_tokens=5000)
    events = [c.event for c in backend.store.list_checkpoints("b1")]
    assert events[1:] == [reserved, asked, raised]
    assert [r.status for r in backend.store.list_runs() if r.run_id == "b1"] == ["running"]
