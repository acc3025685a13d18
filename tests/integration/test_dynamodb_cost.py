"""What a step costs on DynamoDB does not grow with the run: the same requests at step 50 as at
step 5, and the engine's bytes grow only by the width of its numbers. Counted by the
`before-send` hook of `bench.dynamodb_cost`, which `python -m bench.dynamodb_cost` runs to 500."""

from __future__ import annotations

from collections import Counter

from bench.dynamodb_cost import APP, ENGINE, DynamoDbBenchRun

GROWTH_MARGIN_BYTES = 64
"""Step 50 sends wider numbers than step 10 (version 101 against 21, batch 49 against 9, ids
48,001 against 8,001). A state that kept every message would add ~7 KB by step 50."""

ENGINE_REQUESTS = Counter(
    # load the head with its window's records (one Query); count the attempt; look up, then
    # record, the decision; commit
    {"Query": 1, "GetItem": 1, "UpdateItem": 1, "PutItem": 1, "TransactWriteItems": 1}
)
COPY_REQUESTS = Counter({"GetItem": 1, "TransactWriteItems": 1})
"""copy_batch: read the legacy batch; apply it and record its key in one transaction."""


def test_what_a_step_sends_does_not_grow_with_the_run():
    # Given a migration run with more batches than steps, so steps 2-51 all copy a batch
    with DynamoDbBenchRun(batches=52) as run:
        # When it runs 50 steps, one Engine.advance each, with every request counted
        costs = run.advance_to(50)

    # Then every step from 5 to 50 sends the same requests: nothing a step does grows
    copies = [cost for cost in costs if cost.step >= 5]
    assert [c.step for c in copies] == list(range(5, 51))
    for cost in copies:
        assert cost.by_operation(ENGINE) == ENGINE_REQUESTS, cost.step
        assert cost.by_operation(APP) == COPY_REQUESTS, cost.step
    # And the engine's bytes grow only by the width of its numbers
    early, late = costs[10 - 1], costs[50 - 1]
    assert (early.step, late.step) == (10, 50)
    assert 0 <= late.bytes(ENGINE) - early.bytes(ENGINE) <= GROWTH_MARGIN_BYTES
    # The app's copy is its own business (a 1,000-row batch), and bounded the same way.
    assert abs(late.bytes(APP) - early.bytes(APP)) <= 0.05 * early.bytes(APP)


def test_a_step_counts_its_attempt_before_any_work_and_commits_last():
    with DynamoDbBenchRun(batches=2) as run:
        (first,) = run.advance_to(1)

    operations = [r.operation for r in first.requests]
    assert operations[:2] == ["Query", "UpdateItem"]  # load the head, count the attempt
    assert operations[-1] == "TransactWriteItems"  # the commit
    assert first.by_operation(ENGINE) == ENGINE_REQUESTS
    assert first.by_operation(APP) == Counter({"GetItem": 1})  # inspect_table reads META


MAX_WRITE_UNITS = 12
"""Write units a step of the scripted agent may cost (24 before issue 9, when every commit
rewrote a 5 KB head inside the transaction and the ledger kept the result again)."""


def test_a_step_of_the_scripted_agent_costs_at_most_12_write_units():
    # Given the scripted agent: 200 B of arguments and a 1 KB result a step
    with DynamoDbBenchRun(batches=30, scripted=True) as run:
        costs = run.advance_to(25)

    # Then every step from 5 on costs the same write units, at most half of what it did
    units = {cost.write_units(ENGINE) for cost in costs if cost.step >= 5}
    assert len(units) == 1, units
    assert units.pop() <= MAX_WRITE_UNITS
