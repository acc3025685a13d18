"""Settle a wait whose park ended by its own clock, if it is due: the `RecordWait` task."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import record_wait


def handler(event: dict[str, Any], context: Any) -> Any:
    return record_wait.handler(event, context)
