"""A run stored whole by an older Ratchet (schema 1 or 2: no static part) stays readable after
today's code commits it: its first lean commit writes the static part it lacked. Before
`ratchet migrate` ever runs, a worker may take such a run's next step."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from ratchet.runtime import open_runtime
from ratchet.state import RunState, StepCompleted
from tests.conformance.test_store_contract import new_run, step_commit
from tests.dynamodb_support import SETTINGS, moto_tables, store_of
from tests.fixtures.stores.make_schema_versions import FIXTURE

LOG = logging.getLogger("ratchet.tests.old_heads")


def test_a_whole_head_on_sqlite_stays_readable_after_the_new_code_commits_it(tmp_path: Path):
    shutil.copy(FIXTURE, tmp_path / "ratchet.db")
    runtime = open_runtime(f"sqlite:///{tmp_path}/ratchet.db", create=False)
    try:
        before = runtime.store.load_head("v1-running")
        engine = runtime.engine(worker_id="w", logger=LOG)
        first, second = engine.advance("v1-running"), engine.advance("v1-running")
        after = runtime.store.load_head("v1-running")
    finally:
        runtime.close()

    assert before is not None
    assert after is not None
    assert (first.step, second.step) == (before.step + 1, before.step + 2)
    assert (after.goal, after.options, after.agent) == (before.goal, before.options, before.agent)
    assert [m.step for m in after.messages][-1] == after.step


def _checkpoints_table(path: Path) -> str:
    with closing(sqlite3.connect(path)) as connection:
        (sql,) = connection.execute(
            "SELECT sql FROM sqlite_schema WHERE name = 'checkpoints'"
        ).fetchone()
    return " ".join(str(sql).split())


def test_a_store_an_older_ratchet_made_keeps_its_records_and_their_table(tmp_path: Path):
    # Given a store whose checkpoints table is WITHOUT ROWID and whose step records hold their
    # step, key and output's step and tool, as every Ratchet before wrote them
    store = tmp_path / "ratchet.db"
    shutil.copy(FIXTURE, store)
    assert _checkpoints_table(store).endswith("WITHOUT ROWID")
    runtime = open_runtime(f"sqlite:///{store}", create=False)
    try:
        before = runtime.store.list_checkpoints("v1-running")
        engine = runtime.engine(worker_id="w", logger=LOG)
        engine.advance("v1-running")
        after = runtime.store.list_checkpoints("v1-running")
    finally:
        runtime.close()

    # Then its records read as they did, today's lean one beside them, in the same table
    assert after[: len(before)] == before
    new = after[-1].event
    assert isinstance(new, StepCompleted)
    assert (new.step, new.key) == (after[-1].step, f"v1-running/step-{after[-1].step}")
    assert (new.output.step, new.output.tool) == (new.step, new.call.name)
    assert _checkpoints_table(store).endswith("WITHOUT ROWID")


def test_a_new_store_keeps_its_records_in_a_rowid_table_one_per_run_and_version(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    open_runtime(f"sqlite:///{store}").close()

    assert "WITHOUT ROWID" not in _checkpoints_table(store)
    with closing(sqlite3.connect(store)) as connection:
        row = ("r", 1, 0, "running", "w", 0, "2026-01-01T00:00:00+00:00", "{}")
        connection.execute("INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            connection.execute("INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)


def test_a_whole_head_on_dynamodb_stays_readable_after_the_new_code_commits_it():
    with moto_tables() as client:
        state, checkpoint = new_run("old")
        store = store_of(client)
        store.create_run(state, checkpoint)
        # As schema 2 stored it: the whole state in `state`, no `static` attribute
        whole = state.model_copy(update={"schema_version": 2}).model_dump_json()
        client.update_item(
            TableName=SETTINGS.checkpoints_table,
            Key={"run_id": {"S": "old"}, "sk": {"S": "HEAD"}},
            UpdateExpression="SET #state = :state REMOVE #static",
            ExpressionAttributeNames={"#state": "state", "#static": "static"},
            ExpressionAttributeValues={":state": {"S": whole}},
        )
        head = store.load_head("old")
        assert isinstance(head, RunState)

        store.commit(step_commit(head, 1))
        after = store.load_head("old")

    assert after is not None
    assert (after.step, after.goal, after.run_id) == (1, state.goal, "old")
