"""Step Functions execution names derived from run ids.

An execution name is at most 80 characters of a restricted alphabet, unique per state machine
for 90 days. Deriving it from the run id (and the rollover generation) makes a duplicate start
a no-op: the second StartExecution with the same name and input is refused or returns the
first execution.
"""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX = 80


def execution_name(run_id: str, generation: int = 0) -> str:
    """`<readable run id>-<hash>-g<generation>`: stable, unique per run and generation."""
    digest = hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:10]
    suffix = f"-{digest}-g{generation}"
    readable = _UNSAFE.sub("_", run_id)[: _MAX - len(suffix)]
    return f"{readable}{suffix}"
