"""Fair shares with the state machine executing on moto: 30 runs of an agent with
`max_concurrent_per_key=2`, 10 of each of 3 keys, started through the runs API while every
slot of their keys is held, never
have more than 2 steps of a key at work (from the times each step's tool records), every run
ends, and those started with priority 9, after those of priority 0, wait less for their first
step once the slots free. Every key slot is given back, and no waiter is left."""

from __future__ import annotations

import json
import time
from statistics import mean

from ratchet.adapters.dynamodb.slots import DynamoDbSlots
from ratchet.ports import ConcurrencyBound
from ratchet.state import RunStatus
from tests.integration.aws.agents import TIMELINE
from tests.integration.aws.harness import AGENTS, TABLES, Stack, wait_until

KEYS = ("acme", "globex", "initech")
HIGH, LOW = 9, 0
KEYED = {**AGENTS, "keyed": "tests.integration.aws.agents:keyed"}


def test_thirty_runs_of_three_keys_bounded_at_two_a_key_and_the_high_priority_ones_first(
    stack: Stack,
):
    # Given each key's 2 slots held (by steps of other runs, say), and 10 runs of each of 3
    # keys, of an agent bounded at 2 runs a key, started meanwhile: in each key 5 of priority
    # 0 started first, then 5 of priority 9, every one waiting for a slot of its key.
    stack.configure(agents=json.dumps(KEYED), queue_retry_seconds=1)
    slots = DynamoDbSlots(stack.dynamodb, TABLES["checkpoints"])
    bound = ConcurrencyBound("keyed", None, per_key=2)
    blockers = [(bound.key_slots(key), f"blocker-{n}") for key in KEYS for n in range(2)]
    for name, holder in blockers:
        assert slots.take(name, 2, holder, 600)
    runs = [
        (f"{key}-{priority}-{n}", key, priority)
        for priority in (LOW, HIGH)
        for key in KEYS
        for n in range(5)
    ]
    names = []
    for run_id, key, priority in runs:
        body = {
            "agent": "keyed",
            "run_id": run_id,
            "input": {"batches": 2},
            "concurrency_key": key,
            "priority": priority,
        }
        status, started = stack.post_run(body)
        assert status == 201, started
        names.append(started["execution_name"])
    wait_until(
        lambda: all(len(slots.waiting(bound.key_slots(key))) == 10 for key in KEYS),
        timeout=120,
        what="every run to wait for a slot of its key",
    )

    # When the slots are given back, and the state machine works the runs.
    for name, holder in blockers:
        slots.release(name, holder)
    freed = time.time()
    for name in names:
        assert stack.finished(name, timeout=300)["status"] == "SUCCEEDED"

    # Then never more than 2 steps of a key were at work, and every run ended.
    most = {key: TIMELINE.most_at_once({r for r, k, _ in runs if k == key}) for key in KEYS}
    together = TIMELINE.most_at_once({r for r, _, _ in runs})
    print(f"most steps at work by key, bound 2 a key: {most}; of all keys at once: {together}")
    assert max(most.values()) <= 2, most
    assert together > 2, "no two keys were ever at work at once: the bound is not per key"
    for run_id, key, priority in runs:
        head = stack.head(run_id)
        assert (head.concurrency_key, head.priority) == (key, priority)
        assert head.status is RunStatus.DONE
        assert head.attempts <= 1, "a queued step used an attempt"

    # And those of priority 9 waited less for their first step than those of priority 0.
    waits = {
        priority: mean(TIMELINE.first_start(r) - freed for r, _, p in runs if p == priority)
        for priority in (HIGH, LOW)
    }
    print(
        f"mean wait for the first step: priority {HIGH} {waits[HIGH]:.3f} s, "
        f"priority {LOW} {waits[LOW]:.3f} s"
    )
    assert waits[HIGH] < waits[LOW], waits

    # And every key's slots were given back, no waiter left behind.
    for key in KEYS:
        assert slots.holders(bound.key_slots(key)) == {}
        assert slots.waiting(bound.key_slots(key)) == {}
