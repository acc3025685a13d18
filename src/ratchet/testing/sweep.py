"""The sweep: the baseline run without a crash, then a crash at every point of every step it
took, as an exception and as a killed process, each schedule resumed to its end and compared
with the baseline; the schedules run in parallel processes, within a budget of time.

This is the crash sweep Ratchet runs on its own engine (tests/integration/test_crash_sweep.py,
tests/e2e/test_sigkill.py), made public for a user's agent (`ratchet check`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ratchet.agents import load_agent
from ratchet.errors import InvalidInput
from ratchet.faults import FaultPoint
from ratchet.runs import RunRequestInvalid, request_problems
from ratchet.testing.outcome import Crash, CrashKind, Outcome, Verdict, compare
from ratchet.testing.runner import (
    CheckFailed,
    KeyTest,
    Schedule,
    ScheduleRun,
    Target,
    ToolCallSeen,
    run_schedule,
)

KINDS = (CrashKind.RAISE, CrashKind.KILL)
RAM_FOLDER = Path("/dev/shm")
POINT_ORDER = (
    FaultPoint.BEFORE_MODEL,
    FaultPoint.AFTER_MODEL,
    FaultPoint.AFTER_DECISION,
    FaultPoint.AFTER_CALL_STARTED,
    FaultPoint.AFTER_TOOL,
    FaultPoint.AFTER_CHILDREN_STARTED,
    FaultPoint.BEFORE_COMMIT,
    FaultPoint.AFTER_COMMIT,
    FaultPoint.AFTER_EVENT_ACCEPTED,
    FaultPoint.AFTER_WAIT_SETTLED,
)
"""The fault points in the order one step passes them (a wait's come after its commit)."""
WAIT_POINTS = {
    "person": (FaultPoint.AFTER_WAIT_SETTLED,),
    "call": (FaultPoint.AFTER_WAIT_SETTLED,),
    "event": (FaultPoint.AFTER_EVENT_ACCEPTED, FaultPoint.AFTER_WAIT_SETTLED),
    "children": (FaultPoint.AFTER_WAIT_SETTLED,),
}
"""The points a waker passes settling each kind of wait (a timer settles on the clock, at no
point of its own)."""


class CheckReport(BaseModel):
    """What a check found: the baseline, a verdict per crash schedule, the direct test of
    each side-effecting call's key, and how much of the sweep ran in how long."""

    model_config = ConfigDict(frozen=True)

    agent: str
    baseline: Outcome
    tools: list[ToolCallSeen]
    verdicts: list[Verdict]
    key_tests: list[KeyTest]
    planned: int
    """Crash schedules planned: every point of every step the baseline took, by each kind."""
    ran: int
    seconds: float
    """The whole check's time, the baseline included."""
    schedule_seconds: float
    """The schedules' time added up, across the processes."""
    processes: int
    budget_reached: bool
    sees_effects: bool
    """Whether an `effects` function showed the world; if not, only the run itself was
    compared."""

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts) and all(k.ok for k in self.key_tests)

    @property
    def differences(self) -> list[str]:
        """Every difference, one line each: `step 3, after_tool, killed: ...`."""
        lines = [f"{v.crash.words}: {d}" for v in self.verdicts for d in v.differences]
        lines += [
            f"step {k.step}, key {k.key}: `{k.tool}` is {k.said}"
            for k in self.key_tests
            if not k.ok
        ]
        return lines


def plan(baseline: ScheduleRun) -> list[Crash]:
    """Every crash schedule of the baseline: each point each of its steps passed, by each kind."""
    outcome = baseline.outcome
    calls = {c.step: c for c in baseline.calls}
    waits: dict[int, set[str]] = {}
    for answered in baseline.waits:
        waits.setdefault(answered["step"], set()).add(answered["kind"])
    steps = sorted(set(outcome.model_calls) | set(calls) | set(waits))
    crashes = []
    for step in steps:
        points = set(_points(step, step in outcome.model_calls, calls.get(step)))
        for kind in waits.get(step, ()):
            points.update(WAIT_POINTS.get(kind, ()))
        for point in POINT_ORDER:
            if point in points:
                crashes += [Crash(step=step, point=point, kind=kind) for kind in KINDS]
    return crashes


def _points(step: int, decided: bool, call: ToolCallSeen | None) -> Iterator[FaultPoint]:
    if decided:
        yield FaultPoint.BEFORE_MODEL
        yield FaultPoint.AFTER_MODEL
        yield FaultPoint.AFTER_DECISION
        yield FaultPoint.BEFORE_COMMIT
        yield FaultPoint.AFTER_COMMIT
    if call is not None:
        yield FaultPoint.AFTER_TOOL
        if call.at_most_once:
            yield FaultPoint.AFTER_CALL_STARTED
        if call.children:
            yield FaultPoint.AFTER_CHILDREN_STARTED


def check(
    agent: str,
    *,
    params: dict[str, Any] | None = None,
    effects: str | None = None,
    setup: str | None = None,
    script: Any = None,
    recording: Path | None = None,
    record_with: str | None = None,
    processes: int | None = None,
    budget: float | None = None,
    workdir: Path | None = None,
    crashes: Sequence[Crash] | None = None,
) -> CheckReport:
    """Check `agent` (`module:attr`, or a built-in scenario's name) against crashes; see the
    module's docstring and docs/testing-your-agent.md. `effects` and `setup` are `module:fn`
    references (each schedule imports them in its own process); `recording` replays a run's
    decisions instead of the agent's policy, and `record_with` (a model) records them first
    into `recording`. `crashes` limits the sweep to those schedules. The schedules' scratch
    folders are made in `workdir` (default: in memory, /dev/shm, where there is one; else the
    system's temporary folder) and removed at the end. Raises `InvalidInput`
    for a check that cannot run (no such agent, an effects function that raises, ...): for
    bad input, `ratchet.runs.RunRequestInvalid` naming its field, as a start refuses it."""
    from ratchet.testing.script import WaitScript

    started = time.perf_counter()
    loaded = load_agent(agent)
    given = dict(params or {})
    try:
        checked_params = loaded.params_for(given)
    except ValidationError as error:
        # As a start refuses it (`ratchet.runs`): the first problem and its field, not
        # pydantic's dump of the input and its model's name.
        (where, what), *_ = request_problems(error)
        raise RunRequestInvalid(
            f"bad input for agent {loaded.name!r}: {what}", f"input.{where}"
        ) from None
    except ValueError as error:
        raise RunRequestInvalid(" ".join(str(error).split()), "input") from None
    if loaded.policy is None and recording is None:
        raise InvalidInput(
            f"agent {loaded.name!r} has no scripted policy: check it from a recorded run "
            "(--from-run RUN --store URL) or record one (--record FILE)"
        )
    if record_with is not None and recording is None:
        raise InvalidInput("record_with needs the file to record into (recording)")
    target = Target(
        agent=agent,
        params=checked_params,
        effects=effects,
        setup=setup,
        script=script
        if isinstance(script, WaitScript)
        else WaitScript.model_validate(script or {}),
        recording=recording.resolve() if recording is not None else None,
    )
    scratch = Path(tempfile.mkdtemp(prefix="ratchet-check-", dir=workdir or _in_memory()))
    count = max(1, processes or os.cpu_count() or 1)
    pool = ProcessPoolExecutor(max_workers=count, mp_context=get_context("spawn"))
    try:
        if record_with is not None and recording is not None and not recording.exists():
            recorder = target.model_copy(update={"recording": None, "model": record_with})
            ran = _result(pool.submit(_run, Schedule(target=recorder, root=scratch / "record")))
            assert ran.recording is not None
            ran.recording.write(recording)
        baseline = _result(pool.submit(_run, Schedule(target=target, root=scratch / "baseline")))
        if baseline.outcome.status not in ("done", "failed", "cancelled"):
            raise InvalidInput(f"the run without a crash ended {baseline.outcome.status}")
        planned = list(crashes) if crashes is not None else plan(baseline)
        verdicts, ran_seconds, stopped = _sweep(
            pool, count, target, baseline, planned, scratch, started, budget
        )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(scratch, ignore_errors=True)
    order = {crash: index for index, crash in enumerate(planned)}
    verdicts.sort(key=lambda v: order[v.crash])
    return CheckReport(
        agent=agent,
        baseline=baseline.outcome,
        tools=baseline.calls,
        verdicts=verdicts,
        key_tests=baseline.key_tests,
        planned=len(planned),
        ran=len(verdicts),
        seconds=time.perf_counter() - started,
        schedule_seconds=ran_seconds,
        processes=count,
        budget_reached=stopped,
        sees_effects=effects is not None,
    )


def _in_memory() -> Path | None:
    """A folder in memory (Linux's /dev/shm), if this machine has one to write in. A schedule's
    store flushes each commit to disk, which is most of a schedule's time on a busy disk; a
    check crashes processes, not machines, and what a killed process wrote is kept by the
    operating system either way, so the flush proves nothing here."""
    return RAM_FOLDER if RAM_FOLDER.is_dir() and os.access(RAM_FOLDER, os.W_OK) else None


def _sweep(
    pool: ProcessPoolExecutor,
    width: int,
    target: Target,
    baseline: ScheduleRun,
    planned: list[Crash],
    scratch: Path,
    started: float,
    budget: float | None,
) -> tuple[list[Verdict], float, bool]:
    side_effects = {c.tool for c in baseline.calls if c.side_effect}
    pending: dict[Future[dict[str, Any]], Crash] = {}
    queue = list(enumerate(planned))
    verdicts: list[Verdict] = []
    seconds = 0.0
    # The pool is kept just full, so a budget reached leaves nothing queued in it.
    while queue or pending:
        over = budget is not None and time.perf_counter() - started > budget
        while queue and len(pending) < width and not over:
            index, crash = queue.pop(0)
            root = scratch / f"{index:04d}-{crash.step}-{crash.point}-{crash.kind}"
            schedule = Schedule(target=target, root=root, crash=crash)
            pending[pool.submit(_run, schedule)] = crash
        if not pending:
            return verdicts, seconds, bool(queue)
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            crash = pending.pop(future)
            ran = _result(future)
            seconds += ran.seconds
            verdicts.append(
                compare(
                    baseline.outcome,
                    ran.outcome,
                    crash,
                    reached=ran.reached,
                    side_effects=side_effects,
                )
            )
    return verdicts, seconds, False


def _run(schedule: Schedule) -> dict[str, Any]:
    """`run_schedule` in a pool process, its errors as data (they cross the process line).

    The pool process runs each schedule in a fork of itself, and imports what the schedules
    imported (the agent, its clients, the engine's parts), so the next fork finds everything
    loaded: a schedule, and the killed life it forks in turn, cost milliseconds, not the second
    a fresh interpreter takes to import them. The pool process itself runs no step, so it has
    none of the threads a step leaves behind (the agent's), and can go on forking."""
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return _answer(schedule)
    schedule.root.mkdir(parents=True, exist_ok=True)
    answered = schedule.root / "answer.json"
    pid = os.fork()
    if pid == 0:  # the child writes its answer and ends here, whatever happens
        code = 1
        try:
            loaded = set(sys.modules)
            said = _answer(schedule)
            said["imported"] = sorted(set(sys.modules) - loaded)
            answered.write_text(json.dumps(said), encoding="utf-8")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not answered.exists():
        where = schedule.crash.words if schedule.crash else "the run without a crash"
        return {"failed": f"{where}: the schedule's process died (exit {code})"}
    answer: dict[str, Any] = json.loads(answered.read_text(encoding="utf-8"))
    for name in answer.pop("imported", []):
        with contextlib.suppress(Exception):  # a module the schedule could import, and not we
            importlib.import_module(name)
    return answer


def _answer(schedule: Schedule) -> dict[str, Any]:
    try:
        return {"ran": run_schedule(schedule).model_dump(mode="json")}
    except InvalidInput as error:
        return {"invalid": str(error)}
    except Exception as error:  # the user's code: any failure stops the check, said in a line
        where = schedule.crash.words if schedule.crash else "the run without a crash"
        reason = " ".join(str(error).split())
        return {"failed": f"{where}: {type(error).__name__}: {reason}"}


def _result(future: Future[dict[str, Any]]) -> ScheduleRun:
    answer = future.result()
    if "invalid" in answer:
        raise InvalidInput(answer["invalid"])
    if "failed" in answer:
        raise CheckFailed(answer["failed"])
    return ScheduleRun.model_validate(answer["ran"])
