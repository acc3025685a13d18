"""Real processes, real SIGKILL: `ratchet worker` processes die at exact points and at random
moments, other workers take over, and the migration ends with every invariant intact."""

from __future__ import annotations

import random
import signal
import subprocess
import time

import pytest

from ratchet.faults import STEP_POINTS, FaultPoint
from ratchet.state import RunStatus
from tests.processes import Cli

BATCHES = 3  # 1 inspect, 2-4 copy, 5 ask, 6 drop, 7 email, 8 DONE


@pytest.fixture(scope="module")
def crash_free(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    cli = Cli(tmp_path_factory.mktemp("crash-free"))
    cli.ok("start", "--scenario", "migration", "--run-id", "mig", "--batches", str(BATCHES))
    return _comparable(cli.finish_migration("mig"))


def _comparable(report: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in report.items() if k != "keys_delivered"}


KILLS = [(point, 2) for point in STEP_POINTS] + [(FaultPoint.AFTER_TOOL, 6)]


@pytest.mark.parametrize(("point", "step"), KILLS)
def test_sigkill_at_any_point_then_another_worker_finishes_the_same(
    tmp_path, crash_free, point, step
):
    cli = Cli(tmp_path)
    cli.ok("start", "--scenario", "migration", "--run-id", "mig", "--batches", str(BATCHES))
    if step > 5:  # get past the approval first
        cli.work_until_idle("before")
        cli.ok("approve", "mig", "--by", "tester")

    doomed = cli.spawn_worker("doomed", fault=f"kill:{point}@{step}", lease=0.3)
    assert doomed.wait(timeout=60) == -signal.SIGKILL
    died_at = cli.head("mig")
    assert died_at.step == (step if point is FaultPoint.AFTER_COMMIT else step - 1)

    report = cli.finish_migration("mig")

    assert _comparable(report) == crash_free
    history = cli.json("history", "mig")["checkpoints"]
    steps = [c["step"] for c in history if c["event"] == "step"]
    assert steps == list(range(1, 8)), "each step committed once"


@pytest.mark.parametrize(("deaths", "status"), [(2, RunStatus.DONE), (3, RunStatus.FAILED)])
def test_a_worker_killed_between_two_steps_leaves_no_strike_on_the_next(
    tmp_path, crash_free, deaths, status
):
    # Given a worker SIGKILLed right after step 2's commit, before step 3 began
    cli = Cli(tmp_path)
    cli.ok("start", "--scenario", "migration", "--run-id", "mig", "--batches", str(BATCHES))
    between = cli.spawn_worker("between", fault="kill:after_commit@2", lease=0.3)
    assert between.wait(timeout=60) == -signal.SIGKILL
    died_at = cli.head("mig")
    assert (died_at.step, died_at.attempts) == (2, 0), "a strike on a step that never began"

    # When step 3 then kills its worker, in one new worker after another
    for life in range(deaths):
        dying = cli.spawn_worker(f"dies-{life}", fault="kill:after_tool@3", lease=0.3)
        assert dying.wait(timeout=60) == -signal.SIGKILL, f"worker dies-{life} was not killed"
        assert (cli.head("mig").step, cli.head("mig").attempts) == (2, life + 1)

    # Then only its third death fails the run, keeping its last checkpoint; two do not
    if status is RunStatus.DONE:
        report = cli.finish_migration("mig")
        assert _comparable(report) == crash_free
        history = cli.json("history", "mig")["checkpoints"]
        copies = [c for c in history if c["event"] == "step" and c["step"] == 3]
        assert [c["attempt"] for c in copies] == [3]
    else:
        cli.work_until_idle()
        failed = cli.head("mig")
        assert (failed.status, failed.step, failed.attempts) == (RunStatus.FAILED, 2, 3)
        assert failed.error == "step 3 failed 3 times; last error: the worker died during the step"
    # Step 3's copy was delivered in each life that died in it and applied once at most
    delivered = cli.verify("mig")["keys_delivered"]
    if status is RunStatus.DONE:  # copies 2-4, drop and email, and step 3's deaths
        assert delivered == 5 + deaths
    else:  # copy 2, and step 3's deaths
        assert delivered == 1 + deaths


def test_an_attempt_counted_without_a_sync_still_counts_after_sigkill(tmp_path):
    # Given workers SIGKILLed inside step 3 before its model is asked: the attempt's count is
    # the only write of the step so far, committed to the WAL without a sync
    cli = Cli(tmp_path)
    cli.ok("start", "--scenario", "migration", "--run-id", "mig", "--batches", str(BATCHES))
    for life in range(3):
        dying = cli.spawn_worker(f"dies-{life}", fault="kill:before_model@3", lease=0.3)
        assert dying.wait(timeout=60) == -signal.SIGKILL, f"worker dies-{life} was not killed"
        # Then each death stands, as read by another process
        assert (cli.head("mig").step, cli.head("mig").attempts) == (2, life + 1)

    # And the third fails the run
    cli.work_until_idle()
    failed = cli.head("mig")
    assert (failed.status, failed.attempts) == (RunStatus.FAILED, 3)
    assert failed.error == "step 3 failed 3 times; last error: the worker died during the step"


def test_workers_killed_at_random_moments_still_finish_the_run(tmp_path):
    # Given two workers on one store and a chaos loop that SIGKILLs one at a random moment and
    # starts a replacement, a bounded number of times (the seed makes the moments repeatable
    # in order, though the steps they land on depend on the machine's speed)
    chaos = random.Random(20261129)
    cli = Cli(tmp_path)
    run_id = "chaos"
    cli.ok(
        "start",
        "--scenario",
        "migration",
        "--run-id",
        run_id,
        "--batches",
        "40",
        "--tool-latency-ms",
        "100",
    )
    workers = [cli.spawn_worker(f"w{n}", lease=0.4, until_idle=False) for n in range(2)]
    kills, last_kill_step = 0, -1
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            head = cli.head(run_id)
            if head.status is RunStatus.WAITING:
                cli.ok("approve", run_id, "--by", "tester")
            elif head.is_finished:
                break
            # One kill per step at most: three kills on one step would rightly fail the run.
            if kills < 6 and head.step > last_kill_step:
                time.sleep(chaos.uniform(0.05, 0.3))
                victim = chaos.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(timeout=10)
                kills += 1
                last_kill_step = cli.head(run_id).step
                workers[victim] = cli.spawn_worker(
                    f"w{len(workers) + kills}", lease=0.4, until_idle=False
                )
            else:
                time.sleep(0.1)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()

    # Then the run is done and nothing was applied twice
    assert cli.head(run_id).status is RunStatus.DONE
    assert kills == 6
    report = cli.json("verify", run_id)
    assert report["ok"] is True
    assert (report["target_rows"], report["duplicate_rows"]) == (40_000, 0)
    assert report["emails_sent"] == 1
    assert report["keys_applied"] == 42  # 40 copies, the drop and the email: nothing more
