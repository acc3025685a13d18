"""Put an EventBridge event for each change of a run's status, read from the table's stream."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import status_events


def handler(event: dict[str, Any], context: Any) -> Any:
    return status_events.handler(event, context)
