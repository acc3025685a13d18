"""What a run left behind, and how a crash schedule's differs from the baseline's.

A run's outcome is its final status and summary, the steps it took (tool and arguments, and
what each returned), its durable data (`RunData`), its agent's own invariants (`verify`), the
effects the user's `effects` function sees, and how often each step asked the model. Times in
texts (a sleep's "Slept until ...") are masked: a crash schedule runs at another time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue

from ratchet.client import Client
from ratchet.faults import FaultPoint

TIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?( ?UTC|Z|[+-]\d{2}:?\d{2})?")
MAX_SHOWN = 3
"""Differences shown for one part of an outcome (the rest are counted)."""


def masked(text: str | None) -> str | None:
    return TIME.sub("<time>", text) if text is not None else None


class CrashKind(StrEnum):
    RAISE = "raise"
    """An exception at the point, in process; a fresh runtime resumes."""
    KILL = "kill"
    """SIGKILL of a real process at the point; a fresh process resumes."""


class Crash(BaseModel):
    """One crash schedule: where the run crashes, and how."""

    model_config = ConfigDict(frozen=True)

    step: int
    point: FaultPoint
    kind: CrashKind

    @property
    def fault(self) -> str:
        return f"{self.kind}:{self.point}@{self.step}"

    @property
    def words(self) -> str:
        how = "raised" if self.kind is CrashKind.RAISE else "killed"
        return f"step {self.step}, {self.point}, {how}"


class StepTaken(BaseModel):
    model_config = ConfigDict(frozen=True)

    step: int
    tool: str
    arguments: dict[str, Any]
    result: str | None


class Outcome(BaseModel):
    """What one run left behind (see the module's docstring)."""

    model_config = ConfigDict(frozen=True)

    status: str
    summary: str | None
    error: str | None
    steps: list[StepTaken]
    data: dict[str, str]
    verified: dict[str, Any] | None
    """The agent's `verify` report (None: the agent has no `verify`)."""
    effects: JsonValue = None
    model_calls: dict[int, int]
    """Step -> how often it asked the model."""
    asked_whether_ran: list[int]
    """The steps at which a person was asked whether an at-most-once call ran."""


def observe(
    client: Client,
    run_id: str,
    *,
    effects: Callable[[], Any] | None,
    model_calls: dict[int, int],
    asked_whether_ran: list[int],
    has_verify: bool,
) -> Outcome:
    run = client.get(run_id)
    head = client.head(run_id)
    steps = [
        StepTaken(
            step=c.step, tool=c.tool, arguments=dict(c.arguments or {}), result=masked(c.result)
        )
        for c in client.history(run_id)
        if c.event == "step" and c.tool is not None
    ]
    data = client.runtime.context(run_id, head.options).data
    verified = client.verify(run_id) if has_verify else None
    return Outcome(
        status=run.status.value,
        summary=masked(run.summary),
        error=run.error,
        steps=steps,
        data=dict(data.items()) if data is not None else {},
        verified=verified,
        effects=effects() if effects is not None else None,
        model_calls=model_calls,
        asked_whether_ran=asked_whether_ran,
    )


class Verdict(BaseModel):
    """How a crash schedule ended, next to the baseline."""

    model_config = ConfigDict(frozen=True)

    crash: Crash
    reached: bool
    """Whether the crash happened (a point a step does not pass never fires)."""
    differences: list[str]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not self.differences


def compare(
    baseline: Outcome, outcome: Outcome, crash: Crash, *, reached: bool, side_effects: set[str]
) -> Verdict:
    """The differences that matter (the outcome is not the baseline's), and notes on those that
    do not (a tool whose result reads otherwise the second time, say)."""
    differences: list[str] = []
    notes: list[str] = []
    # A person asked whether an at-most-once call ran answers in the step's result: the run's
    # texts may read otherwise from there on, by design (docs/at-most-once.md).
    asked = bool(outcome.asked_whether_ran)
    if asked:
        steps = ", ".join(str(s) for s in outcome.asked_whether_ran)
        notes.append(f"a person was asked whether the at-most-once call ran (step {steps})")
    if outcome.status != baseline.status:
        why = f" ({outcome.error})" if outcome.error else ""
        differences.append(f"the run ended {outcome.status}{why}, not {baseline.status}")
    taken = [(s.step, s.tool, s.arguments) for s in outcome.steps]
    expected = [(s.step, s.tool, s.arguments) for s in baseline.steps]
    reworded = False
    if taken != expected:
        said = "the run took other steps: " + _first_step_apart(outcome.steps, baseline.steps)
        (notes if asked else differences).append(said)
    else:
        for mine, theirs in zip(outcome.steps, baseline.steps, strict=True):
            if mine.result != theirs.result:
                reworded = True
                notes.append(
                    f"step {mine.step}'s result reads otherwise: {_short(mine.result)} ≠ "
                    f"{_short(theirs.result)}"
                )
    if outcome.summary != baseline.summary:
        # A tool called again under its key may say so ("already refunded"), and a summary
        # that echoes it reads otherwise too: words, not the world, which is compared below.
        said = f"the summary differs: {outcome.summary!r} ≠ {baseline.summary!r}"
        (notes if asked or reworded else differences).append(said)
    world = []
    sides: tuple[tuple[str, Any, Any], ...] = (
        ("effects", outcome.effects, baseline.effects),
        ("run data", outcome.data, baseline.data),
    )
    for what, seen, expected in sides:
        apart = _apart(seen, expected)
        if apart:
            world.append(f"{what} differ: {'; '.join(apart)}")
    if outcome.verified is not None and outcome.verified.get("ok") is not True:
        problems = outcome.verified.get("problems") or []
        world.append(
            "the agent's verify fails" + (f": {'; '.join(map(str, problems))}" if problems else "")
        )
    if world:
        applied_twice = _applied_twice(baseline, crash, reached, side_effects)
        if applied_twice is not None:
            differences.append(f"`{applied_twice}` applied twice ({'; '.join(world)})")
        else:
            differences += world
    differences += _paid_twice(baseline, outcome, crash, reached, asked=asked)
    return Verdict(crash=crash, reached=reached, differences=differences, notes=notes)


def _applied_twice(
    baseline: Outcome, crash: Crash, reached: bool, side_effects: set[str]
) -> str | None:
    """The side-effecting tool the crashed step ran before the crash (and its retry ran
    again), if it did: the likely author of a doubled effect."""
    if not reached or crash.point not in (FaultPoint.AFTER_TOOL, FaultPoint.BEFORE_COMMIT):
        return None
    tool = next((s.tool for s in baseline.steps if s.step == crash.step), None)
    return tool if tool in side_effects else None


def _paid_twice(
    baseline: Outcome, outcome: Outcome, crash: Crash, reached: bool, *, asked: bool
) -> list[str]:
    """A step that asked the model more often than the baseline's did. Only a crash between
    the model's answer and its record (`after_model`) may ask once more: the answer was lost.
    Anything else asked again a decision that was recorded, and paid for it twice. A run whose
    person was asked whether an at-most-once call ran took the answer as a step of its own,
    and its later decisions are a step further on: there the calls are counted in all."""
    if asked:
        calls, expected = sum(outcome.model_calls.values()), sum(baseline.model_calls.values())
        lost = 1 if reached and crash.point is FaultPoint.AFTER_MODEL else 0
        if calls > expected + lost:
            return [f"the run asked the model {calls} times, not {expected} (paid twice)"]
        return []
    found = []
    for step in sorted(set(outcome.model_calls) | set(baseline.model_calls)):
        calls, expected = outcome.model_calls.get(step, 0), baseline.model_calls.get(step, 0)
        lost = reached and crash.point is FaultPoint.AFTER_MODEL and crash.step == step
        if calls > expected + (1 if lost else 0):
            found.append(
                f"step {step} asked the model {calls} times, not {expected}: a recorded "
                "decision was asked again (paid twice)"
            )
    return found


def _first_step_apart(mine: list[StepTaken], theirs: list[StepTaken]) -> str:
    for a, b in zip(mine, theirs, strict=False):
        if (a.step, a.tool, a.arguments) != (b.step, b.tool, b.arguments):
            return f"step {a.step} called {a.tool} {a.arguments}, not {b.tool} {b.arguments}"
    if len(mine) > len(theirs):
        extra = mine[len(theirs)]
        return f"step {extra.step} called {extra.tool}, which the baseline never did"
    missing = theirs[len(mine)]
    return f"it never took step {missing.step} ({missing.tool})"


def _short(text: str | None, limit: int = 60) -> str:
    if text is None:
        return "None"
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def _apart(mine: Any, theirs: Any) -> list[str]:
    found = list(_walk(mine, theirs, ""))
    if len(found) > MAX_SHOWN:
        return [*found[:MAX_SHOWN], f"and {len(found) - MAX_SHOWN} more"]
    return found


def _walk(mine: Any, theirs: Any, path: str) -> Iterator[str]:
    where = path or "(the whole)"
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in sorted(set(mine) | set(theirs), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in theirs:
                yield f"{sub} is new: {_short(str(mine[key]))}"
            elif key not in mine:
                yield f"{sub} is gone"
            else:
                yield from _walk(mine[key], theirs[key], sub)
        return
    if isinstance(mine, list) and isinstance(theirs, list):
        if len(mine) != len(theirs):
            yield f"{where}: {len(mine)} items ≠ {len(theirs)}"
            return
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            yield from _walk(a, b, f"{path}[{index}]")
        return
    if mine != theirs:
        yield f"{where} {_short(str(mine), 40)} ≠ {_short(str(theirs), 40)}".replace("'", "")
