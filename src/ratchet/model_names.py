"""What a run's model name says: the agent's scripted policy, Claude on the Anthropic API or on
Amazon Bedrock, or your own `Model` by `module:attr`.

Below the runtime, so that a run request is checked against it before anything is written
(`ratchet.runs`) and a runtime builds the model it names (`ratchet.runtime.models`).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import cast

from ratchet.errors import InvalidInput
from ratchet.imports import IMPORT_PATH, ImportFailed, import_object
from ratchet.ports import Model

SCRIPTED = "scripted"
"""The model name of an agent's own scripted policy (offline, no API key)."""

DEFAULT_CLAUDE_MODEL = "claude-sonnet-4-6"
"""The default Claude model (claude-sonnet-4-5 reached its end of life on 2026-11-30)."""

BEDROCK_PREFIX = "bedrock:"
BEDROCK_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$")
"""A Bedrock model id or inference profile id (`anthropic.claude-...-v1:0`, `us.anthropic...`)."""
CLAUDE_PREFIX = "claude-"


class ModelKind(StrEnum):
    """Where a model name sends a run's model calls."""

    SCRIPTED = "scripted"
    """The agent's own scripted policy: offline, no key."""
    ANTHROPIC = "anthropic"
    """`claude-...`: the Anthropic API, with an API key."""
    BEDROCK = "bedrock"
    """`bedrock:<model id>`: Claude on Amazon Bedrock, with IAM credentials and no key."""
    IMPORTED = "imported"
    """`module:attr`: your own `Model` object, or a zero-argument factory returning one."""


def model_kind(model: str) -> ModelKind | None:
    """What kind of model `model` names, or None if it names none."""
    if model == SCRIPTED:
        return ModelKind.SCRIPTED
    if model.startswith(BEDROCK_PREFIX):
        return (
            ModelKind.BEDROCK if BEDROCK_MODEL_ID.fullmatch(model[len(BEDROCK_PREFIX) :]) else None
        )
    if model.startswith(CLAUDE_PREFIX):
        return ModelKind.ANTHROPIC
    if IMPORT_PATH.fullmatch(model):
        return ModelKind.IMPORTED
    return None


MODEL_NAMES = (
    "use 'scripted', 'claude-...' (the Anthropic API), 'bedrock:<model id>' (Amazon Bedrock) "
    "or module:attr (your own Model, locally)"
)


def load_model(reference: str) -> Model:
    """Import `module:attr` and return the `Model` it names: an object with a `decide`
    method, or a class or zero-argument factory that returns one. `InvalidInput` says why
    not."""
    try:
        found = import_object(reference, what="model", reference=reference)
    except ImportFailed as failed:
        raise InvalidInput(str(failed)) from None
    if not isinstance(found, type) and callable(getattr(found, "decide", None)):
        return cast(Model, found)
    if callable(found):
        try:
            made = found()
        except Exception as error:
            raise InvalidInput(
                f"model factory {reference!r} raised {type(error).__name__}: {error}"
            ) from None
        if callable(getattr(made, "decide", None)):
            return cast(Model, made)
    raise InvalidInput(
        f"{reference!r} is not a ratchet.ports.Model: it needs a decide(request) method (or "
        "must be a zero-argument factory returning an object that has one)"
    )
