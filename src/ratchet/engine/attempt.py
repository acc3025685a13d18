"""What one attempt of a step does between counting it and committing it, under its step clock:
decide (reuse the decision recorded under the step's key, or ask the model once and record its
decision before acting), act (run the one tool), and, when the window is due, have the model
summarise its oldest steps. What it returns, `Attempted`, is what the step's commit records."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ratchet import tracing
from ratchet.engine import memory
from ratchet.engine.calls import StartedCall, call_start, held_elsewhere, under_way
from ratchet.engine.deadline import StepClock
from ratchet.engine.decisions import (
    arguments_of,
    by_reference,
    canonical,
    decision_from,
    payload_hash,
    payload_of,
    validated,
)
from ratchet.engine.failures import describe, paid_for
from ratchet.engine.prompt import render_summary_prompt, step_prompt, view_of
from ratchet.engine.timers import tool_of
from ratchet.errors import (
    CallUnderWay,
    IdempotencyConflict,
    ModelFailed,
    ModelOutputInvalid,
    RecordedDecisionInvalid,
    StaleVersion,
    StepAttemptFailed,
    StepTimedOut,
    ToolFailed,
    is_transient,
)
from ratchet.faults import FaultPlan, FaultPoint
from ratchet.ports import (
    BlobStore,
    CallLocks,
    IdempotencyLedger,
    LedgerEntry,
    LedgerStatus,
    Model,
    ModelReply,
    ModelRequest,
    StepView,
    ToolSpec,
)
from ratchet.state import (
    INLINE_BYTES,
    MAX_APPROVAL_REQUEST_BYTES,
    MAX_SUMMARY_CHARS,
    PREVIEW_CHARS,
    AnyWait,
    ApprovalRequest,
    Decision,
    Done,
    EventWait,
    RunState,
    StartRuns,
    TimerWait,
    ToolCall,
    ToolOutput,
    Usage,
    idempotency_key,
)
from ratchet.tools import Agent, CallRan, ToolContext, ToolResult

INLINE_OUTPUT_BYTES = INLINE_BYTES
"""Tool output up to this size is kept in the step record; larger output goes to a blob."""


@dataclass(frozen=True)
class Binding:
    """What one run needs to take a step: its agent's tools, a model, and opened resources."""

    agent: Agent
    model: Model
    resources: Any = None


@dataclass(frozen=True)
class Attempted:
    """What an attempt decided and did, for the step's commit to record: a `Done`, or a tool
    call with its output, the person it asks (if any) and the window's new summary (if due)."""

    decision: Decision
    output: ToolOutput | None = None
    wait: AnyWait | None = None
    usage: Usage | None = None
    """What the attempt's model calls used (None: the recorded decision was reused)."""
    folded: memory.Folded | None = None
    started: list[str] | None = None
    """The child runs the step started (`start_runs`)."""
    step_limit: float | None = None
    """The agent's step time limit the attempt ran under (None: none)."""


class StepWork:
    """Decides and acts for the engine's attempts; the engine commits what they return."""

    def __init__(
        self,
        *,
        ledger: IdempotencyLedger,
        blobs: BlobStore,
        faults: FaultPlan,
        sleep: Callable[[float], None],
        logger: logging.Logger | Any,
        worker_id: str,
        clock: Callable[[], datetime],
        call_locks: CallLocks | None = None,
    ) -> None:
        self._ledger = ledger
        self._blobs = blobs
        self._faults = faults
        self._sleep = sleep
        self._log = logger
        self._worker_id = worker_id
        self._clock = clock
        self._locks = call_locks

    def decide(
        self,
        state: RunState,
        binding: Binding,
        clock: StepClock,
        span: tracing.Span = tracing.OFF,
    ) -> tuple[Decision, Usage | None]:
        """The step's decision, and what the model call cost (None: the decision recorded by
        an earlier attempt is reused, and no model is called). `span`, the step's, is told
        which (`tracing.DECISION`)."""
        step = state.next_step
        key = idempotency_key(state.run_id, step)
        recorded = self._ledger.get(key)
        usage: Usage | None = None
        how = "reused"
        if recorded is None and state.redo_step is not None:
            # A person said the at-most-once call of that step did not run: this step makes
            # the same call again, under its own key, and asks no model.
            recorded = self._redo(state, key)
            how = "redo"
        if recorded is None:
            how = "model"
            self._faults.hit(FaultPoint.BEFORE_MODEL, step)
            view, prompt = step_prompt(state)
            self._log.debug(
                "model called",
                extra={"run_id": state.run_id, "step": step, "worker_id": self._worker_id},
            )
            answer, usage = ask(
                binding,
                clock,
                prompt=prompt,
                tools=memory.tool_specs(binding.agent),
                view=view,
                doing="in the model call",
                state=state,
            )
            try:
                decision = validated(answer, binding.agent)
            except StepAttemptFailed as invalid:
                paid_for(invalid, usage)
                raise
            self._faults.hit(FaultPoint.AFTER_MODEL, step)
            # The hash is of the full decision, so the same key with other arguments is
            # refused even when both are kept by reference.
            recorded = self._record(
                state,
                key,
                args_hash=payload_hash(payload_of(decision)),
                decision=payload_of(by_reference(decision, self._blobs)),
            )
        else:
            self._log.debug(
                "decision reused",
                extra={"run_id": state.run_id, "step": step, "worker_id": self._worker_id},
            )
        if recorded.status is LedgerStatus.COMPLETED or recorded.decision is None:
            # The step committed already (the commit completes its key, and drops the
            # ledger's copy of the decision: the record holds it): another worker took it
            # while this one read an older head. Stop without acting; the head moved.
            raise StaleVersion(state.run_id, state.version)
        span.set({tracing.DECISION: how})
        self._faults.hit(FaultPoint.AFTER_DECISION, step)
        return decision_from(recorded.decision), usage

    def decides(self, state: RunState) -> bool:
        """Whether the next attempt may ask the model for the step's decision: none is
        recorded under the step's key (a step made again may still find one to reuse)."""
        return self._ledger.get(idempotency_key(state.run_id, state.next_step)) is None

    def call_under_way(self, state: RunState) -> CallUnderWay | None:
        """What keeps the run's next step from being taken now: its at-most-once call, found
        started with no outcome by an earlier attempt, that may still be running (see
        `ratchet.engine.calls`). None if there is none, or it is over."""
        entry = self._ledger.get(idempotency_key(state.run_id, state.next_step))
        if entry is None:
            return None
        return under_way(entry, now=self._clock(), locks=self._locks)

    def _start_call(self, key: str, clock: StepClock) -> StartedCall | None:
        """Record that the at-most-once call under `key` starts, holding its lock on this host
        from before the record until the call ends. None: an earlier attempt started it, and
        it is over (a person is asked whether it ran). Raises `CallUnderWay` if it, or another
        call of the key, may still be running."""
        held = None
        if self._locks is not None:
            held = self._locks.hold(key)
            if held is None:
                raise held_elsewhere(key)
        try:
            first = self._ledger.start_call(
                key, call_start(self._clock(), clock.limit, self._worker_id)
            )
        except BaseException:
            if held is not None:
                held.release()
            raise
        if first:
            return StartedCall(key, held)
        if held is not None:
            held.release()
        # Found started by an earlier attempt: its worker may be frozen in it, not dead.
        entry = self._ledger.get(key)
        if entry is not None:
            running = under_way(entry, now=self._clock(), locks=self._locks)
            if running is not None:
                raise running
        return None

    def _redo(self, state: RunState, key: str) -> LedgerEntry | None:
        """Record again, under this step's key, the call of the step a person said did not
        run: the call as that step's record keeps it (the last step, so in the window; a
        ledger entry of an older Ratchet may hold it too), with its hash from the ledger."""
        assert state.redo_step is not None
        earlier = self._ledger.get(idempotency_key(state.run_id, state.redo_step))
        if earlier is None:  # its record expired: the model decides afresh
            return None
        decision = earlier.decision
        for message in state.messages:
            if message.step == state.redo_step:
                call = ToolCall(name=message.tool, arguments=message.arguments, blob=message.blob)
                decision = payload_of(call)
        if decision is None:  # neither the window nor the ledger has it: decide afresh
            return None
        return self._record(state, key, args_hash=earlier.args_hash, decision=decision)

    def _record(
        self, state: RunState, key: str, *, args_hash: str, decision: dict[str, Any]
    ) -> LedgerEntry:
        """Record the step's decision under its key before acting on it."""
        entry = LedgerEntry(
            key=key,
            run_id=state.run_id,
            step=state.next_step,
            args_hash=args_hash,
            decision=decision,
        )
        try:
            return self._ledger.begin(entry)
        except IdempotencyConflict as conflict:
            # Another worker decided this step first (our lease lapsed mid-call): its decision
            # stands, and our version is stale. Stop without acting.
            raise StaleVersion(state.run_id, state.version) from conflict

    def summarise(
        self, state: RunState, binding: Binding, clock: StepClock
    ) -> memory.Folded | None:
        """With `model_summary`, when this step's commit would leave twice `memory_window`
        steps in the window: the model's summary of the oldest ones, to record in the step's
        record (so it is written once, and a replay reads it back)."""
        through = memory.summarise_through(state)
        if through is None:
            return None
        view = view_of(state).model_copy(update={"task": "summarise", "summarise_through": through})
        decision, usage = ask(
            binding,
            clock,
            prompt=render_summary_prompt(view, limit=MAX_SUMMARY_CHARS),
            tools=[],
            view=view,
            doing="summarising the window",
            during=" while summarising",
            state=state,
            task="summarise",
        )
        if not isinstance(decision, Done) or not decision.summary.strip():
            refused = ModelOutputInvalid(
                "asked for a summary of the oldest steps, the model gave none"
            )
            raise paid_for(refused, usage)
        return memory.Folded(decision.summary.strip()[:MAX_SUMMARY_CHARS], through, usage)

    def act(
        self, state: RunState, binding: Binding, call: ToolCall, clock: StepClock
    ) -> tuple[ToolOutput, ApprovalRequest | EventWait | TimerWait | StartRuns | None]:
        step = state.next_step
        tool = tool_of(binding.agent, call.name)
        if tool is None and call.name == memory.REMEMBER and memory.offers_remember(binding.agent):
            try:
                pinned = memory.remember(state, arguments_of(call, self._blobs))
            except ValidationError as error:
                raise RecordedDecisionInvalid(f"recorded fact no longer fits: {error}") from None
            return ToolOutput(step=step, tool=memory.REMEMBER, text=pinned), None
        if tool is None:
            raise RecordedDecisionInvalid(
                f"step {step} asks for tool {call.name!r}, which this agent lacks"
            )
        try:
            args = tool.parse(arguments_of(call, self._blobs))
        except ValidationError as error:
            raise RecordedDecisionInvalid(
                f"recorded arguments no longer fit {tool.name}: {error}"
            ) from None
        key = idempotency_key(state.run_id, step)
        context = ToolContext(
            run_id=state.run_id,
            step=step,
            idempotency_key=key,
            attempt=state.attempts,
            resources=binding.resources,
        )
        with tracing.tool_span(
            state.run_id, step, state.attempts, tool=tool.name, key=key
        ) as called:
            started: StartedCall | None = None
            if tool.at_most_once:
                # Durably before the call: a later attempt that finds it started never calls
                # again; once it cannot be running any more, it asks a person whether it ran.
                started = self._start_call(key, clock)
                if started is None:
                    called.set({tracing.TOOL_OUTCOME: "uncertain"})
                    return uncertain(step, tool.name, key, arguments_of(call, self._blobs))
                try:
                    self._faults.hit(FaultPoint.AFTER_CALL_STARTED, step)
                except Exception:
                    started.end()  # the tool was never called
                    raise
                except BaseException:
                    started.let_go()
                    raise
            ended = started.end if started is not None else _nothing
            latency = state.options.tool_latency_ms / 1000

            # The call ends where it runs: a call given up at the deadline ends later, on its
            # own thread or loop, and holds its lock until then.
            def run_tool() -> ToolResult:
                try:
                    if latency:
                        self._sleep(latency)
                    return tool(args, context)
                finally:
                    ended()

            async def run_async_tool() -> ToolResult:
                # Here, not with the module: loaded already on the loop this runs on, and a
                # command that works no step (`ratchet start`, `approve`) never loads it.
                import asyncio

                try:
                    if latency:
                        await asyncio.sleep(latency)
                    return await tool.call_async(args, context)
                finally:
                    ended()

            try:
                if tool.is_async:
                    result = clock.run_async(run_async_tool, f"in tool {tool.name}")
                else:
                    result = clock.run(run_tool, f"in tool {tool.name}")
            except StepTimedOut as timed_out:
                if not timed_out.still_running:
                    ended()  # a coroutine cancelled before it began ran no `finally`
                called.set({tracing.TOOL_OUTCOME: "timed_out"})
                raise
            except Exception as error:  # user code: any failure is this attempt's failure
                ended()
                called.set({tracing.TOOL_OUTCOME: "error"})
                raise ToolFailed(
                    f"{tool.name} raised {describe(error)}", transient=is_transient(error)
                ) from error
            called.set({tracing.TOOL_OUTCOME: _tool_outcome(result)})
        self._faults.hit(FaultPoint.AFTER_TOOL, step)
        return self._output(step, tool.name, result), wait_request(tool.name, result)

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


def ask(
    binding: Binding,
    clock: StepClock,
    *,
    prompt: str,
    tools: list[ToolSpec],
    view: StepView,
    doing: str,
    state: RunState,
    during: str = "",
    task: str = "decide",
) -> tuple[object, Usage | None]:
    """One call of the agent's model under the step's clock, with the agent's settings: its
    answer (unchecked) and what it used, in a span of the call (`task`: what it was asked).
    An error of the adapter's own (user code) is `ModelFailed`, "the model raised
    ...{during}"."""
    with tracing.model_span(
        state.run_id, state.next_step, state.attempts, model=state.options.model, task=task
    ) as called:
        answer, usage = _ask(
            binding, clock, prompt=prompt, tools=tools, view=view, doing=doing, during=during
        )
        if usage is not None:
            called.set(tracing.usage_attributes(usage))
        return answer, usage


def _ask(
    binding: Binding,
    clock: StepClock,
    *,
    prompt: str,
    tools: list[ToolSpec],
    view: StepView,
    doing: str,
    during: str,
) -> tuple[object, Usage | None]:
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
            f"the model raised {describe(error)}{during}", transient=is_transient(error)
        ) from error
    if isinstance(answer, ModelReply):
        return answer.decision, answer.usage
    return answer, None


UNCERTAIN_ARGUMENTS_CHARS = 2000


def _nothing() -> None:
    pass


def uncertain(
    step: int, tool: str, key: str, arguments: dict[str, Any]
) -> tuple[ToolOutput, ApprovalRequest]:
    """The result of an at-most-once call found started with no outcome recorded: not called
    again, and a person asked whether it ran (`CallRan`)."""
    from ratchet.approvals.answers import answer_schema

    shown = json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)
    if len(shown) > UNCERTAIN_ARGUMENTS_CHARS:
        shown = shown[: UNCERTAIN_ARGUMENTS_CHARS - 1] + "…"
    output = ToolOutput(
        step=step,
        tool=tool,
        text=f"{tool} may or may not have run at step {step}: its call started and no outcome "
        "was recorded, so it is not called again. A person is asked whether it ran.",
    )
    request = ApprovalRequest(
        prompt=f"{tool} may or may not have run at step {step} with these arguments: did it?",
        details={"tool": tool, "step": step, "arguments": shown, "idempotency_key": key},
        answer_schema=answer_schema(CallRan),
        uncertain=tool,
    )
    return output, request


def _tool_outcome(result: object) -> str:
    """`ok`, or what the call's result asks (as the tool gave it; `wait_request` checks it):
    `waits:person`, `waits:event`, `waits:timer`, `starts_runs`."""
    if not isinstance(result, ToolResult):
        return "ok"
    if result.start is not None:
        return "starts_runs"
    if result.wait_for is None:
        return "ok"
    return f"waits:{getattr(result.wait_for, 'kind', 'person')}"


def wait_request(
    tool: str, result: ToolResult
) -> ApprovalRequest | EventWait | TimerWait | StartRuns | None:
    """What the tool's result waits for (a person, an event, a time) or starts (child runs,
    each spec bounded where it is checked, by the start), checked to be a request a record
    can keep."""
    request = result.wait_for
    if result.start is not None:
        if request is not None or not isinstance(result.start, StartRuns):
            raise ToolFailed(f"{tool} asked to start runs and to wait for something else")
        return result.start
    if request is None:
        return None
    if not isinstance(request, ApprovalRequest | EventWait | TimerWait):
        raise ToolFailed(f"{tool} asked to wait with a {type(request).__name__}")
    asked = "asked a person" if isinstance(request, ApprovalRequest) else "asked to wait"
    try:
        size = len(canonical(request.model_dump(mode="json")).encode("utf-8"))
    except (TypeError, ValueError) as error:  # details that are not JSON, or not Unicode
        raise ToolFailed(f"{tool} {asked} with a request that cannot be kept: {error}") from error
    if size > MAX_APPROVAL_REQUEST_BYTES:
        raise ToolFailed(
            f"{tool} {asked} with a request of {size:,} bytes, over the "
            f"{MAX_APPROVAL_REQUEST_BYTES:,}-byte limit; keep the prompt short and put the "
            "detail in the tool's output"
        )
    return request
