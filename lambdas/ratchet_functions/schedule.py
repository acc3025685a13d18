"""A schedule's fire (EventBridge Scheduler): start its run, once per fire time."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import schedule


def handler(event: dict[str, Any], context: Any) -> Any:
    return schedule.handler(event, context)
