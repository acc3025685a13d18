"""Park the execution on the run's event wait, keeping its task token: the `AwaitEvent` task."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import open_wait


def handler(event: dict[str, Any], context: Any) -> Any:
    return open_wait.handler(event, context)
