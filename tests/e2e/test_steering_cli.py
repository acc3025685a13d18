"""The steering commands through the real `ratchet` process: cancel, retry, resume, fork and
replay (issue 10). The engine's own guarantees are in tests/integration/test_steering.py."""

from __future__ import annotations

import sqlite3

import pytest

from tests.e2e.test_cli_contract import (
    BATCHES,
    WAITING_STEP,
    _run_until_waiting,
    assert_rejected,
    fresh,
)


def test_cancel_ends_a_waiting_run_and_keeps_its_checkpoints(tmp_path):
    cli = fresh(tmp_path)
    _run_until_waiting(cli, "r1")
    before = cli.json("history", "r1")["checkpoints"]

    cli.ok("cancel", "r1", "--reason", "wrong table", "--by", "dana")

    status = cli.json("status", "r1")
    assert (status["status"], status["step"]) == ("cancelled", WAITING_STEP)
    assert status["summary"] == "Cancelled by dana: wrong table"
    after = cli.json("history", "r1")["checkpoints"]
    assert after[: len(before)] == before
    refused = cli("cancel", "r1")
    assert refused.returncode == 2
    assert "already cancelled" in refused.stderr


def test_fork_copies_the_state_as_of_a_step_and_replay_renders_its_prompt(tmp_path):
    cli = fresh(tmp_path)
    _run_until_waiting(cli, "r1")

    cli.ok("fork", "r1", "--from-step", "2", "--run-id", "r1-again")

    forked = cli.json("status", "r1-again")
    assert (forked["status"], forked["step"]) == ("running", 2)
    source = cli.json("status", "r1")
    assert (source["status"], source["step"]) == ("waiting", WAITING_STEP)
    prompt = cli.ok("replay", "r1", "--step", "3")
    assert "<completed_steps>" in prompt
    assert '2. copy_batch {"batch": 1}' in prompt
    assert "3. copy_batch" not in prompt


def test_retry_is_refused_for_a_run_that_did_not_fail(tmp_path):
    cli = fresh(tmp_path)
    cli.ok("start", "--scenario", "migration", "--param", f"batches={BATCHES}", "--run-id", "r1")

    refused = cli("retry", "r1")

    assert refused.returncode == 2
    assert "only a failed run can be retried" in refused.stderr


def test_resume_on_a_local_store_says_in_one_line_that_any_worker_takes_the_run(tmp_path):
    cli = fresh(tmp_path)
    cli.ok("start", "--scenario", "migration", "--param", f"batches={BATCHES}", "--run-id", "r1")

    said = cli.ok("resume", "r1")

    assert said == "r1: no execution works a run on a local store: the next free worker takes it\n"
    assert cli.json("status", "r1")["status"] == "running"


@pytest.mark.slow
def test_approving_a_fork_of_a_waiting_run_drops_the_table_and_replay_shows_the_answer(tmp_path):
    # Given a migration parked for a person, and a fork of it from the step that asked
    cli = fresh(tmp_path)
    _run_until_waiting(cli, "s")
    cli.ok("fork", "s", "--from-step", str(WAITING_STEP), "--run-id", "f")
    assert cli.json("status", "f")["status"] == "waiting"

    # When a person approves the fork and a worker process takes it
    cli.ok("approve", "f", "--by", "dana")
    cli.ok("worker", "--until-idle")

    # Then the fork went on as approved, and replay shows what its model was given
    done = cli.json("status", "f")
    assert done["status"] == "done"
    assert "legacy_orders was dropped" in done["summary"]
    steps = [c for c in cli.json("history", "f")["checkpoints"] if c["event"] == "step"]
    assert [c["tool"] for c in steps] == ["drop_table", "send_email"]
    prompt = cli.ok("replay", "f", "--step", str(WAITING_STEP + 1))
    assert "<last_result>Approved by dana.</last_result>" in prompt
    checks = cli.json("verify", "f")
    assert (checks["ok"], checks["missing_rows"], checks["duplicate_rows"]) == (True, 0, 0)
    assert cli.json("status", "s")["status"] == "waiting"  # the source still waits


@pytest.mark.slow
def test_a_fork_the_agent_refuses_exits_2_with_its_reason_and_writes_nothing(tmp_path):
    cli = fresh(tmp_path)
    _run_until_waiting(cli, "s")
    # The run's data as an older Ratchet wrote it: it does not say what its copies did
    app = sqlite3.connect(cli.db.with_suffix(".data") / "s" / "app.db")
    with app:
        app.execute("DELETE FROM effects")
    app.close()
    before = cli.json("history", "s")

    refused = cli("fork", "s", "--from-step", "3", "--run-id", "f")

    assert_rejected(refused, "does not record what s/step-2 did")
    assert cli("status", "f").returncode == 2
    assert cli.json("history", "s") == before
