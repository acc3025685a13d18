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


RETRY_GENERATIONS = 1_000_000
"""Generations set aside for each retry of a run. A run's executions roll over at most once per
step taken (`rollover_after` >= 1) and a run takes at most `MAX_STEPS` (10,000) steps, so the
generations of one retry never reach the next retry's: the names of a retried run's executions
cannot collide with those of its earlier executions."""

_NAME = re.compile(r"^.*-[0-9a-f]{10}-g(\d+)$")


def first_generation(retry: int) -> int:
    """The generation of the first execution after the run's `retry`-th retry (0: its start)."""
    return retry * RETRY_GENERATIONS


def is_execution_of(name: str, run_id: str) -> bool:
    """Whether `name` is the name of one of the run's executions (any generation)."""
    found = _NAME.fullmatch(name)
    return found is not None and execution_name(run_id, int(found.group(1))) == name
