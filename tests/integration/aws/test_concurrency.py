"""The bound on a deployed agent's concurrent steps, with the state machine executing on moto:
five runs of an agent with `max_concurrent=2` started at once never have more than two steps
at work; a run that finds both slots taken waits in `Queued` (a Wait state) without using an
attempt, and every run finishes. The slots are given back: none is held at the end."""

from __future__ import annotations

import time

from ratchet.adapters.dynamodb.slots import DynamoDbSlots
from ratchet.state import RunStatus
from tests.integration.aws.agents import IN_FLIGHT, WORLD
from tests.integration.aws.harness import AGENTS, TABLES, Stack, entered_states

RUNS = [f"bounded-{n}" for n in range(5)]


def _queued(stack: Stack, names: list[str]) -> bool:
    return any("Queued" in entered_states(stack.history(name)) for name in names)


def test_five_runs_bounded_at_two_never_have_more_than_two_steps_at_work(stack: Stack):
    stack.configure(queue_retry_seconds=1)
    IN_FLIGHT.open.clear()
    names = []
    for run_id in RUNS:
        status, started = stack.post_run(
            {"agent": "bounded", "run_id": run_id, "input": {"batches": 2}}
        )
        assert status == 201, started
        names.append(started["execution_name"])

    deadline = time.monotonic() + 60
    # Two runs hold the slots, in their tools, and a third found none.
    while not (IN_FLIGHT.now == 2 and _queued(stack, names)):
        assert IN_FLIGHT.now <= 2, f"{IN_FLIGHT.now} steps of a bound-2 agent at work"
        assert time.monotonic() < deadline, "no run waited for a slot"
        time.sleep(0.05)
    IN_FLIGHT.open.set()

    for name in names:
        assert stack.finished(name, timeout=120)["status"] == "SUCCEEDED"
    assert IN_FLIGHT.most == 2
    for run_id in RUNS:
        head = stack.head(run_id)
        assert head.status is RunStatus.DONE
        assert head.attempts <= 1, "a queued step used an attempt"
        assert sorted(WORLD.deliveries_of(run_id).values()) == [1, 1]  # each step applied once
    agent = stack.head(RUNS[0]).agent
    assert agent == AGENTS["bounded"]
    slots = DynamoDbSlots(stack.dynamodb, TABLES["checkpoints"])
    assert slots.holders(agent) == {}  # every step gave its slot back
