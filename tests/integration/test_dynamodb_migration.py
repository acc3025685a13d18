"""The migration scenario on DynamoDB, in-process: the engine and `AwsRuntime` (as the step
Lambda wires them) with the scripted model, the app data in the app table on moto."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratchet.client import Client
from ratchet.engine import Engine, Outcome
from ratchet.errors import IdempotencyConflict, InjectedFault
from ratchet.faults import FaultPlan
from ratchet.runtime.aws import AwsRuntime
from ratchet.scenarios import migration
from ratchet.scenarios.migration_data import BATCH_SIZE, SqliteMigrationData
from ratchet.scenarios.migration_dynamodb import DynamoDbMigrationData
from ratchet.state import PersonDecided, RunOptions, RunState, RunStatus
from ratchet.tools import RunContext
from tests.dynamodb_support import SETTINGS, moto_tables, new_client, scan
from tests.support import LOG

BATCHES = 3
"""Step 1 inspects, 2-4 copy, 5 asks; then 6 drops (if approved), 7 emails, DONE."""
COPY_OF_BATCH_2 = 3


@pytest.fixture
def client() -> Iterator[object]:
    with moto_tables() as client:
        yield client


def runtime(client) -> AwsRuntime:
    return AwsRuntime(SETTINGS, client)


def start(client, run_id: str = "m1", batches: int = BATCHES) -> RunState:
    params = {**migration.agent.default_params, "batches": batches}
    state = RunState(
        run_id=run_id,
        agent="migration",
        goal=migration.agent.goal_for(params),
        options=RunOptions(params=params),
    )
    aws = runtime(client)
    # What starting a run through the API does: seed the app data, then create the run.
    migration.prepare(aws.context(run_id, state.options))
    assert aws.engine(worker_id="api", logger=LOG).start(state)
    return state


def work(engine: Engine, run_id: str = "m1") -> Outcome:
    """Advance until the run stops moving, as the state machine's Step/Route loop does."""
    for _ in range(50):
        outcome = engine.advance(run_id).outcome
        if outcome is not Outcome.CONTINUE:
            return outcome
    raise AssertionError(f"run {run_id} did not stop")


def verify(client, run_id: str = "m1") -> dict[str, Any]:
    aws = runtime(client)
    state = aws.engine(worker_id="cli", logger=LOG).load(run_id)
    return migration.verify(aws.context(run_id, state.options), state)


def test_the_migration_runs_to_done_on_dynamodb_with_a_person_approving(client):
    # Given a started migration run, stepped by a "Lambda" with a client of its own
    start(client)
    engine = runtime(new_client()).engine(worker_id="step-lambda", logger=LOG)

    # When it runs until it asks, a person approves, and it runs on
    assert work(engine) is Outcome.WAITING
    waiting = engine.load("m1")
    assert waiting.waiting is not None
    assert "Drop legacy_orders" in waiting.waiting.request.prompt
    engine.decide_waiting("m1", PersonDecided(approved=True, by="ops@example.com"))
    assert work(engine) is Outcome.DONE

    # Then every row was copied once, the legacy table was dropped, one email went out
    final = engine.load("m1")
    assert final.status is RunStatus.DONE
    assert "was dropped" in (final.summary or "")
    report = verify(client)
    assert report["ok"] is True, report["problems"]
    assert (report["source_rows"], report["target_rows"]) == (3000, 3000)
    assert (report["duplicate_rows"], report["missing_rows"]) == (0, 0)
    assert (report["emails_sent"], report["legacy_dropped"]) == (1, True)
    # And the data lives in the app table, not on the function's disk
    sort_keys = [item["sk"]["S"] for item in scan(client, SETTINGS.app_table)]
    assert not [sk for sk in sort_keys if sk.startswith("LEGACY#")], "the drop purges them"
    assert len([sk for sk in sort_keys if sk.startswith("ORDERS#")]) == BATCHES
    assert not runtime(client).context("m1", final.options).workdir.exists()


def test_a_rejected_drop_keeps_the_legacy_table_and_still_reports(client):
    start(client)
    engine = runtime(client).engine(worker_id="step-lambda", logger=LOG)
    assert work(engine) is Outcome.WAITING

    engine.decide_waiting(
        "m1", PersonDecided(approved=False, by="ops@example.com", comment="not yet")
    )

    assert work(engine) is Outcome.DONE
    report = verify(client)
    assert report["ok"] is True, report["problems"]
    assert (report["legacy_dropped"], report["emails_sent"], report["target_rows"]) == (
        False,
        1,
        3000,
    )
    data = DynamoDbMigrationData(client, SETTINGS.app_table, "m1")
    assert data.inspect("legacy_orders") == "legacy_orders has 3,000 rows (3 batches of 1,000)."


def test_a_crash_after_copy_batch_and_before_its_checkpoint_applies_the_batch_once(client):
    # Given a step Lambda that dies after copy_batch (batch 2) ran, before the commit
    start(client)
    crashing = runtime(client).engine(
        worker_id="lambda-1",
        logger=LOG,
        faults=FaultPlan.parse(f"raise:after_tool@{COPY_OF_BATCH_2}"),
    )
    with pytest.raises(InjectedFault):
        work(crashing)
    assert crashing.load("m1").step == COPY_OF_BATCH_2 - 1

    # When the retry runs in a fresh container (new client, new runtime) to the end
    retry = runtime(new_client()).engine(worker_id="lambda-2", logger=LOG)
    assert work(retry) is Outcome.WAITING
    retry.decide_waiting("m1", PersonDecided(approved=True, by="ops@example.com"))
    assert work(retry) is Outcome.DONE

    # Then batch 2's key was delivered twice and applied once: no duplicate rows
    report = verify(client)
    assert report["ok"] is True, report["problems"]
    assert report["duplicate_rows"] == 0
    assert report["keys_delivered"] == report["keys_applied"] + 1
    orders = [
        item["sk"]["S"]
        for item in scan(client, SETTINGS.app_table)
        if item["sk"]["S"].startswith("ORDERS#000002#")
    ]
    assert orders == [f"ORDERS#000002#m1/step-{COPY_OF_BATCH_2}"]


# --- the app data's own guarantees -----------------------------------------------------------


@pytest.fixture
def data(client) -> DynamoDbMigrationData:
    data = DynamoDbMigrationData(client, SETTINGS.app_table, "d1")
    data.seed(2)
    return data


def test_seeding_twice_changes_nothing(client, data):
    before = scan(client, SETTINGS.app_table)

    data.seed(5)

    assert scan(client, SETTINGS.app_table) == before
    assert data.counts().source_rows == 2 * BATCH_SIZE


def test_a_redelivered_key_is_counted_not_applied_again(data):
    first = data.copy_batch(1, "d1/step-2")

    again = data.copy_batch(1, "d1/step-2")

    assert again == first == "Copied 1,000 rows (ids 1-1,000) in batch 1."
    counts = data.counts()
    assert (counts.target_rows, counts.duplicate_rows) == (1000, 0)
    assert (counts.keys_applied, counts.keys_delivered) == (1, 2)
    assert data.inspect("orders") == "orders has 1,000 rows (1 batches of 1,000)."


def test_the_same_key_with_other_arguments_is_refused_and_writes_nothing(client, data):
    data.copy_batch(1, "d1/step-2")
    before = scan(client, SETTINGS.app_table)

    with pytest.raises(IdempotencyConflict, match="d1/step-2"):
        data.copy_batch(2, "d1/step-2")
    with pytest.raises(IdempotencyConflict):
        data.send_email("a@example.com", "s", "b", "d1/step-2")

    assert scan(client, SETTINGS.app_table) == before


def test_verify_catches_a_batch_applied_under_two_keys(client, data):
    # A broken idempotency (a retried step given a new key) must show, not hide, in verify.
    data.copy_batch(1, "d1/step-2")
    data.copy_batch(1, "d1/step-9")

    counts = data.counts()

    assert (counts.target_rows, counts.duplicate_rows, counts.missing_rows) == (2000, 1000, 1000)
    state = RunState(run_id="d1", agent="migration", goal="g", status=RunStatus.DONE)
    context = runtime(client).context("d1", state.options)
    report = migration.verify(context, state)
    assert report["ok"] is False
    assert "1000 rows were copied twice" in report["problems"]


def test_emails_are_sent_once_per_key(data):
    data.send_email("a@example.com", "subject", "body", "d1/step-7")
    data.send_email("a@example.com", "subject", "body", "d1/step-7")

    assert data.counts().emails_sent == 1


def test_nothing_is_copied_after_the_drop(data):
    data.copy_batch(1, "d1/step-2")
    assert data.drop_source("d1/step-4") == "Dropped legacy_orders."

    with pytest.raises(RuntimeError, match="dropped"):
        data.copy_batch(2, "d1/step-5")

    counts = data.counts()
    assert (counts.legacy_dropped, counts.target_rows, counts.keys_applied) == (True, 1000, 2)
    assert data.inspect("legacy_orders") == "legacy_orders no longer exists (dropped)."
    assert data.drop_source("d1/step-4") == "Dropped legacy_orders."


def test_a_copy_on_a_run_never_seeded_is_refused(client):
    data = DynamoDbMigrationData(client, SETTINGS.app_table, "never-seeded")

    with pytest.raises(RuntimeError, match="never seeded"):
        data.copy_batch(1, "never-seeded/step-2")

    assert scan(client, SETTINGS.app_table) == []


def test_the_app_data_of_two_runs_is_kept_apart(client, data):
    other = DynamoDbMigrationData(client, SETTINGS.app_table, "d2")
    other.seed(1)

    data.copy_batch(1, "shared-key")
    other.copy_batch(1, "shared-key")

    assert data.counts().target_rows == other.counts().target_rows == 1000
    assert (data.counts().source_rows, other.counts().source_rows) == (2000, 1000)


def test_the_sqlite_data_is_used_when_the_runtime_offers_no_table(tmp_path: Path):
    options = RunOptions(params={"batches": 1})
    context = RunContext(run_id="local", options=options, workdir=tmp_path / "w")

    migration.prepare(context)  # locally, the first step's open seeds the data
    assert not (tmp_path / "w").exists()
    data = migration.open_data(context)
    assert isinstance(data, SqliteMigrationData)
    data.close()

    assert (tmp_path / "w" / "app.db").is_file()
    state = RunState(run_id="local", agent="migration", goal="g", options=options)
    assert migration.verify(context, state)["source_rows"] == 1000


def test_a_fork_of_a_finished_migration_on_dynamodb_carries_the_rows_its_state_says_were_copied(
    client,
):
    # Given a migration finished on DynamoDB (3 batches copied at steps 2-4, dropped at 6)
    start(client)
    engine = runtime(client).engine(worker_id="step-lambda", logger=LOG)
    assert work(engine) is Outcome.WAITING
    engine.decide_waiting("m1", PersonDecided(approved=True, by="ops@example.com"))
    assert work(engine) is Outcome.DONE
    source_items = scan(client, SETTINGS.app_table)

    # When it is forked after its second copy, as the runs API forks on AWS, and worked
    forked = Client(runtime(client)).fork("m1", from_step=COPY_OF_BATCH_2, run_id="m1-f")
    assert work(engine, "m1-f") is Outcome.WAITING
    engine.decide_waiting("m1-f", PersonDecided(approved=True, by="ops@example.com"))
    assert work(engine, "m1-f") is Outcome.DONE

    # Then the fork's partition holds the source's first two copies (under the source's keys)
    # and its own third, each once; the source's partition is as it was
    assert forked.step == COPY_OF_BATCH_2
    report = verify(client, "m1-f")
    assert report["ok"] is True, report["problems"]
    assert (report["missing_rows"], report["duplicate_rows"]) == (0, 0)
    orders = sorted(
        item["sk"]["S"]
        for item in scan(client, SETTINGS.app_table)
        if item["pk"]["S"] == "migration#m1-f" and item["sk"]["S"].startswith("ORDERS#")
    )
    assert orders == [
        "ORDERS#000001#m1/step-2",
        f"ORDERS#000002#m1/step-{COPY_OF_BATCH_2}",
        "ORDERS#000003#m1-f/step-4",
    ]
    assert [i for i in scan(client, SETTINGS.app_table) if i["pk"]["S"] == "migration#m1"] == [
        i for i in source_items if i["pk"]["S"] == "migration#m1"
    ]
