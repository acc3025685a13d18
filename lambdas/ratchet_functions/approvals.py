"""The approval pages and Slack's interactivity endpoint behind API Gateway."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import approvals


def handler(event: dict[str, Any], context: Any) -> Any:
    return approvals.handler(event, context)
