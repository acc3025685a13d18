"""Record a person's decision in the run: the `RecordDecision` task."""

from __future__ import annotations

from typing import Any

from ratchet.handlers import decide


def handler(event: dict[str, Any], context: Any) -> Any:
    return decide.handler(event, context)
