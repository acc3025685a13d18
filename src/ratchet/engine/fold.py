"""How each checkpoint event moves a run's state: a pure fold, shared by the engine (to build the
new head) and by `show --step N` and `replay` (to rebuild the state as of any earlier
checkpoint). What the window keeps of a step and of a person's answer (`message_of`,
`preview_of`, `answer_in_place`) is in `ratchet.state`, where the stores' window reads share it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ratchet.engine import spending
from ratchet.engine.memory import REMEMBER
from ratchet.state import (
    MAX_PINNED_FACTS,
    ApprovalRequest,
    AttemptFailed,
    Budget,
    BudgetAsked,
    CheckpointEvent,
    Created,
    Finished,
    Message,
    PersonDecided,
    Reserved,
    Retried,
    RunState,
    RunStatus,
    StepCompleted,
    StoredCheckpoint,
    TimerWait,
    ToolDigest,
    Usage,
    Waiting,
    WaitSettled,
    answer_in_place,
    call_ran,
    message_of,
    preview_of,
)


def apply_event(
    state: RunState | None, event: CheckpointEvent, *, version: int, at: datetime
) -> RunState:
    """Return the state after `event`, at head version `version`."""
    if isinstance(event, Created):
        return event.state.model_copy(update={"version": version, "updated_at": at})
    if state is None:
        raise ValueError(f"a {event.kind!r} event needs a prior state")
    update: dict[str, object] = {"version": version, "updated_at": at}
    match event:
        case StepCompleted():
            update |= _after_step(state, event, at)
            update |= _settled(state, event.usage)
        case PersonDecided() if _asks_to_raise(state):
            update |= _after_budget_decision(state, event)
        case WaitSettled() if _waits_for_day(state):
            # No step asked for this wait (the engine parked the run for its agent's spent
            # daily budget): the day's coming, or a raise, moves no step's result.
            update |= {"status": RunStatus.RUNNING, "waiting": None}
        case PersonDecided() | WaitSettled():
            update |= _after_decision(state, event)
        case AttemptFailed():
            update |= {
                "attempts": event.attempt,
                "error": event.error,
                "not_before": event.not_before,
                "usage": _plus(state.usage, event.usage),
            }
            update |= _settled(state, event.usage)
        case Reserved() if state.budget is not None:
            cost = spending.Cost(event.usd, event.tokens)
            update["budget"] = spending.reserved(state.budget, cost)
        case BudgetAsked():
            # The attempt that found no room called nothing: it is given back, and the run
            # waits at its last step, as a step that asks a person does.
            update |= {
                "attempts": max(state.attempts - 1, 0),
                "status": RunStatus.WAITING,
                "waiting": Waiting(step=state.step, request=event.request, since=at),
            }
        case Retried():
            update |= {
                "status": RunStatus.RUNNING,
                "attempts": 0,
                "error": None,
                "not_before": None,
            }
        case Finished():
            update |= {
                "status": event.status,
                "summary": event.summary,
                "error": event.error,
                "attempts": event.attempts,
                "waiting": None,
                "not_before": None,
                "usage": _plus(state.usage, event.usage),
            }
            update |= _settled(state, event.usage)
    return state.model_copy(update=update)


def replay(checkpoints: Iterable[StoredCheckpoint]) -> RunState | None:
    """Fold checkpoints (in version order) into the state as of the last one."""
    state: RunState | None = None
    for checkpoint in checkpoints:
        state = apply_event(
            state, checkpoint.event, version=checkpoint.version, at=checkpoint.created_at
        )
    return state


def _after_step(state: RunState, event: StepCompleted, at: datetime) -> dict[str, object]:
    message = message_of(event)
    preview = preview_of(event)
    messages = [*state.messages, message]
    if state.options.model_summary:
        # Steps leave the window only when a step's commit summarised them (`memory_through`).
        through = event.memory_through if event.memory_through is not None else 0
        evicted = [m for m in messages if m.step <= through]
        messages = [m for m in messages if m.step > through]
    else:
        size = state.options.memory_window
        evicted, messages = messages[:-size], messages[-size:]
    kept_steps = {m.step for m in messages}
    digest = dict(state.digest)
    for old in evicted:
        digest[old.tool] = _fold(digest.get(old.tool), old)
    waiting = (
        Waiting(step=event.step, request=event.wait, since=at) if event.wait is not None else None
    )
    update: dict[str, object] = {
        "step": event.step,
        "attempts": 1 if event.next_attempt_counted else 0,
        "error": None,
        "messages": messages,
        "tool_results": [r for r in [*state.tool_results, preview] if r.step in kept_steps],
        "digest": digest,
        "last_result": preview.text,
        "status": RunStatus.WAITING if waiting else RunStatus.RUNNING,
        "waiting": waiting,
        "not_before": None,
        "usage": _plus(state.usage, event.usage),
        "redo_step": None,
        "parked_span": event.span,
    }
    if event.memory is not None and event.memory_through is not None:
        update["memory"] = event.memory
        update["memory_through"] = event.memory_through
    fact = pinned_fact(event)
    if fact is not None:
        update["pinned"] = [*state.pinned, fact][-MAX_PINNED_FACTS:]
    return update


def pinned_fact(event: StepCompleted) -> str | None:
    """The fact a `remember` step pinned, if it pinned one (its output says so)."""
    if event.call.name != REMEMBER or not event.output.text.startswith("Remembered"):
        return None
    fact = event.call.arguments.get("fact")
    return fact if isinstance(fact, str) else None


def _after_decision(state: RunState, event: PersonDecided | WaitSettled) -> dict[str, object]:
    asked_at = state.waiting.step if state.waiting else state.step
    # The person's answer (the event, the time's coming) becomes the result of the step that
    # waited for it.
    asked = state.waiting.request if state.waiting else None
    results, text = answer_in_place(state.tool_results, asked_at, event, asked)
    redo = (
        isinstance(event, PersonDecided)
        and isinstance(asked, ApprovalRequest)
        and asked.uncertain is not None
        and call_ran(event) is False
    )
    return {
        "status": RunStatus.RUNNING,
        "waiting": None,
        "last_result": text,
        "tool_results": results,
        "redo_step": asked_at if redo else None,
    }


def _settled(state: RunState, used: Usage | None) -> dict[str, object]:
    """The run's budget once the open reservation settles to what the attempt's calls `used`
    (None: unknown, so it counts in full). The price is the one the engine reserved at, read
    when the checkpoint is written; `replay` reads today's."""
    budget = state.budget
    if budget is None:
        return {}
    if budget.reserved_usd == 0 and budget.reserved_tokens == 0 and used is None:
        return {}
    prices = spending.price_of(state.options.model)
    cost = None if used is None else spending.used(used, prices)
    return {"budget": spending.settled(budget, cost)}


def _waits_for_day(state: RunState) -> bool:
    request = state.waiting.request if state.waiting else None
    return isinstance(request, TimerWait) and request.day_budget_of is not None


def _asks_to_raise(state: RunState) -> bool:
    request = state.waiting.request if state.waiting else None
    return isinstance(request, ApprovalRequest) and request.raises_budget


def _after_budget_decision(state: RunState, event: PersonDecided) -> dict[str, object]:
    """A person raised the budget (the run goes on and tries its step again), or would not
    (the run's next step stops it, with their reason). The model sees neither: no step of its
    asked."""
    budget = state.budget or Budget()
    if event.approved:
        budget = spending.raised(budget, event.answer)
    else:
        reason = f"Budget not raised by {event.by}" + (
            f": {event.comment}" if event.comment else "."
        )
        budget = budget.model_copy(update={"refused": reason})
    return {"status": RunStatus.RUNNING, "waiting": None, "budget": budget}


def _plus(total: Usage, used: Usage | None) -> Usage:
    return total if used is None else total + used


def _fold(digest: ToolDigest | None, message: Message) -> ToolDigest:
    if digest is None:
        return ToolDigest(calls=1, first_step=message.step, last_step=message.step)
    return ToolDigest(calls=digest.calls + 1, first_step=digest.first_step, last_step=message.step)
