"""The step engine: advances a run by exactly one step, then commits it.

It knows nothing of processes, Lambda or Step Functions. Whoever drives it (a local worker, the
step Lambda) calls `advance(run_id)` and acts on the outcome. The order inside a step is what
makes a crash at any point cost at most that step and never repeat a side effect:

1. load the head; stop rules (not running, step cap, third strike);
2. count the attempt, durably, before any work;
3. decide: reuse the decision recorded under the step's key, or call the model once and record
   it before acting;
4. act: run the one tool with the key `<run_id>/step-<n>`;
5. commit the step record and the new head in one write, conditional on the version read.

Whatever fails in 3-5 is recorded on the run with its cause (an `attempt_failed` checkpoint)
and raised as a `StepAttemptFailed`, except what cannot succeed on retry (`TERMINAL_ERRORS`),
which fails the run at once, and an `InjectedFault`, which stands for the process dying and so
is left unrecorded, as a real crash would be. The agent's own code (its hooks, the model call,
the tool) runs on a thread of its own under the agent's step time limit (what it raises there,
`SystemExit` and `KeyboardInterrupt` too, is the attempt's failure); a step over it is
abandoned, and since only the calling thread commits, whatever the abandoned code returns later
is never written. Python cannot stop the abandoned call, so this process fences it off: the
run's next attempt waits for it before running the agent's code again, and the run is not
failed while it runs (`AbandonedCallRunning`). Tool arguments, outputs and summaries over
`INLINE_BYTES` are kept by reference to the blob store, so no record grows with what the agent
passes around.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import random
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import ValidationError

from ratchet.engine import memory
from ratchet.engine.backoff import DEFAULT_BACKOFF, Backoff
from ratchet.engine.prompt import render_step_prompt, render_summary_prompt
from ratchet.engine.transitions import apply_event
from ratchet.errors import (
    TERMINAL_ERRORS,
    AbandonedCallRunning,
    AgentSetupFailed,
    IdempotencyConflict,
    InjectedFault,
    ModelFailed,
    ModelOutputInvalid,
    NotCancellable,
    NotRetryable,
    NotWaiting,
    RecordedDecisionInvalid,
    RunNotFound,
    RunUnreadable,
    StaleVersion,
    StepAttemptFailed,
    StepErrored,
    StepTimedOut,
    ToolFailed,
    is_terminal,
    is_transient,
)
from ratchet.faults import NO_FAULTS, FaultPlan, FaultPoint
from ratchet.ports import (
    BlobStore,
    CheckpointStore,
    Commit,
    IdempotencyLedger,
    LedgerCompletion,
    LedgerEntry,
    Model,
    ModelReply,
    ModelRequest,
    StepView,
    ToolSpec,
)
from ratchet.state import (
    INLINE_BYTES,
    MAX_APPROVAL_REQUEST_BYTES,
    MAX_ATTEMPTS,
    MAX_ERROR_CHARS,
    MAX_SUMMARY_CHARS,
    PREVIEW_CHARS,
    ApprovalRequest,
    AttemptFailed,
    BlobRef,
    Checkpoint,
    CheckpointEvent,
    Created,
    Decision,
    Done,
    Finished,
    PersonDecided,
    Retried,
    RunState,
    RunStatus,
    StepCompleted,
    ToolCall,
    ToolOutput,
    Usage,
    idempotency_key,
    utcnow,
)
from ratchet.tools import MAX_STEP_TIMEOUT_SECONDS, Agent, ToolContext, ToolResult

INLINE_OUTPUT_BYTES = INLINE_BYTES
"""Tool output up to this size is kept in the step record; larger output goes to a blob."""

ARGUMENT_PREVIEW_VALUE_BYTES = 80
"""In the preview of arguments kept by reference, a value whose JSON is up to this size is kept
as it is (a batch number, a flag); a larger one is replaced by its size."""
ARGUMENT_PREVIEW_KEYS = 12
"""At most this many argument names are kept in a preview; the rest are counted."""

ABANDONED_GRACE_SECONDS = 30.0
"""Before failing a run by its strikes, how long the engine waits for a call of the run that
this process abandoned at a step deadline to end (see `AbandonedCallRunning`)."""

T = TypeVar("T")


class Outcome(StrEnum):
    CONTINUE = "continue"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"


_OUTCOME_OF_STATUS = {
    RunStatus.RUNNING: Outcome.CONTINUE,
    RunStatus.WAITING: Outcome.WAITING,
    RunStatus.DONE: Outcome.DONE,
    RunStatus.FAILED: Outcome.FAILED,
    RunStatus.STOPPED: Outcome.STOPPED,
    RunStatus.CANCELLED: Outcome.CANCELLED,
}


@dataclass(frozen=True)
class Folded:
    """The model's new running summary, covering the steps up to `through`."""

    summary: str
    through: int
    usage: Usage | None


@dataclass(frozen=True)
class StepOutcome:
    outcome: Outcome
    run_id: str
    step: int
    version: int
    bytes_written: int = 0
    """What the step's checkpoint commit wrote (head, record, ledger); 0 if nothing was."""
    head: RunState | None = field(default=None, compare=False, repr=False)
    """The head the step left, as committed (what a reader of the store would load)."""

    @classmethod
    def of(cls, state: RunState, *, bytes_written: int = 0) -> StepOutcome:
        return cls(
            _OUTCOME_OF_STATUS[state.status],
            state.run_id,
            state.step,
            state.version,
            bytes_written,
            state,
        )


@dataclass(frozen=True)
class Binding:
    """What one run needs to take a step: its agent's tools, a model, and opened resources."""

    agent: Agent
    model: Model
    resources: Any = None


Binder = Callable[[RunState], Binding]


class Engine:
    def __init__(
        self,
        *,
        store: CheckpointStore,
        ledger: IdempotencyLedger,
        blobs: BlobStore,
        bind: Binder,
        unbind: Callable[[str], None] | None = None,
        worker_id: str,
        logger: logging.Logger | Any,
        faults: FaultPlan = NO_FAULTS,
        sleep: Callable[[float], None] = time.sleep,
        backoff: Backoff = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
        clock: Callable[[], datetime] = utcnow,
        abandoned_grace_seconds: float = ABANDONED_GRACE_SECONDS,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._blobs = blobs
        self._bind = bind
        self._unbind = unbind
        self._worker_id = worker_id
        self._log = logger
        self._faults = faults
        self._sleep = sleep
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._clock = clock
        self._abandoned_grace = abandoned_grace_seconds
        self._counted_ahead: dict[str, int] = {}

    @property
    def worker_id(self) -> str:
        return self._worker_id

    def abandoned_call_running(self, run_id: str) -> bool:
        """Whether a call of the run's agent that this process abandoned at a step deadline
        is still running (a worker keeps the run's lease until it ends, or the process does)."""
        return bool(_ABANDONED.running(run_id))

    # --- runs ------------------------------------------------------------------------------

    def start(self, state: RunState) -> bool:
        """Create the run at version 1. False (and nothing written) if the id is taken."""
        state = state.model_copy(update={"version": 1})
        checkpoint = Checkpoint(
            run_id=state.run_id,
            version=1,
            # A fork starts at its source's step: its window's reads find the record there.
            step=state.step,
            status=state.status,
            worker_id=self._worker_id,
            event=Created(state=state),
        )
        return self._store.create_run(state, checkpoint)

    def load(self, run_id: str) -> RunState:
        """The run's head. Raises `RunNotFound`, `UnsupportedSchema` (a newer Ratchet wrote
        it) or `RunUnreadable` (it does not parse): the last two are never worth a retry."""
        try:
            state = self._store.load_head(run_id)
        except ValueError as error:  # a head that is not JSON, or not a RunState
            raise RunUnreadable(run_id, _describe(error)) from error
        if state is None:
            raise RunNotFound(run_id)
        return state

    def advance(self, run_id: str, *, count_next_attempt: bool = False) -> StepOutcome:
        """Take exactly one step of the run (or apply a stop rule) and commit it.

        Raises `StaleVersion` if another worker moved the run meanwhile (nothing was written),
        and `StepAttemptFailed` (a subclass naming what failed, with `transient` set when a
        worker should back off) after recording a failed attempt that may be retried. A
        failure no retry can fix (`TERMINAL_ERRORS`) and the third failed attempt are not
        raised: the run is failed with the cause and the outcome returned. A head that cannot
        be read raises `UnsupportedSchema` or `RunUnreadable`; retrying those is pointless.

        With `count_next_attempt`, a caller that goes straight on to the next step (a worker's
        loop) has the step's commit count the next step's first attempt too, which saves the
        next step a durable write. The caller must `release` the run if it stops before that
        step, or the count would stand for an attempt that never started.
        """
        state = self.load(run_id)
        if state.status is not RunStatus.RUNNING:
            return StepOutcome.of(state)
        step = state.next_step
        if state.step >= state.options.max_steps:
            summary = (
                f"Stopped at the step cap of {state.options.max_steps} steps before the goal "
                "was reported done."
            )
            return self._finish(state, Finished(status=RunStatus.STOPPED, summary=summary))
        # Only this engine can have written the version it counted ahead for: if the head is
        # still at it, the attempt is already on record, and nobody else has touched the run.
        if self._counted_ahead.pop(run_id, None) != state.version:
            if state.attempts >= MAX_ATTEMPTS:
                last = state.error or "the worker died during the step"
                error = f"step {step} failed {state.attempts} times; last error: {last}"
                return self._fail_run(state, Finished(status=RunStatus.FAILED, error=error))
            version = self._store.begin_attempt(run_id, state.version)
            state = state.model_copy(update={"version": version, "attempts": state.attempts + 1})
        started = time.perf_counter()
        try:
            decision, output, wait, usage, folded = self._attempt(state)
        except (StaleVersion, InjectedFault):
            raise
        except Exception as error:
            return self._record_failure(state, _attempt_failure(error, f"step {step} failed"))
        self._faults.hit(FaultPoint.BEFORE_COMMIT, step)
        try:
            head, written, event = self._commit_step(
                state, decision, output, wait, count_next_attempt, started, usage, folded
            )
        except (StaleVersion, InjectedFault):
            raise
        except Exception as error:
            failure = _attempt_failure(error, f"step {step} could not be committed")
            return self._record_failure(state, _paid_for(failure, usage))
        if isinstance(event, StepCompleted) and event.next_attempt_counted:
            self._counted_ahead[run_id] = head.version
        self._faults.hit(FaultPoint.AFTER_COMMIT, step)
        return StepOutcome.of(head, bytes_written=written)

    def step_timeout(self, state: RunState) -> float | None:
        """The time limit, in seconds, of one step of this run's agent (`None`: no limit).
        Whatever drives the engine must allow a step at least this long plus the engine's own
        reads and writes; `MAX_STEP_TIMEOUT_SECONDS` bounds it for every agent."""
        return self._bound(
            state, time.monotonic() + MAX_STEP_TIMEOUT_SECONDS
        ).agent.step_timeout_seconds

    def _commit_step(
        self,
        state: RunState,
        decision: Decision,
        output: ToolOutput | None,
        wait: ApprovalRequest | None,
        count_next_attempt: bool,
        started: float,
        usage: Usage | None,
        folded: Folded | None = None,
    ) -> tuple[RunState, int, CheckpointEvent]:
        step = state.next_step
        key = idempotency_key(state.run_id, step)
        if isinstance(decision, Done):
            finished = Finished(
                status=RunStatus.DONE,
                summary=decision.summary,
                attempts=state.attempts,
                usage=usage,
            )
            head, written = self._commit(
                state, finished, step=state.step, completes=LedgerCompletion(key, "DONE")
            )
            return head, written, finished
        assert output is not None
        event = StepCompleted(
            step=step,
            key=key,
            call=decision,
            output=output,
            wait=wait,
            next_attempt_counted=count_next_attempt
            and wait is None
            and step < state.options.max_steps,
            attempt=state.attempts,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
            usage=usage,
            memory=folded.summary if folded else None,
            memory_through=folded.through if folded else None,
        )
        head, written = self._commit(
            state, event, step=step, completes=LedgerCompletion(key, result_digest(output.text))
        )
        return head, written, event

    def release(self, run_id: str) -> None:
        """Take back the next attempt counted ahead by `advance`, if the run is still as this
        engine left it. Call it when a worker stops working on a run."""
        version = self._counted_ahead.pop(run_id, None)
        if version is None:
            return
        # If another worker has moved the run on since, the count is theirs to keep.
        with suppress(StaleVersion):
            self._store.release_attempt(run_id, version)

    def fail(self, run_id: str, reason: str) -> RunState:
        """Mark the run failed, keeping its last checkpoint (a supervisor gave up on it).
        A run that has already finished is left as it is."""
        state = self.load(run_id)
        if state.is_finished:
            return state
        head, _ = self._commit(
            state,
            Finished(status=RunStatus.FAILED, error=_cut(reason), attempts=state.attempts),
            step=state.step,
        )
        return head

    def retry(self, run_id: str, *, by: str) -> RunState:
        """Give a failed run a fresh set of attempts at the step that failed, from its last
        checkpoint: recorded decisions and applied keys are honoured as on any resume."""
        state = self.load(run_id)
        if state.status is not RunStatus.FAILED:
            raise NotRetryable(run_id, state.status)
        head, _ = self._commit(state, Retried(by=by), step=state.step)
        return head

    def cancel(self, run_id: str, *, by: str, reason: str = "") -> RunState:
        """End a running or waiting run as `cancelled`, keeping its checkpoints. A step that
        is under way elsewhere finds the run cancelled when it commits (a stale version)."""
        state = self.load(run_id)
        if state.is_finished:
            raise NotCancellable(run_id, state.status)
        summary = f"Cancelled by {by}" + (f": {reason}" if reason else ".")
        finished = Finished(status=RunStatus.CANCELLED, summary=_cut(summary))
        head, _ = self._commit(state, finished, step=state.step)
        return head

    def decide_waiting(
        self, run: str | RunState, decision: PersonDecided, *, step: int | None = None
    ) -> RunState:
        """Record a person's decision on a waiting run; the run becomes runnable again.
        `run` is the run's id, or its head as the caller read it: the commit is conditional
        on the version read, so with `step` (only if the run waits at that step) the check
        and the decision are one, and a head that moved since is a `StaleVersion`. The
        decision is recorded as given: the approval desk checks its answer against the
        request's schema."""
        state = self.load(run) if isinstance(run, str) else run
        if state.status is not RunStatus.WAITING or (step is not None and state.step != step):
            raise NotWaiting(state.run_id, state.status)
        head, _ = self._commit(state, decision, step=state.step)
        return head

    # --- one step --------------------------------------------------------------------------

    def _attempt(
        self, state: RunState
    ) -> tuple[Decision, ToolOutput | None, ApprovalRequest | None, Usage | None, Folded | None]:
        """Decide and act: what the step's commit records. The agent's code runs under the
        agent's time limit, counted from the start of the attempt."""
        started = time.monotonic()
        binding = self._bound(state, started + MAX_STEP_TIMEOUT_SECONDS)
        limit = binding.agent.step_timeout_seconds
        clock = _StepClock(
            state.run_id, state.next_step, limit, None if limit is None else started + limit
        )
        clock.wait_for_abandoned()
        decision, usage = self._decide(state, binding, clock)
        if isinstance(decision, Done):
            return decision, None, None, usage, None
        try:
            output, wait = self._act(state, binding, decision, clock)
            folded = self._summarise(state, binding, clock)
        except (StaleVersion, InjectedFault):
            raise
        except Exception as error:
            failure = _paid_for(_attempt_failure(error, f"step {state.next_step} failed"), usage)
            if failure is error:
                raise
            raise failure from error
        if folded is not None:
            usage = _added(usage, folded.usage)
        return decision, output, wait, usage, folded

    def _bound(self, state: RunState, deadline: float) -> Binding:
        clock = _StepClock(state.run_id, state.next_step, MAX_STEP_TIMEOUT_SECONDS, deadline)
        try:
            return clock.run(lambda: self._bind(state), f"setting up agent {state.agent!r}")
        except StepTimedOut:
            raise
        except Exception as error:  # the agent's own hooks run here: any failure is this attempt's
            raise AgentSetupFailed(
                f"cannot set up agent {state.agent!r} for the step: {_describe(error)}",
                transient=is_transient(error),
            ) from error

    def _decide(
        self, state: RunState, binding: Binding, clock: _StepClock
    ) -> tuple[Decision, Usage | None]:
        """The step's decision, and what the model call cost (None: the decision recorded by
        an earlier attempt is reused, and no model is called)."""
        step = state.next_step
        key = idempotency_key(state.run_id, step)
        recorded = self._ledger.get(key)
        usage: Usage | None = None
        if recorded is None:
            self._faults.hit(FaultPoint.BEFORE_MODEL, step)
            view, prompt = step_prompt(state)
            self._log.debug(
                "model called",
                extra={"run_id": state.run_id, "step": step, "worker_id": self._worker_id},
            )
            answer, usage = _ask(
                binding,
                clock,
                prompt=prompt,
                tools=memory.tool_specs(binding.agent),
                view=view,
                doing="in the model call",
            )
            try:
                decision = _validated(answer, binding.agent)
            except StepAttemptFailed as invalid:
                _paid_for(invalid, usage)
                raise
            self._faults.hit(FaultPoint.AFTER_MODEL, step)
            payload = _payload(decision)
            entry = LedgerEntry(
                key=key,
                run_id=state.run_id,
                step=step,
                # The hash is of the full decision, so the same key with other arguments is
                # refused even when both are kept by reference.
                args_hash=_hash(payload),
                decision=_payload(self._by_reference(decision)),
            )
            try:
                recorded = self._ledger.begin(entry)
            except IdempotencyConflict as conflict:
                # Another worker decided this step first (our lease lapsed mid-call): its
                # decision stands, and our version is stale. Stop without acting.
                raise StaleVersion(state.run_id, state.version) from conflict
        else:
            self._log.debug(
                "decision reused",
                extra={"run_id": state.run_id, "step": step, "worker_id": self._worker_id},
            )
        self._faults.hit(FaultPoint.AFTER_DECISION, step)
        return _decision_from(recorded.decision), usage

    def _by_reference(self, decision: Decision) -> Decision:
        """The decision as every record keeps it: large arguments or a large summary go to the
        blob store, and the record holds a preview and the reference."""
        if isinstance(decision, Done):
            data = decision.summary.encode("utf-8")
            if len(data) <= INLINE_BYTES:
                return decision
            blob = self._blobs.put(data)
            return Done(summary=_text_preview(decision.summary, blob))
        data = _canonical(decision.arguments).encode("utf-8")
        if len(data) <= INLINE_BYTES:
            return decision
        blob = self._blobs.put(data)
        return ToolCall(
            name=decision.name, arguments=_arguments_preview(decision.arguments), blob=blob
        )

    def _arguments_of(self, call: ToolCall) -> dict[str, Any]:
        if call.blob is None:
            return call.arguments
        # The blob store checks the bytes against their SHA-256 (`BlobCorrupt` otherwise).
        arguments = json.loads(self._blobs.get(call.blob))
        if not isinstance(arguments, dict):
            raise ValueError(f"the arguments blob {call.blob.sha256} does not hold an object")
        return arguments

    def _summarise(self, state: RunState, binding: Binding, clock: _StepClock) -> Folded | None:
        """With `model_summary`, when this step's commit would leave twice `memory_window`
        steps in the window: the model's summary of the oldest ones, to record in the step's
        record (so it is written once, and a replay reads it back)."""
        through = memory.summarise_through(state)
        if through is None:
            return None
        view = view_of(state).model_copy(update={"task": "summarise", "summarise_through": through})
        decision, usage = _ask(
            binding,
            clock,
            prompt=render_summary_prompt(view, limit=MAX_SUMMARY_CHARS),
            tools=[],
            view=view,
            doing="summarising the window",
            during=" while summarising",
        )
        if not isinstance(decision, Done) or not decision.summary.strip():
            refused = ModelOutputInvalid(
                "asked for a summary of the oldest steps, the model gave none"
            )
            raise _paid_for(refused, usage)
        return Folded(decision.summary.strip()[:MAX_SUMMARY_CHARS], through, usage)

    def _act(
        self, state: RunState, binding: Binding, call: ToolCall, clock: _StepClock
    ) -> tuple[ToolOutput, ApprovalRequest | None]:
        step = state.next_step
        tool = binding.agent.tool_named(call.name)
        if tool is None and call.name == memory.REMEMBER and memory.offers_remember(binding.agent):
            try:
                pinned = memory.remember(state, self._arguments_of(call))
            except ValidationError as error:
                raise RecordedDecisionInvalid(f"recorded fact no longer fits: {error}") from None
            return ToolOutput(step=step, tool=memory.REMEMBER, text=pinned), None
        if tool is None:
            raise RecordedDecisionInvalid(
                f"step {step} asks for tool {call.name!r}, which this agent lacks"
            )
        try:
            args = tool.parse(self._arguments_of(call))
        except ValidationError as error:
            raise RecordedDecisionInvalid(
                f"recorded arguments no longer fit {tool.name}: {error}"
            ) from None
        context = ToolContext(
            run_id=state.run_id,
            step=step,
            idempotency_key=idempotency_key(state.run_id, step),
            attempt=state.attempts,
            resources=binding.resources,
        )

        def run_tool() -> ToolResult:
            if state.options.tool_latency_ms:
                self._sleep(state.options.tool_latency_ms / 1000)
            return tool(args, context)

        try:
            result = clock.run(run_tool, f"in tool {tool.name}")
        except StepTimedOut:
            raise
        except Exception as error:  # user code: any failure is this attempt's failure
            raise ToolFailed(
                f"{tool.name} raised {_describe(error)}", transient=is_transient(error)
            ) from error
        self._faults.hit(FaultPoint.AFTER_TOOL, step)
        return self._output(step, tool.name, result), _approval_request(tool.name, result)

    def _output(self, step: int, tool: str, result: object) -> ToolOutput:
        text = result.output if isinstance(result, ToolResult) else result
        if not isinstance(text, str):
            raise ToolFailed(f"{tool} returned {type(text).__name__}, not text")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ToolFailed(f"{tool} returned text that is not valid Unicode: {error}") from None
        if len(data) <= INLINE_OUTPUT_BYTES:
            return ToolOutput(step=step, tool=tool, text=text)
        blob = self._blobs.put(data)
        preview = text[:PREVIEW_CHARS] + f"… [{len(data):,} bytes in blob {blob.sha256[:12]}]"
        return ToolOutput(step=step, tool=tool, text=preview, blob=blob)

    # --- commits ---------------------------------------------------------------------------

    def _record_failure(self, state: RunState, error: StepAttemptFailed) -> StepOutcome:
        """Record a failed attempt and raise it; or, if no retry can help (or this was the
        third attempt), fail the run and return the outcome."""
        step = state.next_step
        if isinstance(error, StepTimedOut) and self._unbind is not None:
            # The abandoned step may still be using the run's resources: the next attempt
            # gets its own.
            self._unbind(state.run_id)
        self._log.warning(
            "step attempt failed",
            extra={
                "run_id": state.run_id,
                "step": step,
                "attempt": state.attempts,
                "worker_id": self._worker_id,
                "error": str(error),
                "error_type": type(error).__name__,
                "transient": error.transient,
            },
        )
        # What the attempt's model call used before it failed counts, in the record either way.
        if is_terminal(error):
            cause = _terminal_cause(error)
            message = f"step {step} failed and cannot succeed on retry: {_describe(cause)}"
            failed_run = Finished(status=RunStatus.FAILED, error=_cut(message), usage=error.usage)
            return self._fail_run(state, failed_run)
        if state.attempts >= MAX_ATTEMPTS:
            message = f"step {step} failed {state.attempts} times; last error: {error}"
            failed_run = Finished(status=RunStatus.FAILED, error=_cut(message), usage=error.usage)
            return self._fail_run(state, failed_run)
        # The head says when the next attempt may start. A local worker waits until then; on
        # AWS the state machine's Retry (the same figures, its own draw) decides, and an
        # attempt that comes earlier is not refused.
        delay = self._backoff.delay(state.attempts, self._rng)
        not_before = self._clock() + timedelta(seconds=delay)
        failed = AttemptFailed(
            step=step,
            attempt=state.attempts,
            error=_cut(str(error)),
            not_before=not_before,
            usage=error.usage,
        )
        try:
            self._commit(state, failed, step=state.step)
            error.not_before = not_before
        except (StaleVersion, InjectedFault):
            raise
        except Exception as unrecorded:
            # The attempt stays counted (that write came first); only its reason is lost.
            self._log.warning(
                "could not record the failed attempt",
                extra={
                    "run_id": state.run_id,
                    "step": step,
                    "worker_id": self._worker_id,
                    "error": _describe(unrecorded),
                },
            )
            if is_transient(unrecorded):
                error.transient = True
        raise error

    def _fail_run(self, state: RunState, event: Finished) -> StepOutcome:
        """Fail the run, once no call of it abandoned in this process still runs: a failed
        run must not change after it is failed. Raises `AbandonedCallRunning`, with nothing
        written, if one outlasts the grace."""
        if not _ABANDONED.wait(state.run_id, time.monotonic() + self._abandoned_grace):
            raise AbandonedCallRunning(state.run_id, state.next_step, self._abandoned_grace)
        return self._finish(state, event)

    def _finish(self, state: RunState, event: Finished) -> StepOutcome:
        event = event.model_copy(update={"attempts": state.attempts})
        head, written = self._commit(state, event, step=state.step)
        return StepOutcome.of(head, bytes_written=written)

    def _commit(
        self,
        state: RunState,
        event: CheckpointEvent,
        *,
        step: int,
        completes: LedgerCompletion | None = None,
    ) -> tuple[RunState, int]:
        """Write the event's checkpoint and the new head; returns the head and bytes written."""
        checkpoint_at = utcnow()
        head = apply_event(state, event, version=state.version + 1, at=checkpoint_at)
        checkpoint = Checkpoint(
            run_id=state.run_id,
            version=head.version,
            step=step,
            status=head.status,
            worker_id=self._worker_id,
            created_at=checkpoint_at,
            event=event,
        )
        receipt = self._store.commit(
            Commit(
                head=head,
                checkpoint=checkpoint,
                expected_version=state.version,
                completes=completes,
            )
        )
        self._log.info(
            "checkpoint written",
            extra={
                "run_id": state.run_id,
                "step": step,
                "version": head.version,
                "status": head.status.value,
                "event": event.kind,
                "worker_id": self._worker_id,
                "bytes": receipt.bytes_written,
                "ms": round(receipt.milliseconds, 3),
            },
        )
        return head, receipt.bytes_written


def step_prompt(state: RunState) -> tuple[StepView, str]:
    """What the model is given for the next step of `state`: the view, and the step prompt
    rendered from it. `Client.replay` renders through this same function from the state the
    records fold into before the step, so replay shows what the model was given exactly when
    that state is the one the step loaded (the store's contract, `tests/conformance`)."""
    view = view_of(state)
    return view, render_step_prompt(view)


def view_of(state: RunState) -> StepView:
    return StepView(
        run_id=state.run_id,
        goal=state.goal,
        step=state.next_step,
        messages=state.messages,
        tool_results=state.tool_results,
        digest=state.digest,
        last_result=state.last_result,
        params=state.options.params,
        previous_failure=state.error,
        pinned=state.pinned,
        summary=state.memory,
        summarised_through=state.memory_through,
    )


def _validated(decision: object, agent: Agent) -> Decision:
    if not isinstance(decision, ToolCall | Done):
        raise ModelOutputInvalid(
            f"the model returned {type(decision).__name__}, not a ToolCall or Done"
        )
    try:
        _canonical(decision.model_dump(mode="json")).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ModelOutputInvalid(f"the model's answer is not valid Unicode: {error}") from None
    if isinstance(decision, Done):
        return decision
    if decision.name == memory.REMEMBER and memory.offers_remember(agent):
        try:
            args = memory.RememberArgs.model_validate(decision.arguments)
        except ValidationError as error:
            raise ModelOutputInvalid(f"invalid arguments for remember: {error}") from None
        return ToolCall(name=memory.REMEMBER, arguments=args.model_dump(mode="json"))
    tool = agent.tool_named(decision.name)
    if tool is None:
        known = ", ".join(t.name for t in agent.tools)
        raise ModelOutputInvalid(
            f"the model asked for unknown tool {decision.name!r}; known: {known}"
        )
    try:
        args = tool.parse(decision.arguments)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in error.errors()
        )
        raise ModelOutputInvalid(f"invalid arguments for {tool.name}: {problems}") from None
    # Record the arguments as the tool will see them, so the hash is stable across retries.
    return ToolCall(name=tool.name, arguments=args.model_dump(mode="json"))


def _decision_from(payload: dict[str, Any]) -> Decision:
    if "summary" in payload:
        return Done.model_validate(payload)
    return ToolCall.model_validate(payload)


def _payload(decision: Decision) -> dict[str, Any]:
    payload = decision.model_dump(mode="json")
    # A call kept inline records exactly what it did before references existed, so its hash
    # (and so a ledger entry written by an older Ratchet) is unchanged.
    if payload.get("blob", False) is None:
        del payload["blob"]
    return payload


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def result_digest(text: str) -> str:
    """What the ledger keeps of a step's result: its hash. The result itself is in the step
    record, committed in the same write; keeping it twice only made each step write more."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(payload).encode("utf-8")).hexdigest()


def _arguments_preview(arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments kept by reference, as records show them: small values as they are (so a
    scripted policy can still read, say, a batch number), large ones as their size."""
    preview: dict[str, Any] = {}
    for index, (name, value) in enumerate(list(arguments.items())[:ARGUMENT_PREVIEW_KEYS]):
        size = len(_canonical(value).encode("utf-8"))
        shown = name if len(name) <= 64 else f"{name[:48]}…#{index}"
        preview[shown] = (
            value if size <= ARGUMENT_PREVIEW_VALUE_BYTES else f"[{size:,} bytes, by reference]"
        )
    if len(arguments) > ARGUMENT_PREVIEW_KEYS:
        preview["…"] = f"{len(arguments) - ARGUMENT_PREVIEW_KEYS} more arguments"
    return preview


def _text_preview(text: str, blob: BlobRef) -> str:
    return text[:PREVIEW_CHARS] + f"… [{blob.size:,} bytes in blob {blob.sha256[:12]}]"


def _approval_request(tool: str, result: ToolResult) -> ApprovalRequest | None:
    request = result.wait_for
    if request is None:
        return None
    if not isinstance(request, ApprovalRequest):
        raise ToolFailed(f"{tool} asked a person with a {type(request).__name__}")
    try:
        size = len(_canonical(request.model_dump(mode="json")).encode("utf-8"))
    except (TypeError, ValueError) as error:  # details that are not JSON, or not Unicode
        raise ToolFailed(
            f"{tool} asked a person with a request that cannot be kept: {error}"
        ) from error
    if size > MAX_APPROVAL_REQUEST_BYTES:
        raise ToolFailed(
            f"{tool} asked a person with a request of {size:,} bytes, over the "
            f"{MAX_APPROVAL_REQUEST_BYTES:,}-byte limit; keep the prompt short and put the "
            "detail in the tool's output"
        )
    return request


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "unknown error"
    if isinstance(error, AgentCodeExited):
        error = error.raised
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _attempt_failure(error: Exception, what: str) -> StepAttemptFailed:
    if isinstance(error, StepAttemptFailed):
        return error
    failure = StepErrored(f"{what}: {_describe(error)}", transient=is_transient(error))
    failure.__cause__ = error
    return failure


def _ask(
    binding: Binding,
    clock: _StepClock,
    *,
    prompt: str,
    tools: list[ToolSpec],
    view: StepView,
    doing: str,
    during: str = "",
) -> tuple[object, Usage | None]:
    """One call of the agent's model under the step's clock, with the agent's settings: its
    answer (unchecked) and what it used. An error of the adapter's own (user code) is
    `ModelFailed`, "the model raised ...{during}"."""
    agent = binding.agent
    request = ModelRequest(
        prompt=prompt,
        tools=tools,
        view=view,
        instructions=agent.instructions,
        max_tokens=agent.max_tokens,
        temperature=agent.temperature,
        retry_seconds=agent.model_retry_seconds,
    )
    try:
        answer = clock.run(lambda: binding.model.decide(request), doing)
    except StepAttemptFailed:
        raise
    except Exception as error:  # a model adapter or a scripted policy: user code
        raise ModelFailed(
            f"the model raised {_describe(error)}{during}", transient=is_transient(error)
        ) from error
    if isinstance(answer, ModelReply):
        return answer.decision, answer.usage
    return answer, None


def _paid_for(failure: StepAttemptFailed, usage: Usage | None) -> StepAttemptFailed:
    """`failure`, now carrying what the attempt's model call used (its record counts it)."""
    failure.usage = _added(failure.usage, usage)
    return failure


def _added(one: Usage | None, other: Usage | None) -> Usage | None:
    """Two model calls' usage together; None when neither was counted."""
    if one is None or other is None:
        return other if one is None else one
    return one + other


def _terminal_cause(error: StepAttemptFailed) -> BaseException:
    """What makes a terminal failure terminal: the error behind it (a tool's `PermanentError`,
    a `CheckpointTooLarge` at commit), or the failure itself (`RecordedDecisionInvalid`)."""
    cause = error.__cause__
    return cause if isinstance(cause, TERMINAL_ERRORS) else error


# --- the agent's own thread -----------------------------------------------------------------


class _Overran(Exception):
    def __init__(self, job: _Job) -> None:
        super().__init__()
        self.job = job


class AgentCodeExited(Exception):
    """The agent's code raised a `BaseException` that is not an `Exception` (`SystemExit`,
    `KeyboardInterrupt`, ...): the attempt fails with that cause, described as it."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(str(raised))
        self.raised = raised


@dataclass
class _Job:
    work: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while (job := jobs.get()) is not None:
        try:
            job.value = job.work()
        except BaseException as error:  # handed to the caller, which decides what it means
            job.error = error
        finally:
            job.done.set()
        del job


class _AgentThread:
    """One daemon thread that runs the agent's code for one calling thread, step after step
    (so a handle a `resources` hook opened stays on the thread that opened it). A job that
    overruns its deadline is abandoned with its thread, which ends when the job does; being a
    daemon, a job that never ends cannot keep the process alive."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        threading.Thread(
            target=_serve, args=(self._jobs,), name="ratchet-agent", daemon=True
        ).start()
        # When the calling thread ends, and this object with it, let the agent thread end too.
        self._stop = weakref.finalize(self, self._jobs.put, None)

    def run(self, work: Callable[[], T], deadline: float | None) -> T:
        job = _Job(work)
        self._jobs.put(job)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not job.done.wait(timeout):
            self._stop()
            raise _Overran(job)
        if isinstance(job.error, Exception):
            raise job.error
        if job.error is not None:
            # The agent's own `SystemExit` or `KeyboardInterrupt` (raised on this thread by its
            # code, not by the process's signal handlers, which run on the caller's): a failure
            # of the attempt like any other, never the end of the caller.
            raise AgentCodeExited(job.error) from job.error
        value: T = job.value
        return value


_agent_threads = threading.local()


class _Abandoned:
    """The agent calls of each run that this process abandoned at their deadline and that
    still run. One for the process: whichever engine takes the run's next attempt here (a
    worker's, `ratchet serve`'s, the step function's next invocation in a thawed sandbox)
    must see them, since Python cannot stop a thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, list[_Job]] = {}

    def add(self, run_id: str, job: _Job) -> None:
        with self._lock:
            self._jobs.setdefault(run_id, []).append(job)

    def running(self, run_id: str) -> list[_Job]:
        with self._lock:
            jobs = [j for j in self._jobs.pop(run_id, []) if not j.done.is_set()]
            if jobs:
                self._jobs[run_id] = jobs
            return jobs

    def wait(self, run_id: str, deadline: float | None) -> bool:
        """True once none of the run's abandoned calls runs; False if one still does at
        `deadline` (None: wait as long as they take)."""
        for job in self.running(run_id):
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not job.done.wait(timeout):
                return False
        return True


_ABANDONED = _Abandoned()


@dataclass(frozen=True)
class _StepClock:
    run_id: str
    step: int
    limit: float | None
    deadline: float | None

    def wait_for_abandoned(self) -> None:
        """Wait, within this attempt's time, for the run's calls that an earlier attempt in
        this process abandoned: the agent's code never runs beside its own abandoned call."""
        if not _ABANDONED.wait(self.run_id, self.deadline):
            raise StepTimedOut(
                f"step {self.step} timed out after {self.limit:g} s (waiting for the call an "
                "earlier attempt abandoned, still running in this process); nothing was called "
                "beside it"
            )

    def run(self, work: Callable[[], T], doing: str) -> T:
        """Run the agent's `work` on its thread; `StepTimedOut` if it overruns the deadline."""
        runner: _AgentThread | None = getattr(_agent_threads, "runner", None)
        if runner is None:
            runner = _agent_threads.runner = _AgentThread()
        try:
            return runner.run(work, self.deadline)
        except _Overran as overran:
            _agent_threads.runner = None
            _ABANDONED.add(self.run_id, overran.job)
            raise StepTimedOut(
                f"step {self.step} timed out after {self.limit:g} s ({doing}); the late result, "
                "if any, is discarded"
            ) from None
