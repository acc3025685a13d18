"""Ratchet: run long LLM agents that survive crashes, deploys and week-long waits for a person.

The public API, importable from here:

- running: `connect(url)` gives a `Client` (`run`, `start`, `wait`, `approve`, `reject`, `get`,
  `history`, `state_at`, `runs`, `verify`), whose answers are pydantic models (`Run`, ...);
- defining agents: `Agent`, `tool`, `ToolContext`, `RunContext`, `ask_person`, and what a
  scripted policy returns (`ToolCall`, `Done`), from `ratchet.tools`.

Names load on first use, so `import ratchet` (and the `ratchet` command) stays fast.
"""

from __future__ import annotations

# `typing` is not imported at run time: the quick read commands (`ratchet.cli.quick`) start in
# less time than it takes to load.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ratchet.client import Checkpoint, Client, Run, RunListed, Started, WaitTimedOut, connect
    from ratchet.errors import RatchetError, RunNotFound
    from ratchet.ports import RunData
    from ratchet.runs import RunRequestInvalid
    from ratchet.state import RunState, RunStatus
    from ratchet.tools import (
        Agent,
        Done,
        ForkRefused,
        PermanentError,
        RunContext,
        StepView,
        ToolCall,
        ToolContext,
        ToolResult,
        ask_person,
        tool,
    )

_EXPORTS = {
    "ratchet.client": (
        "Checkpoint",
        "Client",
        "Run",
        "RunListed",
        "Started",
        "WaitTimedOut",
        "connect",
    ),
    "ratchet.errors": ("RatchetError", "RunNotFound"),
    "ratchet.ports": ("RunData",),
    "ratchet.runs": ("RunRequestInvalid",),
    "ratchet.state": ("RunState", "RunStatus"),
    "ratchet.tools": (
        "Agent",
        "Done",
        "ForkRefused",
        "PermanentError",
        "RunContext",
        "StepView",
        "ToolCall",
        "ToolContext",
        "ToolResult",
        "ask_person",
        "tool",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "Agent",
    "Checkpoint",
    "Client",
    "Done",
    "ForkRefused",
    "PermanentError",
    "RatchetError",
    "Run",
    "RunContext",
    "RunData",
    "RunListed",
    "RunNotFound",
    "RunRequestInvalid",
    "RunState",
    "RunStatus",
    "Started",
    "StepView",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "WaitTimedOut",
    "ask_person",
    "connect",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'ratchet' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
