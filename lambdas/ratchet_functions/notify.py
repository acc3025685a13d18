"""Open an approval request for the parked run and send it out: the `AwaitApproval` task."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import notify


def handler(event: dict[str, Any], context: Any) -> Any:
    return notify.handler(event, context)
