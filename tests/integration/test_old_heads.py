"""A run stored whole by an older Ratchet (schema 1 or 2: no static part) stays readable after
today's code commits it: its first lean commit writes the static part it lacked. Before
`ratchet migrate` ever runs, a worker may take such a run's next step."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ratchet.runtime import open_runtime
from ratchet.state import RunState
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
