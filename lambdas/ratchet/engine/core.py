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
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from ratchet.engine.prompt import render_step_prompt
from ratchet.engine.transitions import apply_event
from ratchet.errors import (
    IdempotencyConflict,
    ModelOutputInvalid,
    NotWaiting,
    RunNotFound,
    StaleVersion,
    StepAttemptFailed,
    ToolFailed,
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
    ModelRequest,
    StepView,
)
from ratchet.state import (
    MAX_ATTEMPTS,
    PREVIEW_CHARS,
    AttemptFailed,
    Checkpoint,
    CheckpointEvent,
    Created,
    Decision,
    Done,
    Finished,
    PersonDecided,
    RunState,
    RunStatus,
    StepCompleted,
    ToolCall,
    ToolOutput,
    idempotency_key,
    utcnow,
)
from ratchet.tools import Agent, ToolContext, ToolResult

INLINE_OUTPUT_BYTES = 2048
"""Tool output up to this size is kept in the step record; larger output goes to a blob."""


class Outcome(StrEnum):
    CONTINUE = "continue"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"


_OUTCOME_OF_STATUS = {
    RunStatus.RUNNING: Outcome.CONTINUE,
    RunStatus.WAITING: Outcome.WAITING,
    RunStatus.DONE: Outcome.DONE,
    RunStatus.FAILED: Outcome.FAILED,
}


@dataclass(frozen=True)
class StepOutcome:
    outcome: Outcome
    run_id: str
    step: int
    version: int
    bytes_written: int = 0
    """What the step's checkpoint commit wrote (head, record, ledger); 0 if nothing was."""

    @classmethod
    def of(cls, state: RunState, *, bytes_written: int = 0) -> StepOutcome:
        return cls(
            _OUTCOME_OF_STATUS[state.status],
            state.run_id,
            state.step,
            state.version,
            bytes_written,
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
        worker_id: str,
        logger: logging.Logger | Any,
        faults: FaultPlan = NO_FAULTS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._blobs = blobs
        self._bind = bind
        self._worker_id = worker_id
        self._log = logger
        self._faults = faults
        self._sleep = sleep
        self._counted_ahead: dict[str, int] = {}

    @property
    def worker_id(self) -> str:
        return self._worker_id

    # --- runs ------------------------------------------------------------------------------

    def start(self, state: RunState) -> bool:
        """Create the run at version 1. False (and nothing written) if the id is taken."""
        state = state.model_copy(update={"version": 1})
        checkpoint = Checkpoint(
            run_id=state.run_id,
            version=1,
            step=0,
            status=state.status,
            worker_id=self._worker_id,
            event=Created(state=state),
        )
        return self._store.create_run(state, checkpoint)

    def load(self, run_id: str) -> RunState:
        state = self._store.load_head(run_id)
        if state is None:
            raise RunNotFound(run_id)
        return state

    def advance(self, run_id: str, *, count_next_attempt: bool = False) -> StepOutcome:
        """Take exactly one step of the run (or apply a stop rule) and commit it.

        Raises `StaleVersion` if another worker moved the run meanwhile (nothing was written),
        and `StepAttemptFailed` after recording a failed attempt that may be retried.

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
            return self._finish(state, Finished(status=RunStatus.DONE, summary=summary))
        # Only this engine can have written the version it counted ahead for: if the head is
        # still at it, the attempt is already on record, and nobody else has touched the run.
        if self._counted_ahead.pop(run_id, None) != state.version:
            if state.attempts >= MAX_ATTEMPTS:
                last = state.error or "the worker died during the step"
                error = f"step {step} failed {state.attempts} times; last error: {last}"
                return self._finish(state, Finished(status=RunStatus.FAILED, error=error))
            version = self._store.begin_attempt(run_id, state.version)
            state = state.model_copy(update={"version": version, "attempts": state.attempts + 1})
        started = time.perf_counter()
        try:
            binding = self._bound(state)
            decision = self._decide(state, binding)
            if isinstance(decision, ToolCall):
                output, wait = self._act(state, binding, decision)
        except StepAttemptFailed as error:
            return self._record_failure(state, error)
        key = idempotency_key(run_id, step)
        self._faults.hit(FaultPoint.BEFORE_COMMIT, step)
        if isinstance(decision, Done):
            finished = Finished(
                status=RunStatus.DONE, summary=decision.summary, attempts=state.attempts
            )
            head, written = self._commit(
                state, finished, step=state.step, completes=LedgerCompletion(key, "DONE")
            )
        else:
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
            )
            head, written = self._commit(
                state, event, step=step, completes=LedgerCompletion(key, output.text)
            )
        if isinstance(decision, ToolCall) and event.next_attempt_counted:
            self._counted_ahead[run_id] = head.version
        self._faults.hit(FaultPoint.AFTER_COMMIT, step)
        return StepOutcome.of(head, bytes_written=written)

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
            Finished(status=RunStatus.FAILED, error=reason, attempts=state.attempts),
            step=state.step,
        )
        return head

    def decide_waiting(
        self, run_id: str, *, approved: bool, by: str, comment: str = "", step: int | None = None
    ) -> RunState:
        """Record a person's decision on a waiting run; the run becomes runnable again.
        With `step`, only if the run waits at that step (the commit is conditional on the
        version read here, so the check and the decision are one)."""
        state = self.load(run_id)
        if state.status is not RunStatus.WAITING or (step is not None and state.step != step):
            raise NotWaiting(run_id, state.status)
        event = PersonDecided(approved=approved, by=by, comment=comment)
        head, _ = self._commit(state, event, step=state.step)
        return head

    # --- one step --------------------------------------------------------------------------

    def _bound(self, state: RunState) -> Binding:
        try:
            return self._bind(state)
        except Exception as error:  # the agent's own hooks run here: any failure is this attempt's
            raise StepAttemptFailed(
                f"cannot set up agent {state.agent!r} for the step: {type(error).__name__}: {error}"
            ) from error

    def _decide(self, state: RunState, binding: Binding) -> Decision:
        step = state.next_step
        key = idempotency_key(state.run_id, step)
        recorded = self._ledger.get(key)
        if recorded is None:
            self._faults.hit(FaultPoint.BEFORE_MODEL, step)
            view = view_of(state)
            request = ModelRequest(
                prompt=render_step_prompt(view),
                tools=[t.spec() for t in binding.agent.tools],
                view=view,
            )
            self._log.debug(
                "model called",
                extra={"run_id": state.run_id, "step": step, "worker_id": self._worker_id},
            )
            decision = _validated(binding.model.decide(request), binding.agent)
            self._faults.hit(FaultPoint.AFTER_MODEL, step)
            payload = decision.model_dump(mode="json")
            entry = LedgerEntry(
                key=key,
                run_id=state.run_id,
                step=step,
                args_hash=_hash(payload),
                decision=payload,
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
        return _decision_from(recorded.decision)

    def _act(self, state: RunState, binding: Binding, call: ToolCall) -> tuple[ToolOutput, Any]:
        step = state.next_step
        tool = binding.agent.tool_named(call.name)
        if tool is None:
            raise ToolFailed(f"step {step} asks for tool {call.name!r}, which this agent lacks")
        try:
            args = tool.parse(call.arguments)
        except ValidationError as error:
            raise ToolFailed(f"recorded arguments no longer fit {tool.name}: {error}") from None
        context = ToolContext(
            run_id=state.run_id,
            step=step,
            idempotency_key=idempotency_key(state.run_id, step),
            attempt=state.attempts,
            resources=binding.resources,
        )
        if state.options.tool_latency_ms:
            self._sleep(state.options.tool_latency_ms / 1000)
        try:
            result: ToolResult = tool(args, context)
        except Exception as error:  # user code: any failure is this attempt's failure
            raise ToolFailed(f"{tool.name} raised {type(error).__name__}: {error}") from error
        self._faults.hit(FaultPoint.AFTER_TOOL, step)
        return self._output(step, tool.name, result.output), result.wait_for

    def _output(self, step: int, tool: str, text: str) -> ToolOutput:
        data = text.encode("utf-8")
        if len(data) <= INLINE_OUTPUT_BYTES:
            return ToolOutput(step=step, tool=tool, text=text)
        blob = self._blobs.put(data)
        preview = text[:PREVIEW_CHARS] + f"… [{len(data):,} bytes in blob {blob.sha256[:12]}]"
        return ToolOutput(step=step, tool=tool, text=preview, blob=blob)

    # --- commits ---------------------------------------------------------------------------

    def _record_failure(self, state: RunState, error: StepAttemptFailed) -> StepOutcome:
        step = state.next_step
        self._log.warning(
            "step attempt failed",
            extra={
                "run_id": state.run_id,
                "step": step,
                "attempt": state.attempts,
                "worker_id": self._worker_id,
                "error": str(error),
            },
        )
        if state.attempts >= MAX_ATTEMPTS:
            message = f"step {step} failed {state.attempts} times; last error: {error}"
            return self._finish(state, Finished(status=RunStatus.FAILED, error=message))
        self._commit(
            state,
            AttemptFailed(step=step, attempt=state.attempts, error=str(error)),
            step=state.step,
        )
        raise error

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
    )


def _validated(decision: Decision, agent: Agent) -> Decision:
    if isinstance(decision, Done):
        return decision
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


def _hash(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
