"""The CLI on a Postgres store, in real processes: `ratchet run` works a run to its end,
`start` and `worker --until-idle` work one through a person's approval, `status`,
`history`, `list` and `approve` read and decide it there, and `send`, `wake`, `cancel`,
`retry`, `fork` and `schedule` steer runs there, each with the outcome it has on SQLite;
`migrate` upgrades an older store, `gc` trims an old run, and `migrate --reencrypt` rewrites a
sealed store under a new key."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from ratchet.adapters.payload_keys import local_key_id, new_keyring_line
from ratchet.adapters.postgres.database import _SCHEMA, MARKER_TABLE, SCHEMA_VERSION
from ratchet.runtime.local import LocalSettings
from ratchet.runtime.postgres import PostgresRuntime
from ratchet.state import SCHEMA_VERSION as STATE_SCHEMA
from ratchet.state import RunStatus
from tests.fixtures import sealed_agent
from tests.postgres_support import Cluster
from tests.processes import PostgresCli
from tests.waits_agent import AGENT as WAITS

PASSED = '{"conclusion": "success", "url": "https://ci.example/1"}'

BATCHES = 2  # 1 inspect, 2-3 copy, 4 ask, 5 drop, 6 email, 7 done
SEALED_AGENT = f"{sealed_agent.__name__}:agent"
SECRET = "Zanzibar-Quokka-7731"


@pytest.fixture
def cli(
    postgres: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PostgresCli]:
    # The files a Postgres store's processes keep on their host (each run's folder, the
    # outbox) are in the working directory's .ratchet: the test's, for every process.
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


def test_the_demo_says_in_one_line_that_it_makes_a_store_of_its_own(cli: PostgresCli) -> None:
    refused = cli.run("demo")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.strip().splitlines() == [
        "ratchet: ratchet demo runs on a fresh sqlite:// store of its own, not on a "
        "postgresql:// one: run it without --store (docs/postgres.md has what runs on Postgres)"
    ]


def test_the_quick_read_path_hands_a_postgres_store_to_the_full_cli(cli: PostgresCli) -> None:
    cli.ok("start", "--scenario", "migration", "--run-id", "mig")
    said = json.loads(cli.ok("--json", "status", "mig"))
    assert said["run_id"] == "mig", said


def test_migrate_reencrypt_rewrites_a_postgres_store_under_the_new_key_and_the_old_can_go(
    cli: PostgresCli,
) -> None:
    ring = cli.root / "payload-keys"
    ring.write_text(f"{new_keyring_line()}\n")
    ring.chmod(0o600)  # a keyring others may read is refused
    key = f"file:{ring}"

    def ratchet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cli.argv(*args),
            capture_output=True,
            text=True,
            env=cli.env(RATCHET_PAYLOAD_KEY=key),
            timeout=120,
            check=False,
        )

    # Given a run worked to its end and a schedule, both sealed under key A
    ran = ratchet("run", "--agent", SEALED_AGENT, "--param", f"customer={SECRET}", "--run-id", "s1")
    assert ran.returncode == 0, ran.stderr
    scheduled = ratchet(
        *("schedule", "add", "nightly", "--agent", SEALED_AGENT, "--every", "1h"),
        *("--input", json.dumps({"customer": SECRET})),
    )  # fmt: skip
    assert scheduled.returncode == 0, scheduled.stderr
    key_a = ring.read_text()
    ring.write_text(f"{new_keyring_line()}\n{key_a}")

    # When `ratchet migrate --reencrypt` runs on the store with key B put first
    done = ratchet("migrate", "--reencrypt")
    again = ratchet("migrate", "--reencrypt", "--json")

    # Then it says what it rewrote under B, and a second run finds everything under B
    print(f"\n{done.stdout}")
    assert done.returncode == 0, done.stderr
    key_b = local_key_id(bytes.fromhex(ring.read_text().split()[0]))
    first = done.stdout.splitlines()[0]
    assert first.startswith("rewrote "), first
    assert re.fullmatch(rf"rewrote \d+ records and \d+ blobs? under key {key_b}", first), first
    report = json.loads(again.stdout)
    assert (report["records"], report["blobs"], report["key_id"]) == (0, 0, key_b), report
    assert report["current"] == int(first.split()[1]), (first, report)
    # and with A removed from the keyring, the run and the schedule read
    ring.write_text(f"{ring.read_text().split()[0]}\n")
    history = ratchet("history", "s1", "--json")
    assert history.returncode == 0, history.stderr
    assert SECRET in history.stdout
    listed = ratchet("schedule", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["schedules"][0]["input"] == {"customer": SECRET}


def test_a_local_payload_keyring_is_refused_on_postgres_in_one_line(cli: PostgresCli) -> None:
    # `local` makes a keyring on this host: each host of a shared store would seal under its
    # own and open none of the others' records
    for command in (["start", "--scenario", "migration", "--run-id", "k1"], ["worker"]):
        refused = subprocess.run(
            cli.argv(*command),
            capture_output=True,
            text=True,
            env=cli.env(RATCHET_PAYLOAD_KEY="local"),
            timeout=120,
            check=False,
        )
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert refused.stderr.strip().splitlines() == [
            "ratchet: RATCHET_PAYLOAD_KEY=local keeps its keys beside a store on one host: name "
            "a keyring every host reads (file:PATH) or a KMS key (kms:...) instead"
        ], command
    assert cli.run("status", "k1").returncode != 0  # nothing was started
    assert list(cli.root.rglob("*payload-keys*")) == []


def test_migrate_upgrades_a_schema_1_store_and_says_so_in_one_line(cli: PostgresCli) -> None:
    # Given a store made by a Ratchet of schema 1 (tests/integration/test_postgres_store.py)
    with psycopg.connect(cli.url) as connection:
        connection.execute(_SCHEMA.encode())

    # A dry run says what it would do, and does nothing; migrate does it; then it is current
    dry = cli.ok("migrate", "--dry-run").splitlines()
    assert dry[0] == (
        f"would upgrade the Postgres store's schema from 1 to {SCHEMA_VERSION} "
        "(dry run: nothing changed)"
    ), dry
    assert _schema_version(cli) == 1
    done = cli.ok("migrate").splitlines()
    assert done[0] == f"upgraded the Postgres store's schema from 1 to {SCHEMA_VERSION}", done
    assert _schema_version(cli) == SCHEMA_VERSION
    again = cli.json("migrate")
    assert again["store_schema"] == {
        "from": SCHEMA_VERSION,
        "to": SCHEMA_VERSION,
        "upgraded": False,
    }
    assert again["ok"] is True

    # And the store works: a run starts, runs to its question and its heads are current
    cli.ok("run", "--scenario", "migration", "--run-id", "mig", "--batches", str(BATCHES))
    assert cli.head("mig").status is RunStatus.WAITING
    assert cli.json("migrate", "--dry-run")["versions"] == {
        str(STATE_SCHEMA): {"runs": 1, "current": 1}
    }


def _schema_version(cli: PostgresCli) -> int:
    with psycopg.connect(cli.url) as connection:
        row = connection.execute(f"SELECT schema_version FROM {MARKER_TABLE}").fetchone()
    assert row is not None
    return int(row[0])


def test_gc_trims_an_old_finished_run_on_postgres_and_it_still_reads(cli: PostgresCli) -> None:
    # Given a finished run, its records past the retention, and a blob referenced by nothing,
    # last put two hours ago
    cli.ok("run", "--scenario", "migration", "--run-id", "mig", "--batches", "6")
    cli.ok("approve", "mig", "--comment", "ok", "--by", "tester")
    cli.work_until_idle()
    before = cli.head("mig")
    assert before.status is RunStatus.DONE
    with psycopg.connect(cli.url, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO blobs (address, data, touched_at) "
            "VALUES (repeat('ab', 32), 'orphan', now() - interval '2 hours')"
        )
        connection.execute("UPDATE runs SET updated_at = now() - interval '40 days'")
        records = connection.execute("SELECT count(*) FROM checkpoints").fetchone()

    # A dry run counts, gc deletes the same, and a second gc finds nothing left to delete
    dry = cli.json("gc", "--older-than", "30", "--dry-run")
    text = cli.ok("gc", "--older-than", "30")
    again = cli.json("gc", "--older-than", "30")

    assert dry["runs_trimmed"] == 1, dry
    assert dry["records_deleted"] > 0, dry
    assert dry["blobs_deleted"] == 1, dry
    assert (
        f"deleted {dry['records_deleted']} records and {dry['ledger_entries_deleted']} ledger "
        f"entries of 1 finished runs older than 30 days, and 1 blobs (6 bytes)"
    ) in text
    assert (again["records_deleted"], again["blobs_deleted"]) == (0, 0), again
    assert records is not None
    with psycopg.connect(cli.url) as connection:
        left = connection.execute("SELECT count(*) FROM checkpoints").fetchone()
    assert left is not None
    assert left[0] == records[0] - dry["records_deleted"]
    # The run reads as it did: its head, its window and its history's first record.
    assert cli.head("mig") == before
    assert cli.json("status", "mig")["status"] == "done"
    assert cli.verify("mig")["ok"]


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
    # Early, unless the machine took the nap's two seconds to start `wake` (then "Woken by
    # dana, after its time had come"): which it is, is the engine's to say (test_waits_cli).
    assert re.match(r"finished after: Woken (early )?by dana", done.summary or ""), done.summary
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
