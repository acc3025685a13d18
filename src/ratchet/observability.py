"""The structured logger every entry point uses: Powertools Logger, one JSON object a line.

Built on demand (never at import time) so `ratchet status` does not pay for it, and so the
stream is the caller's choice: the CLI's stdout is for results, and its log lines go to stderr
or, on a terminal, to a file beside the store (`AppendedLines`).

Every line goes out through `redacted_json`, so a Step Functions task token (a bearer
credential for its execution) never reaches a log, whatever the logger is asked to log: an
event logged whole (`POWERTOOLS_LOGGER_LOG_EVENT=true`, which users turn on to debug), an
`extra`, an appended key, a message or an exception's text.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any, Protocol

_loggers: dict[int, Any] = {}

REDACTED = "[redacted]"

_TOKEN_KEYS = frozenset({"tasktoken", "token"})
"""Keys (compared without case, `_` or `-`) whose value is a token: `task_token` as the notify
function's payload names it, `taskToken` as the Step Functions API does."""

_KEYED_TOKEN = re.compile(
    r"""(?P<key>["']?task[_-]?token["']?\s*[:=]\s*["']?)[^"'\s,;&}]+""", re.IGNORECASE
)
"""A token written into text beside its name: `"task_token": "..."`, `taskToken=...`."""

_TOKEN_SHAPED = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{100,}={0,2}")
"""What a Step Functions task token looks like wherever it appears: an unbroken base64 run of
hundreds of characters (AWS's are ~700). Nothing else Ratchet logs is shaped so: its ids,
hashes and signatures are at most 64 characters."""


def redact(value: Any) -> Any:
    """`value` with every task token in it replaced by `REDACTED`: under a token's key at any
    depth, beside its name in a string, or shaped like one anywhere."""
    if isinstance(value, str):
        return _TOKEN_SHAPED.sub(REDACTED, _KEYED_TOKEN.sub(rf"\g<key>{REDACTED}", value))
    if isinstance(value, dict):
        return {
            key: REDACTED if _is_token_key(key) else redact(item) for key, item in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [redact(item) for item in value]
    return value


def _is_token_key(key: object) -> bool:
    return isinstance(key, str) and key.lower().replace("_", "").replace("-", "") in _TOKEN_KEYS


def redacted_json(log: object) -> str:
    """The JSON of one log line, task tokens redacted (Powertools' `json_serializer`). What
    JSON cannot hold is written as its `str`, as Powertools' default does, redacted too."""
    return json.dumps(
        redact(log),
        default=lambda other: redact(str(other)),
        separators=(",", ":"),
        ensure_ascii=False,  # as Powertools' own serializer writes them
    )


class Lines(Protocol):
    """Where a logger writes its lines: a text stream, or `AppendedLines`."""

    def write(self, text: str, /) -> Any: ...

    def flush(self) -> None: ...


class AppendedLines:
    """A log file appended to, opened (its directory made) at the first line written, so that
    a command that logs nothing leaves no file behind. Opened to append, line-buffered: each
    line goes out as it is logged, after whatever other processes appended meanwhile. A file
    that cannot be opened sends the lines to stderr instead, rather than losing them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None

    def write(self, text: str) -> int:
        if self._file is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8", buffering=1)
            except OSError:
                self._file = sys.stderr
        return int(self._file.write(text))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()


def json_logger(stream: Lines, *, level: str = "INFO") -> Any:
    """The JSON logger writing to `stream`, one per stream. Powertools is loaded when the
    logger is first used (`OnFirstUse`): `ratchet start` hands the engine a logger and writes
    no line, and Powertools takes longer to load than the start takes (issue 36)."""
    key = id(stream)
    if key not in _loggers:
        _loggers[key] = OnFirstUse(stream, level=level)
    return _loggers[key]


class OnFirstUse:
    """A Powertools Logger on `stream`, made when anything is first asked of it (a line
    logged, a key appended) and then answering for it: the same logger, made later."""

    def __init__(self, stream: Lines, *, level: str) -> None:
        self._stream = stream
        self._level = level
        self._logger: Any = None

    def __getattr__(self, name: str) -> Any:
        # Called only for what this object lacks: everything the Powertools Logger has.
        if self._logger is None:
            from aws_lambda_powertools import Logger

            self._logger = Logger(
                service="ratchet",
                level=self._level,
                logger_handler=logging.StreamHandler(self._stream),
                utc=True,
                json_serializer=redacted_json,
            )
        return getattr(self._logger, name)
