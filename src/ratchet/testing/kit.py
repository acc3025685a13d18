"""The pieces of a check, one at a time, for a test of your own: run an agent to its end (with
one crash, if you like), and call a tool twice under one key."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ratchet.faults import FaultPlan
from ratchet.testing.model import MODEL_ENV
from ratchet.testing.outcome import Crash, CrashKind, _apart
from ratchet.testing.runner import Schedule, ScheduleRun, Target, run_schedule
from ratchet.testing.script import WaitScript
from ratchet.tools import Tool, ToolContext


def run_agent(
    agent: str,
    root: Path,
    *,
    params: Mapping[str, Any] | None = None,
    script: WaitScript | Mapping[str, Any] | None = None,
    crash: Crash | str | None = None,
    effects: str | Callable[[], Any] | None = None,
    setup: str | Callable[[], Any] | None = None,
    recording: Path | None = None,
) -> ScheduleRun:
    """Run `agent` (`module:attr`) to its end in this process, on a scratch store in `root`
    (its working directory meanwhile), its waits answered by `script` on a fake clock (a
    week's sleep takes no time), with its scripted policy (or `recording` replayed). With
    `crash` (a `Crash`, or `"kill:after_tool@2"`) the run crashes there once, and goes on
    from its last checkpoint. `effects` and `setup` are zero-argument functions defined at
    a module's top level (or their `module:fn`). Returns what the run left behind
    (`outcome`), whether the crash happened (`reached`), the waits it answered and, without
    a crash, the direct test of each side-effecting call's key (`key_tests`)."""
    if isinstance(crash, str):
        (fault,) = FaultPlan.parse(crash).faults
        crash = Crash(step=fault.step, point=fault.point, kind=CrashKind(fault.action.value))
    target = Target(
        agent=agent,
        params=dict(params or {}),
        effects=_reference(effects),
        setup=_reference(setup),
        script=script
        if isinstance(script, WaitScript)
        else WaitScript.model_validate(script or {}),
        recording=recording,
    )
    here, model = os.getcwd(), os.environ.get(MODEL_ENV)
    try:
        return run_schedule(Schedule(target=target, root=root.resolve(), crash=crash))
    finally:
        os.chdir(here)
        if model is None:
            os.environ.pop(MODEL_ENV, None)
        else:
            os.environ[MODEL_ENV] = model


def _reference(function: str | Callable[[], Any] | None) -> str | None:
    if function is None or isinstance(function, str):
        return function
    name = getattr(function, "__qualname__", "")
    if "<" in name or not getattr(function, "__module__", None):
        raise TypeError(f"{function!r}: give a function defined at a module's top level")
    return f"{function.__module__}:{name}"


def assert_idempotent(
    tool: Tool[Any],
    args: BaseModel | Mapping[str, Any],
    *,
    effects: Callable[[], Any],
    resources: Any = None,
    key: str = "test/step-1",
) -> tuple[str, str]:
    """Call `tool` twice with the same key (`key`, `<run>/step-<n>`) and arguments, each time
    with a fresh context (`resources`: what the tool's context carries, or a zero-argument
    function that opens it anew), and fail (`AssertionError`) if the second call changes
    what `effects()` sees: the pattern's required test, `run/step-3` received twice, applied
    once. Returns what the two calls said."""
    run_id, _, step = key.rpartition("/step-")
    parsed = args if isinstance(args, BaseModel) else tool.parse(args)
    outputs = []
    after_first: Any = None
    for attempt in (1, 2):
        opened = resources() if callable(resources) else resources
        if inspect.isawaitable(opened):
            opened = asyncio.run(_awaited(opened))
        ctx = ToolContext(
            run_id=run_id or "test",
            step=int(step) if step.isdigit() else 1,
            idempotency_key=key,
            attempt=attempt,
            resources=opened,
        )
        outputs.append(asyncio.run(tool.call_async(parsed, ctx)).output)
        if attempt == 1:
            after_first = effects()
    after_second = effects()
    if after_second != after_first:
        changed = "; ".join(_apart(after_second, after_first))
        raise AssertionError(
            f"tool {tool.name!r} is not idempotent under its key {key}: called again with the "
            f"same key and arguments, it changed the effects ({changed})"
        )
    return outputs[0], outputs[1]


async def _awaited(value: Any) -> Any:
    return await value
