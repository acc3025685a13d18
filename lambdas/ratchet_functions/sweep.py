"""Answer the executions parked on waits their wakers settled and died: the wake sweep."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import sweep


def handler(event: dict[str, Any], context: Any) -> Any:
    return sweep.handler(event, context)
