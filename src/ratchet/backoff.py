"""How long a run waits after a failed attempt before the next one.

The engine records the wait in the run's head (`not_before`) with the failed attempt; the local
worker honours it. On AWS the state machine's Retry on the step spaces the attempts itself, with
the same figures (`statemachine/agent_run.asl.json`: IntervalSeconds 5, BackoffRate 3,
JitterStrategy FULL), so both runtimes back off alike.

On the ground floor, not in the engine: the Anthropic adapter spaces its own tries of a model
call with it too, and adapters import no engine module.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: after failed attempt n, a delay drawn uniformly
    from 0 to `min(first_seconds * factor ** (n - 1), max_seconds)`, as Step Functions'
    `"JitterStrategy": "FULL"` does. The jitter spreads out runs that failed together (a rate
    limit hits every run at once)."""

    first_seconds: float = 5.0
    factor: float = 3.0
    max_seconds: float = 60.0

    def __post_init__(self) -> None:
        figures = (self.first_seconds, self.factor, self.max_seconds)
        if not all(math.isfinite(f) for f in figures):
            raise ValueError(f"backoff figures must be finite, not {figures}")
        if self.first_seconds < 0 or self.factor < 1 or self.max_seconds < self.first_seconds:
            raise ValueError(
                "backoff needs first_seconds >= 0, factor >= 1 and max_seconds >= "
                f"first_seconds, not {figures}"
            )

    def ceiling(self, attempt: int) -> float:
        """The longest delay after failed attempt `attempt` (1 for the first)."""
        try:
            growth = self.factor ** max(attempt - 1, 0)
        except OverflowError:
            return self.max_seconds
        return min(self.first_seconds * growth, self.max_seconds)

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The delay, in seconds, before the attempt after failed attempt `attempt`."""
        return rng.uniform(0.0, self.ceiling(attempt))


DEFAULT_BACKOFF = Backoff()
"""The state machine's figures for a failed attempt (see the module docstring); `max_seconds`
only matters if a step is ever allowed more than three attempts (AWS: no MaxDelaySeconds)."""
