from __future__ import annotations

import re

import pytest

from ratchet.errors import InjectedFault, InvalidInput, UnsupportedSchema
from ratchet.faults import Fault, FaultAction, FaultPlan, FaultPoint
from ratchet.migrations import upgrade_state
from ratchet.state import SCHEMA_VERSION, RunState


def test_a_fault_spec_parses_into_faults():
    plan = FaultPlan.parse("kill:after_tool@23, raise:before_commit@2, stop:after_model@4")

    assert plan.faults == (
        Fault(FaultAction.KILL, FaultPoint.AFTER_TOOL, 23),
        Fault(FaultAction.RAISE, FaultPoint.BEFORE_COMMIT, 2),
        Fault(FaultAction.STOP, FaultPoint.AFTER_MODEL, 4),
    )
    assert FaultPlan.parse(None).faults == ()
    assert FaultPlan.parse("  ").faults == ()


@pytest.mark.parametrize(
    "spec", ["kill", "explode:after_tool@1", "raise:during_lunch@1", "raise:after_tool@x"]
)
def test_a_bad_fault_spec_is_a_clear_error(spec):
    with pytest.raises(InvalidInput, match=re.escape("expected <raise|kill|stop>:<point>@<step>")):
        FaultPlan.parse(spec)


def test_a_raise_fault_fires_only_at_its_point_and_step():
    plan = FaultPlan.parse("raise:after_tool@3")

    plan.hit(FaultPoint.AFTER_TOOL, 2)
    plan.hit(FaultPoint.BEFORE_COMMIT, 3)
    with pytest.raises(InjectedFault, match=r"raise:after_tool@3"):
        plan.hit(FaultPoint.AFTER_TOOL, 3)


def _stored(**changes):
    return {**RunState(run_id="r", agent="a", goal="g").model_dump(mode="json"), **changes}


def test_a_current_state_loads_unchanged():
    raw = _stored()

    assert upgrade_state(raw) == raw


def test_a_newer_state_is_refused_with_a_clear_error():
    with pytest.raises(UnsupportedSchema, match="upgrade Ratchet before resuming it"):
        upgrade_state(_stored(schema_version=SCHEMA_VERSION + 1))


def test_old_states_are_upgraded_one_version_at_a_time():
    def v1_to_v2(state):
        return {**state, "goal": state["goal"].upper()}

    def v2_to_v3(state):
        return {**state, "agent": state["agent"] + "-v3"}

    upgraded = upgrade_state(
        _stored(schema_version=1), current=3, upgrades={1: v1_to_v2, 2: v2_to_v3}
    )

    assert (upgraded["schema_version"], upgraded["goal"], upgraded["agent"]) == (3, "G", "a-v3")


def test_a_missing_upgrade_step_is_refused():
    with pytest.raises(UnsupportedSchema, match="no upgrade from state schema 1 to 2"):
        upgrade_state(_stored(schema_version=1), current=2, upgrades={})


def test_a_stored_head_takes_version_and_attempts_from_the_store_columns():
    from ratchet.migrations import load_state

    text = RunState(run_id="r", agent="a", goal="g", version=3, attempts=0).model_dump_json()

    state = load_state(text, version=5, attempts=2)

    assert (state.version, state.attempts, state.goal) == (5, 2, "g")


def test_a_stored_head_of_a_newer_schema_is_refused():
    import json

    from ratchet.migrations import load_state

    newer = json.dumps(_stored(schema_version=SCHEMA_VERSION + 1))

    with pytest.raises(UnsupportedSchema, match="upgrade Ratchet"):
        load_state(newer, version=1, attempts=0)
