"""Fail a run the state machine gave up on: the `MarkFailed` task."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import mark_failed


def handler(event: dict[str, Any], context: Any) -> Any:
    return mark_failed.handler(event, context)
