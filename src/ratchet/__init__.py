"""Ratchet: run long LLM agents that survive crashes, deploys and week-long waits for a person.

The public API. A project imports from here and from `ratchet.tools`, and from nowhere deeper:
every other module is internal and may move between releases (tests/unit/test_public_face.py
pins both faces' names).

- running: `connect(url)` gives a `Client` (`run`, `start`, `wait`, `approve`, `reject`,
  `send_event`, `wake`, `get`, `history`, `state_at`, `runs`, `verify`, ...), whose answers
  are pydantic models (`Run`, `EventSent`, ...); it is safe to share between threads, and
  `AsyncClient(client)` gives asyncio code the same methods as coroutines;
- defining agents: `Agent`, `tool`, `ToolContext`, `RunContext`, the waits a tool returns
  (`ask_person`, `wait_for_reply`, `wait_for_event`, `sleep`, `sleep_until`), the child runs
  it starts (`start_runs`, `RunSpec`), and what a
  scripted policy returns (`ToolCall`, `Done`); `ratchet.tools` has the rest (a tool's parts,
  the model port for a model of your own).

Names load on first use, so `import ratchet` (and the `ratchet` command) stays fast. The
imports below are for type checkers and readers; `_EXPORTS` says where each name loads from at
run time, and the face test checks that the two agree.
"""

from __future__ import annotations

# `typing` is not imported at run time: the quick read commands (`ratchet.cli.quick`) start in
# less time than it takes to load.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ratchet.client import AsyncClient as AsyncClient
    from ratchet.client import Checkpoint as Checkpoint
    from ratchet.client import Client as Client
    from ratchet.client import EventSent as EventSent
    from ratchet.client import HookOpened as HookOpened
    from ratchet.client import Run as Run
    from ratchet.client import RunListed as RunListed
    from ratchet.client import RunPage as RunPage
    from ratchet.client import Started as Started
    from ratchet.client import WaitTimedOut as WaitTimedOut
    from ratchet.errors import RatchetError as RatchetError
    from ratchet.errors import RunNotFound as RunNotFound
    from ratchet.runs import RunRequestInvalid as RunRequestInvalid
    from ratchet.runtime import connect as connect
    from ratchet.state import RunStatus as RunStatus
    from ratchet.tools import Agent as Agent
    from ratchet.tools import Done as Done
    from ratchet.tools import ForkRefused as ForkRefused
    from ratchet.tools import PermanentError as PermanentError
    from ratchet.tools import RunContext as RunContext
    from ratchet.tools import RunData as RunData
    from ratchet.tools import RunSpec as RunSpec
    from ratchet.tools import RunState as RunState
    from ratchet.tools import StepView as StepView
    from ratchet.tools import ToolCall as ToolCall
    from ratchet.tools import ToolContext as ToolContext
    from ratchet.tools import ToolResult as ToolResult
    from ratchet.tools import ask_person as ask_person
    from ratchet.tools import sleep as sleep
    from ratchet.tools import sleep_until as sleep_until
    from ratchet.tools import start_runs as start_runs
    from ratchet.tools import tool as tool
    from ratchet.tools import wait_for_event as wait_for_event
    from ratchet.tools import wait_for_reply as wait_for_reply

_EXPORTS = {
    "ratchet.client": (
        "AsyncClient",
        "Checkpoint",
        "Client",
        "EventSent",
        "HookOpened",
        "Run",
        "RunListed",
        "RunPage",
        "Started",
        "WaitTimedOut",
    ),
    "ratchet.errors": ("RatchetError", "RunNotFound"),
    "ratchet.runs": ("RunRequestInvalid",),
    "ratchet.runtime": ("connect",),
    "ratchet.state": ("RunStatus",),
    "ratchet.tools": (
        "Agent",
        "Done",
        "ForkRefused",
        "PermanentError",
        "RunContext",
        "RunData",
        "RunSpec",
        "RunState",
        "StepView",
        "ToolCall",
        "ToolContext",
        "ToolResult",
        "ask_person",
        "sleep",
        "sleep_until",
        "start_runs",
        "tool",
        "wait_for_event",
        "wait_for_reply",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


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
