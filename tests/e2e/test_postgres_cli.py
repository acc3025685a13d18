"""The CLI on a Postgres store, in real processes: `ratchet run` works a run to its end,
`start` and `worker --until-idle` work one through a person's approval, `status`,
`history`, `list` and `approve` read and decide it there, and `send`, `wake`, `cancel`,
`retry`, `fork` and `schedule` steer runs there, each with the outcome it has on SQLite."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ratchet.runtime.local import LocalSettings
from ratchet.runtime.postgres import PostgresRuntime
from ratchet.state import RunStatus
from tests.postgres_support import Cluster
from tests.processes import Cli
from tests.waits_agent import AGENT as WAITS

PASSED = '{"conclusion": "success", "url": "https://ci.example/1"}'

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
    for command in (["gc", "--older-than", "30"], ["migrate"], ["deliveries"], ["serve"]):
        refused = cli.run(*command)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert "not built on a postgresql:// store yet" in lines[0], lines


def test_the_quick_read_path_hands_a_postgres_store_to_the_full_cli(cli: PostgresCli) -> None:
    cli.ok("start", "--scenario", "migration", "--run-id", "mig")
    said = json.loads(cli.ok("--json", "status", "mig"))
    assert said["run_id"] == "mig", said


def test_send_and_wake_steer_a_waiting_run_on_postgres(cli: PostgresCli) -> None:
    # Given a run that waits for an event, then naps
    cli.ok("start", "--agent", WAITS, "--run-id", "w1", "--param", "nap=true")
    cli.work_until_idle("first")
    assert cli.head("w1").waiting is not None

    # When the event is sent, a worker takes it and the run sleeps, and it is woken early
    sent = cli.ok("send", "w1", "ci-finished", "--data", PASSED, "--id", "gh-1")
    cli.work_until_idle("second")
    sleeping = cli.head("w1")
    woken = cli.ok("wake", "w1", "--by", "dana")
    cli.work_until_idle("third")

    # Then each said what it did, and the run took the event and finished, woken
    assert (
        sent == "w1: event 'ci-finished' (gh-1) delivered at step 1; the next free worker resumes "
        "the run (or: ratchet run --run-id w1)\n"
    )
    assert sleeping.waiting is not None
    assert sleeping.waiting.kind == "timer", sleeping.waiting
    assert woken == (
        "w1: woken at step 2; the next free worker resumes it (or: ratchet run --run-id w1)\n"
    )
    done = cli.head("w1")
    assert done.status is RunStatus.DONE, done
    assert (done.summary or "").startswith("finished after: Woken early by dana"), done.summary
    history = cli.ok("history", "w1")
    assert "event 'ci-finished' arrived (gh-1)" in history, history
    again = cli.run("send", "w1", "ci-finished", "--data", PASSED)
    assert again.returncode == 2, again.stderr
    assert "takes no more events" in again.stderr, again.stderr


def test_cancel_fork_and_retry_steer_runs_on_postgres(cli: PostgresCli) -> None:
    # Given a migration waiting for its approval, and one failed by a step that crashes
    # its worker at every attempt
    cli.ok("start", "--scenario", "migration", "--run-id", "mig", "--batches", str(BATCHES))
    cli.work_until_idle("first")
    assert cli.head("mig").status is RunStatus.WAITING
    cli.ok("start", "--scenario", "migration", "--run-id", "crashes", "--batches", str(BATCHES))
    crashing = cli.run(
        "worker", "--until-idle", "--lease-seconds", "0.5", fault="raise:before_commit@1"
    )
    assert crashing.returncode == 0, crashing.stderr
    failed = cli.head("crashes")
    assert failed.status is RunStatus.FAILED, failed

    # When the waiting run is forked as of step 2 and then cancelled, and the failed one
    # retried and worked
    cli.ok("fork", "mig", "--from-step", "2", "--run-id", "mig-fork")
    cli.ok("cancel", "mig", "--reason", "wrong table", "--by", "dana")
    cli.ok("retry", "crashes")
    cli.work_until_idle("second")

    # Then the source is cancelled with its checkpoints, the fork went its own way from step
    # 2, and the retried run went past the step that failed, to its approval
    status = cli.json("status", "mig")
    assert (status["status"], status["summary"]) == ("cancelled", "Cancelled by dana: wrong table")
    refused = cli.run("cancel", "mig")
    assert refused.returncode == 2, refused.stderr
    assert "already cancelled" in refused.stderr
    fork = cli.head("mig-fork")
    assert fork.status is RunStatus.WAITING, fork
    history = cli.json("history", "mig-fork")["checkpoints"]
    assert history[0]["step"] == 2, history[0]
    retried = cli.head("crashes")
    assert retried.status is RunStatus.WAITING, retried
    assert retried.step > failed.step
    not_failed = cli.run("retry", "mig-fork")
    assert not_failed.returncode == 2
    assert "only a failed run can be retried" in not_failed.stderr


def test_schedule_add_fire_pause_resume_remove_on_postgres(cli: PostgresCli) -> None:
    # Given a schedule added through the command, its first time moved back so it is due
    cli.ok(
        "schedule",
        "add",
        "nightly",
        "--agent",
        "migration",
        "--every",
        "1m",
        "--input",
        json.dumps({"batches": BATCHES}),
    )
    runtime = PostgresRuntime.open(LocalSettings(store=cli.url), create=False)
    try:
        book = runtime.schedules
        (added,) = book.all()
        back = timedelta(minutes=10)
        due = added.model_copy(
            update={"anchor": added.anchor - back, "next_fire": added.next_fire - back}
        )
        assert book.replace(due, expected=added)
    finally:
        runtime.close()

    # When a worker runs, and the schedule is paused, resumed and removed
    cli.work_until_idle("fires")
    (row,) = cli.json("schedule", "list")["schedules"]
    paused = cli.json("schedule", "pause", "nightly")
    resumed = cli.json("schedule", "resume", "nightly")
    cli.ok("schedule", "remove", "nightly")

    # Then the worker fired it once, starting the run it names, which it worked to its
    # approval; the schedule moved on, and each command did as it says
    runs = [run["run_id"] for run in cli.json("list")["runs"]]
    assert runs == [row["last_run"]], (runs, row)
    assert row["last_run"].startswith("nightly-"), row
    assert cli.head(row["last_run"]).status is RunStatus.WAITING
    assert datetime.fromisoformat(row["next_fire"]) > datetime.now(UTC) - timedelta(minutes=1)
    assert (paused["paused"], resumed["paused"]) == (True, False), (paused, resumed)
    assert cli.json("schedule", "list")["schedules"] == []
