"""The structured logger every entry point uses: Powertools Logger, one JSON object a line.

Built on demand (never at import time) so `ratchet status` does not pay for it, and so the
stream is the caller's choice: stderr for the CLI, whose stdout is for results.
"""

from __future__ import annotations

import logging
from typing import IO, Any

_loggers: dict[int, Any] = {}


def json_logger(stream: IO[str], *, level: str = "INFO") -> Any:
    from aws_lambda_powertools import Logger

    key = id(stream)
    if key not in _loggers:
        _loggers[key] = Logger(
            service="ratchet",
            level=level,
            logger_handler=logging.StreamHandler(stream),
            utc=True,
        )
    return _loggers[key]
