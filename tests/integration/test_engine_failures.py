"""Every way a step can fail is recorded on the run with its real cause; what no retry can fix
fails the run at once; a transient cause is marked so that a worker backs off."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from ratchet.adapters.scripted import ScriptedModel
from ratchet.engine import Binding, Engine, Outcome
from ratchet.errors import (
    TERMINAL_ERRORS,
    AgentSetupFailed,
    BlobCorrupt,
    CheckpointTooLarge,
    IdempotencyConflict,
    InjectedFault,
    ModelFailed,
    ModelOutputInvalid,
    PermanentError,
    RecordedDecisionInvalid,
    RunUnreadable,
    StepAttemptFailed,
    StepErrored,
    StoreBusy,
    ToolFailed,
    UnsupportedSchema,
    is_terminal,
    is_transient,
)
from ratchet.faults import FaultPlan
from ratchet.ports import BlobStore, CheckpointStore, Commit, CommitReceipt, StepView
from ratchet.state import (
    MAX_ATTEMPTS,
    AttemptFailed,
    BlobRef,
    Decision,
    Done,
    RunStatus,
    ToolCall,
)
from ratchet.tools import Agent, Policy, Tool, ToolContext, ToolResult, ask_person
from tests.support import LOG, Harness, StubModel


class Payload(BaseModel):
    text: str = ""


@dataclass
class CountingTool:
    """A tool that counts its calls and answers with what `answer` returns."""

    answer: Callable[[Payload, ToolContext], Any]
    calls: list[Payload] = field(default_factory=list)

    def __call__(self, args: Payload, ctx: ToolContext) -> Any:
        self.calls.append(args)
        return self.answer(args, ctx)


def call_once(arguments: dict[str, Any] | None = None) -> Policy:
    """Call `act` at step 1, then report DONE."""

    def policy(view: StepView) -> Decision:
        if view.step == 1:
            return ToolCall(name="act", arguments=arguments or {})
        return Done(summary="done")

    return policy


def engine_for(
    harness: Harness,
    tool: CountingTool,
    model: Any,
    *,
    store: CheckpointStore | None = None,
    blobs: BlobStore | None = None,
    faults: FaultPlan | None = None,
) -> Engine:
    agent = Agent(name="probe", tools=[Tool("act", "Act once.", Payload, tool)])
    binding = Binding(agent, model)
    return Engine(
        store=store or harness.store,
        ledger=harness.ledger,
        blobs=blobs or harness.blobs,
        bind=lambda state: binding,
        worker_id="w",
        logger=LOG,
        faults=faults or FaultPlan(),
    )


def recorded_failures(harness: Harness) -> list[AttemptFailed]:
    return [
        c.event for c in harness.store.list_checkpoints("run") if isinstance(c.event, AttemptFailed)
    ]


def _raise(error: BaseException) -> Callable[..., Any]:
    def fail(*_: Any) -> Any:
        raise error

    return fail


class NoBlobs:
    """A blob store on a disk that is full for now."""

    def put(self, data: bytes) -> BlobRef:
        raise OSError(errno.ENOSPC, "No space left on device")

    def get(self, ref: BlobRef) -> bytes:
        raise AssertionError("nothing was stored")


# Each: the tool's answer, the model (None: call the tool once), the error class raised, and
# what the recorded error must say.
FAILURES: dict[str, tuple[Callable[..., Any], Any, type[StepAttemptFailed], str]] = {
    "a tool raising": (
        _raise(TypeError("unsupported operand")),
        None,
        ToolFailed,
        "act raised TypeError: unsupported operand",
    ),
    # The tool's own SystemExit or Ctrl-C is its attempt's failure, never the worker's end.
    "a tool raising SystemExit": (
        _raise(SystemExit(7)),
        None,
        ToolFailed,
        "act raised SystemExit: 7",
    ),
    "a tool raising KeyboardInterrupt": (
        _raise(KeyboardInterrupt()),
        None,
        ToolFailed,
        "act raised KeyboardInterrupt",
    ),
    "a policy calling sys.exit": (
        lambda a, c: "ok",
        ScriptedModel(_raise(SystemExit("bye"))),
        ModelFailed,
        "the model raised SystemExit: bye",
    ),
    "a policy returning None": (
        lambda a, c: "ok",
        ScriptedModel(lambda view: None),  # type: ignore[arg-type, return-value]
        ModelOutputInvalid,
        "the model returned NoneType, not a ToolCall or Done",
    ),
    "a policy returning a string": (
        lambda a, c: "ok",
        ScriptedModel(lambda view: "DONE"),  # type: ignore[arg-type, return-value]
        ModelOutputInvalid,
        "the model returned str, not a ToolCall or Done",
    ),
    "a policy raising": (
        lambda a, c: "ok",
        ScriptedModel(_raise(KeyError("batches"))),
        ModelFailed,
        "the model raised KeyError: 'batches'",
    ),
    "a tool result that is not text": (
        lambda a, c: ToolResult(output=42),  # type: ignore[arg-type]
        None,
        ToolFailed,
        "act returned int, not text",
    ),
    "a lone surrogate in a tool's output": (
        lambda a, c: "half a pair: \ud800",
        None,
        ToolFailed,
        "act returned text that is not valid Unicode",
    ),
    "a lone surrogate in the model's arguments": (
        lambda a, c: "ok",
        ScriptedModel(call_once({"text": "\udcff"})),
        ModelOutputInvalid,
        "the model's answer is not valid Unicode",
    ),
    "an ask_person prompt of 400 KB": (
        lambda a, c: ask_person("p" * 400_000),
        None,
        ToolFailed,
        "act asked a person with a request of 400,",
    ),
}


@pytest.mark.parametrize("kind", list(FAILURES))
def test_each_failure_is_an_attempt_failed_record_with_its_real_cause(tmp_path, kind):
    answer, model, error_type, cause = FAILURES[kind]
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    engine = engine_for(harness, CountingTool(answer), model or ScriptedModel(call_once()))

    # Twice: a failed attempt each time, recorded with its cause
    for attempt in (1, 2):
        with pytest.raises(error_type) as raised:
            engine.advance("run")
        assert cause in str(raised.value)
        failures = recorded_failures(harness)
        assert [f.attempt for f in failures] == list(range(1, attempt + 1))
        assert cause in failures[-1].error
        head = engine.load("run")
        assert (head.status, head.step, head.attempts) == (RunStatus.RUNNING, 0, attempt)
        assert cause in (head.error or "")
        assert "the worker died" not in (head.error or "")

    # The third fails the run, with the same cause
    assert engine.advance("run").outcome is Outcome.FAILED
    error = engine.load("run").error or ""
    assert error.startswith(f"step 1 failed {MAX_ATTEMPTS} times; last error: ")
    assert cause in error


def test_hooks_that_raise_are_recorded_with_their_cause(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()

    def broken(state: object) -> Binding:
        raise PermissionError("notes.db is read-only")

    engine = Engine(
        store=harness.store,
        ledger=harness.ledger,
        blobs=harness.blobs,
        bind=broken,
        worker_id="w",
        logger=LOG,
    )

    with pytest.raises(AgentSetupFailed, match=r"PermissionError: notes\.db is read-only"):
        engine.advance("run")

    assert "PermissionError: notes.db is read-only" in recorded_failures(harness)[0].error


def test_an_injected_fault_stays_a_crash_and_is_not_recorded(tmp_path):
    # RATCHET_FAULT=raise stands for the process dying: nothing may record it.
    harness = Harness(tmp_path, StubModel(total=2))
    harness.start()
    tool = CountingTool(lambda a, c: "ok")
    engine = engine_for(
        harness, tool, ScriptedModel(call_once()), faults=FaultPlan.parse("raise:after_tool@1")
    )

    with pytest.raises(InjectedFault):
        engine.advance("run")

    assert recorded_failures(harness) == []
    assert engine.load("run").error is None


# --- errors no retry can fix -----------------------------------------------------------------


class CommitRefused:
    """A checkpoint store whose step commits raise `error` (the rest goes through)."""

    def __init__(self, inner: CheckpointStore, error: Exception, times: int = 1_000) -> None:
        self._inner = inner
        self._error = error
        self._times = times

    def commit(self, commit: Commit) -> CommitReceipt:
        if commit.checkpoint.event.kind == "step" and self._times > 0:
            self._times -= 1
            raise self._error
        return self._inner.commit(commit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_checkpoint_too_large_fails_the_run_at_once_with_the_tool_run_once(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    tool = CountingTool(lambda a, c: "ok")
    too_large = CheckpointTooLarge("run run head", 400_000, 358_400)
    store = CommitRefused(harness.store, too_large)
    engine = engine_for(harness, tool, ScriptedModel(call_once()), store=store)

    outcome = engine.advance("run")

    assert outcome.outcome is Outcome.FAILED
    head = engine.load("run")
    assert head.status is RunStatus.FAILED
    assert head.error == (
        f"step 1 failed and cannot succeed on retry: CheckpointTooLarge: {too_large}"
    )
    assert len(tool.calls) == 1
    assert recorded_failures(harness) == []
    assert engine.advance("run").outcome is Outcome.FAILED
    assert len(tool.calls) == 1


def test_a_tool_reporting_an_idempotency_conflict_fails_the_run_at_once(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    tool = CountingTool(_raise(IdempotencyConflict("run/step-1")))
    engine = engine_for(harness, tool, ScriptedModel(call_once()))

    assert engine.advance("run").outcome is Outcome.FAILED

    error = engine.load("run").error or ""
    assert error.startswith("step 1 failed and cannot succeed on retry: IdempotencyConflict:")
    assert len(tool.calls) == 1


@pytest.mark.parametrize(
    ("damage", "named"), [("altered", "BlobCorrupt"), ("removed", "BlobMissing")]
)
def test_tampered_arguments_kept_by_reference_fail_the_run_and_never_reach_the_tool(
    tmp_path, damage, named
):
    # Given a step whose large arguments were recorded by reference, then altered or removed
    # on disk (one rule for both: the run fails at once, without the two retries)
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    tool = CountingTool(lambda a, c: "ok")
    big = {"text": "a" * 10_000}
    engine = engine_for(
        harness,
        tool,
        ScriptedModel(call_once(big)),
        faults=FaultPlan.parse("raise:after_decision@1"),
    )
    with pytest.raises(InjectedFault):
        engine.advance("run")
    entry = harness.ledger.get("run/step-1")
    assert entry is not None
    assert entry.decision is not None
    ref = BlobRef.model_validate(entry.decision["blob"])
    stored = tmp_path / "blobs" / ref.sha256[:2] / ref.sha256
    if damage == "altered":
        stored.write_text(json.dumps({"text": "b" * 10_000}))
    else:
        stored.unlink()

    # When a fresh engine retries the step
    outcome = engine_for(harness, tool, ScriptedModel(call_once(big))).advance("run")

    # Then the run fails at once, and the tool never saw arguments other than the recorded ones
    assert outcome.outcome is Outcome.FAILED
    error = engine.load("run").error or ""
    assert error.startswith(f"step 1 failed and cannot succeed on retry: {named}:")
    assert ref.sha256 in error
    assert tool.calls == []


def test_a_head_that_does_not_parse_is_reported_unreadable(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    harness.db.connection.execute("UPDATE runs SET state = 'not json' WHERE run_id = 'run'")

    with pytest.raises(RunUnreadable, match="run 'run' cannot be read"):
        harness.engine.advance("run")


def test_the_terminal_errors_are_those_no_retry_can_fix():
    assert set(TERMINAL_ERRORS) == {
        CheckpointTooLarge,
        IdempotencyConflict,
        UnsupportedSchema,
        RunUnreadable,
        BlobCorrupt,
        PermanentError,
        RecordedDecisionInvalid,
    }
    wrapped = ToolFailed("act raised BlobCorrupt")
    wrapped.__cause__ = BlobCorrupt("ab" * 32, "here")
    assert is_terminal(wrapped)
    assert not is_terminal(ToolFailed("act raised ValueError"))
    assert not is_terminal(None)


# --- transient causes ------------------------------------------------------------------------


def test_a_busy_store_at_commit_is_a_transient_failed_attempt_and_the_retry_succeeds(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    tool = CountingTool(lambda a, c: "ok")
    store = CommitRefused(harness.store, StoreBusy("database is locked"), times=1)
    engine = engine_for(harness, tool, ScriptedModel(call_once()), store=store)

    with pytest.raises(StepErrored) as raised:
        engine.advance("run")

    assert raised.value.transient
    assert str(raised.value) == "step 1 could not be committed: StoreBusy: database is locked"
    assert [f.error for f in recorded_failures(harness)] == [str(raised.value)]
    assert engine.advance("run").outcome is Outcome.CONTINUE
    assert engine.advance("run").outcome is Outcome.DONE


def test_a_full_disk_for_a_large_output_is_a_transient_failed_attempt(tmp_path):
    harness = Harness(tmp_path, StubModel(total=1))
    harness.start()
    tool = CountingTool(lambda a, c: "x" * 10_000)
    engine = engine_for(harness, tool, ScriptedModel(call_once()), blobs=NoBlobs())

    with pytest.raises(StepErrored, match=r"OSError: \[Errno 28\] No space left") as raised:
        engine.advance("run")

    assert raised.value.transient
    assert "No space left on device" in recorded_failures(harness)[0].error


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (StoreBusy("throttled"), True),
        (ConnectionResetError("reset by peer"), True),
        (TimeoutError("read timed out"), True),
        (OSError(errno.EIO, "I/O error"), True),
        (OSError(errno.ENOENT, "no such file"), False),
        (TypeError("bad operand"), False),
        (ModelOutputInvalid("neither a tool call nor DONE"), False),
    ],
)
def test_transient_causes_are_told_apart(error, transient):
    wrapped = ToolFailed(f"act raised {error}")
    wrapped.__cause__ = error

    assert is_transient(error) is transient
    assert is_transient(wrapped) is transient


def test_a_model_rate_limit_is_transient():
    from ratchet.errors import ModelUnavailable

    assert ModelUnavailable("429").transient
    assert not ModelOutputInvalid("neither a tool call nor DONE").transient
