"""Real `ratchet worker` processes on steps longer than their lease: the heartbeat keeps the run
with the worker that works it, and SIGTERM lets a worker finish its step and give back what it
holds."""

from __future__ import annotations

import signal
import time

import pytest

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus
from tests.processes import Cli

pytestmark = pytest.mark.slow

LEASE = 1.0
TOOL_LATENCY_MS = 2500  # every step takes 2.5 leases


def _two_workers_until_idle(cli: Cli, round_: int) -> None:
    workers = [cli.spawn_worker(f"w{round_}{name}", lease=LEASE) for name in ("a", "b")]
    for worker in workers:
        assert worker.wait(timeout=120) == 0


def test_steps_longer_than_the_lease_with_two_workers_apply_once_without_a_strike(tmp_path):
    # Given a migration whose every tool call takes 2.5 leases, and two workers on it
    cli = Cli(tmp_path)
    cli.ok(
        "start",
        "--scenario",
        "migration",
        "--batches",
        "1",
        "--tool-latency-ms",
        str(TOOL_LATENCY_MS),
        "--run-id",
        "lo",
    )

    # When they work it until it parks for the drop, then again once it is approved
    _two_workers_until_idle(cli, 1)
    assert cli.head("lo").status is RunStatus.WAITING
    cli.ok("approve", "lo", "--by", "tester")
    _two_workers_until_idle(cli, 2)

    # Then it is done, each effect applied once, and no attempt failed or was repeated
    assert cli.head("lo").status is RunStatus.DONE
    report = cli.verify("lo")
    assert report["ok"] is True
    assert (report["duplicate_rows"], report["emails_sent"]) == (0, 1)
    assert report["keys_applied"] == 3  # the copy, the drop and the email
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        events = [c.event for c in runtime.store.list_checkpoints("lo")]
    finally:
        runtime.close()
    assert "attempt_failed" not in [e.kind for e in events]
    steps = [e for e in events if e.kind == "step"]
    assert [e.step for e in steps] == [1, 2, 3, 4, 5], "each step committed once"
    assert {e.attempt for e in steps} == {1}


def test_sigterm_lets_a_worker_finish_its_step_and_give_back_the_run(tmp_path):
    # Given a worker in the middle of a 3 s step
    cli = Cli(tmp_path)
    cli.ok(
        "start",
        "--scenario",
        "migration",
        "--batches",
        "3",
        "--tool-latency-ms",
        "3000",
        "--run-id",
        "mig",
    )
    worker = cli.spawn_worker("w", lease=LEASE, until_idle=False)
    try:
        deadline = time.monotonic() + 60
        while cli.head("mig").step < 1:
            assert time.monotonic() < deadline, "the worker never finished step 1"
            time.sleep(0.05)

        # When it is asked to stop
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    # Then it stopped cleanly after step 2, took back the attempt it had counted for step 3,
    # and released its lease and its worker id
    assert code == 0, (tmp_path / "w.log").read_text()
    head = cli.head("mig")
    assert (head.status, head.step, head.attempts) == (RunStatus.RUNNING, 2, 0)
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        assert runtime.leases.holder("mig") is None
        held = runtime.db.connection.execute("SELECT count(*) FROM workers").fetchone()
        assert held == (0,)
    finally:
        runtime.close()
