"""The CLI on a Postgres store, in real processes: `ratchet run` works a run to its end,
`start` and `worker --until-idle` work one through a person's approval, and `status`,
`history`, `list` and `approve` read and decide it there."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ratchet.state import RunStatus
from tests.postgres_support import Cluster
from tests.processes import Cli

BATCHES = 2  # 1 inspect, 2-3 copy, 4 ask, 5 drop, 6 email, 7 done


@dataclass
class PostgresCli(Cli):
    url: str = ""

    @property
    def store(self) -> str:
        return self.url


@pytest.fixture
def cli(
    postgres: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PostgresCli]:
    # The files a Postgres store's processes keep on their host (each run's folder, the
    # approval key) are in the working directory's .ratchet: the test's, for every process.
    monkeypatch.chdir(tmp_path)
    name = postgres.fresh_database()
    yield PostgresCli(tmp_path, url=postgres.url(name))
    postgres.drop_database(name)


def test_ratchet_run_works_the_migration_on_postgres_then_again_once_approved(
    cli: PostgresCli,
) -> None:
    # `ratchet run` works the run until it asks a person, and exits saying so
    cli.ok("run", "--scenario", "migration", "--run-id", "mig", "--batches", str(BATCHES))
    assert cli.head("mig").status is RunStatus.WAITING
    cli.ok("approve", "mig", "--comment", "ok", "--by", "tester")
    cli.work_until_idle()
    assert cli.head("mig").status is RunStatus.DONE
    report = cli.verify("mig")
    assert report["ok"], report


def test_start_worker_approve_status_history_list_on_postgres(cli: PostgresCli) -> None:
    # Given a run started on an empty database, which the start makes a store
    cli.ok("start", "--scenario", "migration", "--run-id", "mig", "--batches", str(BATCHES))

    # When a worker works it until it asks a person, who approves, and a worker finishes it
    cli.work_until_idle("first")
    status = cli.json("status", "mig")
    assert status["status"] == "waiting", status
    cli.ok("approve", "mig", "--comment", "ok", "--by", "tester")
    cli.work_until_idle("second")

    # Then every reading command reads the run there, done, each step committed once
    assert cli.json("status", "mig")["status"] == "done"
    steps = [c["step"] for c in cli.json("history", "mig")["checkpoints"] if c["event"] == "step"]
    assert steps, "no step committed"
    assert steps == sorted(set(steps)), steps
    listed = cli.json("list")
    assert [run["run_id"] for run in listed["runs"]] == ["mig"], listed
    report = cli.verify("mig")
    assert report["ok"], report


def test_commands_not_built_on_postgres_say_so_in_one_line(cli: PostgresCli) -> None:
    cli.ok("start", "--scenario", "migration", "--run-id", "mig")
    for command in (["gc", "--older-than", "30"], ["migrate"], ["demo"]):
        refused = cli.run(*command)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert "not built on a postgresql:// store yet" in lines[0], lines


def test_the_quick_read_path_hands_a_postgres_store_to_the_full_cli(cli: PostgresCli) -> None:
    cli.ok("start", "--scenario", "migration", "--run-id", "mig")
    said = json.loads(cli.ok("--json", "status", "mig"))
    assert said["run_id"] == "mig", said
