"""The step engine: advances a run by exactly one step, then commits it (pure: no adapter,
runtime or app). Other layers import its face from here:

- `step`      the `Engine` (runs' lifecycle, and the order inside a step)
- `budget`    several steps in one go, within a cap and the time left (`take_steps`)
- `outcome`   `Outcome`, `StepOutcome`: what a step returns
- `attempt`   decide and act, under the step clock; `Binding`: what a step runs with
- `commits`   the one conditional write per event; failed attempts and failed runs
- `deadline`  the agent's thread, the step clock, the fence of abandoned calls
- `calls`     the at-most-once calls: whether the person may be asked yet (`running_calls`)
- `decisions` a model's decision validated, hashed, kept by reference when large
- `failures`  how an error becomes the attempt's failure
- `fold`      the event fold (`apply_event`, `replay`)
- `prompt`    the view and the step prompt; `memory` pinned facts and summaries; `backoff`
"""

from ratchet.engine.attempt import Binding
from ratchet.engine.budget import StepBudget, take_steps
from ratchet.engine.calls import running_calls
from ratchet.engine.outcome import Outcome, StepOutcome
from ratchet.engine.step import Binder, Engine

__all__ = [
    "Binder",
    "Binding",
    "Engine",
    "Outcome",
    "StepBudget",
    "StepOutcome",
    "running_calls",
    "take_steps",
]
