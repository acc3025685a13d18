"""How whatever fails in an attempt becomes its `StepAttemptFailed`: the cause described and cut
to what a record keeps, with what the attempt's model calls used before it failed."""

from __future__ import annotations

from ratchet.engine.deadline import AgentCodeExited
from ratchet.errors import TERMINAL_ERRORS, StepAttemptFailed, StepErrored, is_transient
from ratchet.state import MAX_ERROR_CHARS, Usage


def attempt_failure(error: Exception, what: str) -> StepAttemptFailed:
    if isinstance(error, StepAttemptFailed):
        return error
    failure = StepErrored(f"{what}: {describe(error)}", transient=is_transient(error))
    failure.__cause__ = error
    return failure


def paid_for(failure: StepAttemptFailed, usage: Usage | None) -> StepAttemptFailed:
    """`failure`, now carrying what the attempt's model call used (its record counts it)."""
    failure.usage = added(failure.usage, usage)
    return failure


def added(one: Usage | None, other: Usage | None) -> Usage | None:
    """Two model calls' usage together; None when neither was counted."""
    if one is None or other is None:
        return other if one is None else one
    return one + other


def terminal_cause(error: StepAttemptFailed) -> BaseException:
    """What makes a terminal failure terminal: the error behind it (a tool's `PermanentError`,
    a `CheckpointTooLarge` at commit), or the failure itself (`RecordedDecisionInvalid`)."""
    cause = error.__cause__
    return cause if isinstance(cause, TERMINAL_ERRORS) else error


def describe(error: BaseException | None) -> str:
    if error is None:
        return "unknown error"
    if isinstance(error, AgentCodeExited):
        error = error.raised
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
