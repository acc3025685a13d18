"""Signed webhook deliveries behind API Gateway (`POST /hooks/{hook_id}`)."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import hooks


def handler(event: dict[str, Any], context: Any) -> Any:
    return hooks.handler(event, context)
