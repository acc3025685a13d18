"""One step of a run: the state machine's `Step` task."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import step


def handler(event: dict[str, Any], context: Any) -> Any:
    return step.handler(event, context)
