"""The steering commands through the real `ratchet` process: cancel, retry, fork and replay
(issue 10). The engine's own guarantees are in tests/integration/test_steering.py."""

from __future__ import annotations

from tests.e2e.test_cli_contract import BATCHES, WAITING_STEP, _run_until_waiting, fresh


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
