"""The runs API behind API Gateway (`/runs`)."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import api


def handler(event: dict[str, Any], context: Any) -> Any:
    return api.handler(event, context)
