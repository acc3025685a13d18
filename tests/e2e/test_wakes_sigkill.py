"""A waker killed between settling a wait and waking its run: real `ratchet` processes, the
waker SIGKILLed at `after_wait_settled` (issue 32, item 1). Locally nothing is parked on a
token: a settled run is runnable and any worker takes it; a person's decision settled in the
request and not yet recorded on the run is recorded by a worker once it is older than a live
decider can take (`ratchet.runtime.local_approvals.delivery_time`: three busy timeouts and
5 s; the test's store waits 1 s for a lock, so 8 s). Each test prints how long the run took to
go on after its waker died."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import PersonDecided, RunStatus
from ratchet.waits import ApprovalStatus
from tests import waits_agent
from tests.e2e.test_cli_contract import RATCHET, Cli, fresh
from tests.fixtures import refund_agent

BUSY_TIMEOUT = "1"
"""Seconds each write waits for the store's lock, in every process of these tests: a decider
is given up for dead 3 x 1 + 5 = 8 s after its decision."""
GIVEN_UP_AFTER = 8.0
ANSWER = '{"amount": 120, "reason": "damaged"}'


def _store(cli: Cli) -> LocalRuntime:
    return LocalRuntime.open(LocalSettings(store=cli.url), create=False)


def _worker(cli: Cli) -> subprocess.Popen[str]:
    """A worker that keeps going (as `ratchet worker` runs in production), not until idle: a
    run whose decision is undelivered waits, and an idle worker would stop."""
    log = (cli.cwd / "worker.log").open("a")
    return subprocess.Popen(
        [str(RATCHET), "--store", cli.url, "worker", "--worker-id", "sweeper"],
        cwd=cli.cwd,
        env=cli.env,
        stdout=log,
        stderr=log,
        text=True,
    )


def _killed_at_the_wake(cli: Cli, *args: str) -> float:
    """Run the command, which settles a wait at step 1 and is SIGKILLed before it goes on:
    when it died."""
    cli.env["RATCHET_FAULT"] = "kill:after_wait_settled@1"
    try:
        killed = cli(*args)
    finally:
        del cli.env["RATCHET_FAULT"]
    assert killed.returncode == -9, killed.stderr
    return time.monotonic()


def _goes_on(cli: Cli, run_id: str, *, since: float, within: float = 60) -> float:
    """Start a worker and wait until the run is done: the seconds from `since`."""
    worker = _worker(cli)
    try:
        while time.monotonic() - since < within:
            runtime = _store(cli)
            try:
                head = runtime.store.load_head(run_id)
            finally:
                runtime.close()
            if head is not None and head.status is RunStatus.DONE:
                return time.monotonic() - since
            time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    raise AssertionError(
        f"{run_id} did not go on within {within:g} s: {(cli.cwd / 'worker.log').read_text()}"
    )


def _parked(tmp_path: Path) -> Cli:
    cli = fresh(tmp_path)
    cli.env["RATCHET_BUSY_TIMEOUT_SECONDS"] = BUSY_TIMEOUT
    shutil.copy(refund_agent.__file__, tmp_path / "refunds.py")
    cli.ok("run", "--agent", "refunds:agent", "--run-id", "r1")
    assert cli.json("status", "r1")["status"] == "waiting"
    return cli


def test_a_decision_whose_decider_was_killed_is_recorded_once_by_a_worker(tmp_path):
    cli = _parked(tmp_path)

    # The person approves; the decider dies after the request is settled, before the run
    # records the decision.
    died = _killed_at_the_wake(cli, "approve", "r1", "--answer", ANSWER, "--by", "dana")
    runtime = _store(cli)
    try:
        (request,) = runtime.approvals.of_run("r1")
        head = runtime.store.load_head("r1")
    finally:
        runtime.close()
    assert request.status is ApprovalStatus.APPROVED
    assert head is not None
    assert head.status is RunStatus.WAITING, "settled, not recorded"
    # Nobody can decide it again: the request says who did.
    again = cli("approve", "r1", "--answer", ANSWER)
    assert again.returncode == 2
    assert "approved by dana" in again.stderr, again.stderr

    took = _goes_on(cli, "r1", since=died)
    print(f"\nkilled decider -> run done: {took:.1f} s (given up for dead after 8 s)")
    assert took >= GIVEN_UP_AFTER - 1, "a live decider's decision must not be taken from it"

    runtime = _store(cli)
    try:
        decided = [
            c.event
            for c in runtime.store.list_checkpoints("r1")
            if isinstance(c.event, PersonDecided)
        ]
        (request,) = runtime.approvals.of_run("r1")
    finally:
        runtime.close()
    assert [(d.approved, d.by, d.answer) for d in decided] == [
        (True, "dana", {"amount": 120, "reason": "damaged"})
    ]
    assert request.status is ApprovalStatus.APPROVED, "the request keeps who decided"
    assert cli.json("status", "r1")["summary"] == (
        'refund decided: Approved by dana: {"amount": 120, "reason": "damaged"}'
    )


def test_an_event_whose_sender_was_killed_after_settling_goes_on_at_once(tmp_path):
    cli = fresh(tmp_path)
    cli.env["RATCHET_BUSY_TIMEOUT_SECONDS"] = BUSY_TIMEOUT
    shutil.copy(waits_agent.__file__, tmp_path / "waits.py")
    cli.ok("start", "--agent", "waits:agent", "--run-id", "pr-7")
    cli.ok("worker", "--until-idle")
    assert cli.json("status", "pr-7")["status"] == "waiting"

    payload = '{"conclusion": "success", "url": "https://ci.example/7"}'
    died = _killed_at_the_wake(cli, "send", "pr-7", "ci-finished", "--data", payload, "--id", "d-1")

    took = _goes_on(cli, "pr-7", since=died)
    print(f"\nkilled sender -> run done: {took:.1f} s")
