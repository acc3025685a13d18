"""A step of a run with a key, on AWS's slots (DynamoDB on moto) and a real engine on a local
store: it takes its key's slot and its agent's, and when its agent's slot is not free it gives
its key's back before it waits, so a run held back by its agent holds back no run of its key."""

from __future__ import annotations

import logging

from ratchet.adapters.dynamodb.slots import DynamoDbSlots
from ratchet.engine import Engine, Outcome
from ratchet.ports import ConcurrencyBound
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions, RunState
from tests.bounded_agent import AGENT, agent
from tests.dynamodb_support import SETTINGS, serialized_moto_tables

LOG = logging.getLogger("ratchet.tests.fair_share_steps")
BOUND = ConcurrencyBound("bounded", 1, per_key=2)
"""One run of the agent at work at once, and two of a key."""


def test_a_step_whose_agent_has_no_free_slot_gives_its_keys_slot_back_and_waits(tmp_path):
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db"))
    with serialized_moto_tables() as client:
        slots = DynamoDbSlots(client, SETTINGS.checkpoints_table)
        engine = Engine(
            store=runtime.store,
            ledger=runtime.ledger,
            blobs=runtime.blobs,
            bind=runtime.bind,
            worker_id="w1",
            logger=LOG,
            slots=slots,
            limits=lambda _: BOUND,
        )
        options = RunOptions(params={**agent.default_params, "log": str(tmp_path / "steps.log")})
        engine.start(
            RunState(run_id="r1", agent=AGENT, goal="Work", options=options, concurrency_key="acme")
        )
        # Given the agent's one slot held by a step of another run.
        assert slots.take(BOUND.agent, 1, "other", 600)

        # When the run's step comes.
        queued = engine.advance("r1")

        # Then it waits, holding neither slot, and has used no attempt.
        assert queued.outcome is Outcome.QUEUED
        assert slots.holders(BOUND.key_slots("acme")) == {}
        assert list(slots.holders(BOUND.agent)) == ["other"]
        assert engine.load("r1").attempts == 0

        # And once the agent's slot is free, the step is taken and both slots given back.
        slots.release(BOUND.agent, "other")
        taken = engine.advance("r1")
        assert taken.outcome is Outcome.CONTINUE
        assert engine.load("r1").step == 1
        assert slots.holders(BOUND.key_slots("acme")) == {}
        assert slots.holders(BOUND.agent) == {}
    runtime.close()
