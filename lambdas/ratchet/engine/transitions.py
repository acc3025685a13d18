"""How each checkpoint event moves a run's state: a pure fold, shared by the engine (to build the
new head) and by `show --step N` (to rebuild the state as of any earlier checkpoint)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ratchet.state import (
    PREVIEW_CHARS,
    RECENT_STEPS,
    AttemptFailed,
    Checkpoint,
    CheckpointEvent,
    Created,
    Finished,
    Message,
    PersonDecided,
    RunState,
    RunStatus,
    StepCompleted,
    ToolDigest,
    ToolOutput,
    Usage,
    Waiting,
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
        case PersonDecided():
            update |= _after_decision(state, event)
        case AttemptFailed():
            update |= {
                "attempts": event.attempt,
                "error": event.error,
                "not_before": event.not_before,
                "usage": _plus(state.usage, event.usage),
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
    return state.model_copy(update=update)


def replay(checkpoints: Iterable[Checkpoint]) -> RunState | None:
    """Fold checkpoints (in version order) into the state as of the last one."""
    state: RunState | None = None
    for checkpoint in checkpoints:
        state = apply_event(
            state, checkpoint.event, version=checkpoint.version, at=checkpoint.created_at
        )
    return state


def decision_text(event: PersonDecided) -> str:
    verdict = "Approved" if event.approved else "Rejected"
    return f"{verdict} by {event.by}" + (f": {event.comment}" if event.comment else ".")


def _after_step(state: RunState, event: StepCompleted, at: datetime) -> dict[str, object]:
    message = Message(
        step=event.step, tool=event.call.name, arguments=event.call.arguments, blob=event.call.blob
    )
    preview = ToolOutput(
        step=event.step,
        tool=event.output.tool,
        text=_preview(event.output.text),
        blob=event.output.blob,
    )
    messages = [*state.messages, message]
    evicted, messages = messages[:-RECENT_STEPS], messages[-RECENT_STEPS:]
    kept_steps = {m.step for m in messages}
    digest = dict(state.digest)
    for old in evicted:
        digest[old.tool] = _fold(digest.get(old.tool), old)
    waiting = (
        Waiting(step=event.step, request=event.wait, since=at) if event.wait is not None else None
    )
    return {
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
    }


def _after_decision(state: RunState, event: PersonDecided) -> dict[str, object]:
    text = decision_text(event)
    asked_at = state.waiting.step if state.waiting else state.step
    # The person's answer becomes the result of the step that asked for it.
    results = [
        r.model_copy(update={"text": text}) if r.step == asked_at else r for r in state.tool_results
    ]
    return {
        "status": RunStatus.RUNNING,
        "waiting": None,
        "last_result": text,
        "tool_results": results,
    }


def _plus(total: Usage, used: Usage | None) -> Usage:
    return total if used is None else total + used


def _fold(digest: ToolDigest | None, message: Message) -> ToolDigest:
    if digest is None:
        return ToolDigest(
            calls=1,
            first_step=message.step,
            last_step=message.step,
            last_arguments=message.arguments,
        )
    return ToolDigest(
        calls=digest.calls + 1,
        first_step=digest.first_step,
        last_step=message.step,
        last_arguments=message.arguments,
    )


def _preview(text: str) -> str:
    if len(text) <= PREVIEW_CHARS:
        return text
    return text[: PREVIEW_CHARS - 1] + "…"
