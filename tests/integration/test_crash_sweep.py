"""The crash-point sweep, in-process: raise at every fault point of several steps of the
migration scenario, resume in a fresh runtime, and end with exactly the effects of a run that
never crashed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ratchet.engine import Outcome
from ratchet.errors import InjectedFault
from ratchet.faults import STEP_POINTS, FaultPlan, FaultPoint
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.scenarios.migration import agent as migration
from ratchet.state import PersonDecided, RunOptions, RunState, RunStatus

LOG = logging.getLogger("ratchet.tests.sweep")
BATCHES = 3
# 1 inspect, 2-4 copy, 5 ask, (approve), 6 drop, 7 email, 8 DONE
STEPS = [1, 2, 4, 5, 6, 7, 8]


def _runtime(root: Path) -> LocalRuntime:
    return LocalRuntime.open(LocalSettings(store=f"sqlite:///{root / 'ratchet.db'}"))


def _start(root: Path) -> None:
    runtime = _runtime(root)
    options = RunOptions(params={"batches": BATCHES})
    assert migration.prepare is not None
    migration.prepare(runtime.context("mig", options))
    state = RunState(run_id="mig", agent="migration", goal=migration.goal_for(options.params))
    runtime.engine(worker_id="starter", logger=LOG).start(
        state.model_copy(update={"options": options})
    )
    runtime.close()


def _drive(root: Path, faults: FaultPlan) -> bool:
    """Advance until the run stops or a fault fires (True). Approves when asked."""
    runtime = _runtime(root)
    engine = runtime.engine(
        worker_id="crashy" if faults.faults else "clean", logger=LOG, faults=faults
    )
    try:
        for _ in range(50):
            try:
                outcome = engine.advance("mig")
            except InjectedFault:
                return True
            if outcome.outcome is Outcome.WAITING:
                engine.decide_waiting("mig", PersonDecided(approved=True, by="tester"))
            elif outcome.outcome is not Outcome.CONTINUE:
                return False
        raise AssertionError("the run did not stop")
    finally:
        runtime.close()


def _effects(root: Path) -> dict[str, Any]:
    runtime = _runtime(root)
    try:
        head = runtime.store.load_head("mig")
        assert head is not None
        assert migration.verify is not None
        report = migration.verify(runtime.context("mig", head.options), head)
        calls = [
            (c.step, c.event.call.name, c.event.call.arguments)
            for c in runtime.store.list_checkpoints("mig")
            if c.event.kind == "step"
        ]
    finally:
        runtime.close()
    report.pop("keys_delivered")  # a crash after the tool redelivers a key: that is the point
    return {"status": head.status, "summary": head.summary, "report": report, "calls": calls}


@pytest.fixture(scope="module")
def crash_free(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("crash-free")
    _start(root)
    assert _drive(root, FaultPlan()) is False
    effects = _effects(root)
    assert effects["status"] is RunStatus.DONE
    assert effects["report"]["ok"] is True
    assert effects["report"]["legacy_dropped"] is True
    return effects


@pytest.mark.parametrize("point", STEP_POINTS)
@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_point_resumes_to_the_same_effects(tmp_path, crash_free, point, step):
    _start(tmp_path)

    crashed = _drive(tmp_path, FaultPlan.parse(f"raise:{point}@{step}"))
    _drive(tmp_path, FaultPlan())

    # DONE calls no tool: that point alone is never reached at the last step.
    reachable = not (step == 8 and point is FaultPoint.AFTER_TOOL)
    assert crashed is reachable
    assert _effects(tmp_path) == crash_free
