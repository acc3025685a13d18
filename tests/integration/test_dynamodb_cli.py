"""The CLI's read commands against deployed tables, black-box: moto in server mode on loopback
stands in for DynamoDB, and `ratchet --store dynamodb://...&endpoint=...` runs as a process.

The runs are made in this process through the adapters (the engine and `AwsRuntime`, as the
step Lambda would make them); the commands must read back exactly what the adapters see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flask", reason="moto's server mode needs moto[server] (flask, flask-cors)")


from ratchet.cli.inspection import status_payload
from ratchet.engine import Outcome
from ratchet.runtime.aws import AwsRuntime
from ratchet.scenarios import migration
from ratchet.state import PersonDecided, RunOptions, RunState
from tests.dynamodb_support import (
    REGION,
    SETTINGS,
    make_tables,
    moto_server,
    scan,
    server_client,
    server_store_url,
)
from tests.support import LOG

RATCHET = Path(sys.executable).with_name("ratchet")
TIMEOUT = 60
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
}
SCRUBBED_PREFIXES = ("AWS_", "RATCHET_", "ANTHROPIC_")


@dataclass
class Deployed:
    """Tables on a moto server, a done run `done-1` and a waiting run `wait-1` in them."""

    endpoint: str
    client: Any
    runtime: AwsRuntime

    def url(self, **overrides: str) -> str:
        return server_store_url(self.endpoint, **overrides)

    def ratchet(self, *args: str, store: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
        env |= FAKE_CREDENTIALS | {"AWS_CONFIG_FILE": os.devnull}
        env |= {"AWS_SHARED_CREDENTIALS_FILE": os.devnull}
        return subprocess.run(
            [str(RATCHET), "--store", store or self.url(), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def json(self, *args: str) -> dict[str, Any]:
        result = self.ratchet(*args, "--json")
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        (line,) = result.stdout.splitlines()
        payload: dict[str, Any] = json.loads(line)
        return payload

    def everything(self) -> dict[str, list[dict[str, Any]]]:
        tables = (SETTINGS.checkpoints_table, SETTINGS.idempotency_table, SETTINGS.app_table)
        return {table: scan(self.client, table) for table in tables}


def _start(runtime: AwsRuntime, run_id: str) -> None:
    params = {**migration.agent.default_params, "batches": 2}
    state = RunState(
        run_id=run_id,
        agent="migration",
        goal=migration.agent.goal_for(params),
        options=RunOptions(params=params),
    )
    migration.prepare(runtime.context(run_id, state.options))
    assert runtime.engine(worker_id="api", logger=LOG).start(state)


def _work(runtime: AwsRuntime, run_id: str) -> Outcome:
    engine = runtime.engine(worker_id="step-lambda", logger=LOG)
    for _ in range(30):
        outcome = engine.advance(run_id).outcome
        if outcome is not Outcome.CONTINUE:
            return outcome
    raise AssertionError(f"{run_id} did not stop")


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployed]:
    with moto_server() as endpoint:
        client = server_client(endpoint)
        make_tables(client)
        runtime = AwsRuntime(SETTINGS, client)
        _start(runtime, "done-1")
        assert _work(runtime, "done-1") is Outcome.WAITING
        runtime.engine(worker_id="api", logger=LOG).decide_waiting(
            "done-1", PersonDecided(approved=True, by="ops@example.com")
        )
        assert _work(runtime, "done-1") is Outcome.DONE
        _start(runtime, "wait-1")
        assert _work(runtime, "wait-1") is Outcome.WAITING
        yield Deployed(endpoint, client, runtime)


def assert_rejected(result: subprocess.CompletedProcess[str], *mentions: str) -> None:
    """The CLI contract for bad input: exit 2, one line on stderr, nothing on stdout."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    for mention in mentions:
        assert mention.lower() in line.lower(), (mention, line)


def test_status_history_and_show_read_what_the_adapters_wrote(deployed):
    head = deployed.runtime.store.load_head("done-1")
    assert head is not None

    assert deployed.json("status", "done-1") == json.loads(json.dumps(status_payload(head)))
    assert deployed.json("show", "done-1") == head.model_dump(mode="json")
    history = deployed.json("history", "done-1")
    checkpoints = deployed.runtime.store.list_checkpoints("done-1")
    assert history["run_id"] == "done-1"
    assert [(c["version"], c["step"], c["event"], c["bytes"]) for c in history["checkpoints"]] == [
        (c.version, c.step, c.event.kind, c.size) for c in checkpoints
    ]
    at_3 = deployed.json("show", "done-1", "--step", "3")
    assert (at_3["step"], [m["step"] for m in at_3["messages"]]) == (3, [1, 2, 3])


def test_verify_checks_the_app_data_in_the_app_table(deployed):
    done = deployed.json("verify", "done-1")
    waiting = deployed.json("verify", "wait-1")

    assert done["ok"] is True, done
    assert (done["source_rows"], done["target_rows"], done["duplicate_rows"]) == (2000, 2000, 0)
    assert (done["emails_sent"], done["legacy_dropped"]) == (1, True)
    assert (waiting["ok"], waiting["status"], waiting["target_rows"]) == (True, "waiting", 2000)


def test_the_store_can_come_from_ratchet_store(deployed):
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
    env |= FAKE_CREDENTIALS | {"RATCHET_STORE": deployed.url()}
    result = subprocess.run(
        [str(RATCHET), "status", "wait-1", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "waiting"


@pytest.mark.parametrize(
    "args",
    [("start", "--scenario", "migration", "--run-id", "new-1"), ("approve", "wait-1")],
    ids=lambda args: args[0],
)
def test_commands_that_write_refuse_a_dynamodb_store_and_change_nothing(deployed, args):
    # Every writing command is refused the same way; tests/unit/test_store_url.py has them all.
    before = deployed.everything()

    assert_rejected(deployed.ratchet(*args), args[0], "dynamodb://")

    assert deployed.everything() == before


def test_a_malformed_store_url_is_one_line_and_exit_2(deployed):
    # The parser's cases are in tests/unit/test_store_url.py; this is the process's contract.
    assert_rejected(deployed.ratchet("status", "done-1", store=deployed.url(ledger="")), "ledger")


def test_a_missing_run_and_a_missing_table_are_one_line_and_exit_2(deployed):
    assert_rejected(deployed.ratchet("history", "nope"), "nope")
    assert_rejected(
        deployed.ratchet("status", "done-1", store=deployed.url(table="no-such-table")),
        "store cannot be read",
        "ResourceNotFoundException",
    )


def test_migrate_indexes_the_runs_written_before_the_runs_index(deployed):
    # As a head last written by a Ratchet without the index: no index keys, no agent.
    for run_id in ("done-1", "wait-1"):
        deployed.client.update_item(
            TableName=SETTINGS.checkpoints_table,
            Key={"run_id": {"S": run_id}, "sk": {"S": "HEAD"}},
            UpdateExpression="REMOVE list_pk, list_sk, #agent",
            ExpressionAttributeNames={"#agent": "agent"},
        )
    assert deployed.json("list")["runs"] == []  # the list reads only the index

    assert deployed.json("migrate", "--dry-run") == {"indexed": 0, "unlisted": 2, "dry_run": True}
    assert deployed.json("list")["runs"] == []
    assert deployed.json("migrate") == {"indexed": 2, "unlisted": 2, "dry_run": False}
    listed = deployed.json("list")["runs"]
    assert sorted(r["run_id"] for r in listed) == ["done-1", "wait-1"]
    assert deployed.json("migrate")["indexed"] == 0  # once indexed, left alone
    said = deployed.ratchet("migrate")
    assert said.returncode == 0
    assert said.stdout.strip() == "indexed 0 runs written before the runs index"
