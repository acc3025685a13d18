"""Waits survive SIGKILL: real `ratchet` processes and a real sender process, killed at the two
points an event passes through. The event is delivered once, the step after it is not
repeated, and its effect is applied once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus, StepCompleted, WaitSettled
from tests.processes import Cli, clean_env

RUN = "pr-7"
PASSED = '{"conclusion": "success", "url": "https://ci.example/7"}'


def send_in_a_process(cli: Cli, *, fault: str | None) -> subprocess.CompletedProcess[str]:
    """One sender, a process of its own, as `ratchet send` or the runs API would be."""
    script = textwrap.dedent(
        f"""
        import json, logging
        from ratchet.runtime.local import LocalRuntime, LocalSettings
        runtime = LocalRuntime.open(LocalSettings(store={cli.store!r}, fault={fault!r}))
        desk = runtime.event_desk(runtime.engine(worker_id="sender", logger=logging.getLogger()))
        print(json.dumps(desk.send({RUN!r}, "ci-finished", json.loads({PASSED!r}),
                                   event_id="delivery-1").answer()))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )


def records(cli: Cli) -> list[object]:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        return [c.event for c in runtime.store.list_checkpoints(RUN)]
    finally:
        runtime.close()


def data(cli: Cli) -> dict[str, str]:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        rows = runtime.db.connection.execute(
            "SELECT key, value FROM run_data WHERE run_id = ?", (RUN,)
        ).fetchall()
        return dict(rows)
    finally:
        runtime.close()


def pending(cli: Cli) -> list[str]:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        return [e.event_id for e in runtime.mailbox.of_run(RUN) if e.is_pending]
    finally:
        runtime.close()


def start_and_park(tmp_path: Path) -> Cli:
    cli = Cli(tmp_path)
    cli.ok("start", "--agent", "tests.waits_agent:agent", "--run-id", RUN, "--param", "merge=true")
    cli.work_until_idle("first")
    head = cli.head(RUN)
    assert head.status is RunStatus.WAITING
    assert head.waiting is not None
    assert head.waiting.kind == "event"
    return cli


def assert_delivered_once_and_merged_once(cli: Cli) -> None:
    head = cli.head(RUN)
    assert head.status is RunStatus.DONE, head.error
    events = records(cli)
    settled = [e for e in events if isinstance(e, WaitSettled)]
    assert [(s.how, s.event_id) for s in settled] == [("event", "delivery-1")]
    merges = [e for e in events if isinstance(e, StepCompleted) and e.call.name == "merge"]
    assert len(merges) == 1
    merged = {k: v for k, v in data(cli).items() if k.startswith("merged/")}
    assert merged == {f"merged/{RUN}/step-2": "1"}
    assert pending(cli) == []


def test_a_sender_killed_after_the_event_is_accepted_loses_nothing(tmp_path):
    cli = start_and_park(tmp_path)
    killed = send_in_a_process(cli, fault="kill:after_event_accepted@1")
    assert killed.returncode == -9, killed.stderr
    # Accepted, not delivered: the run still waits, the event is in its mailbox.
    assert cli.head(RUN).status is RunStatus.WAITING
    assert pending(cli) == ["delivery-1"]
    # The sender retries (every webhook sender does): the same answer, now delivered.
    again = send_in_a_process(cli, fault=None)
    assert again.returncode == 0, again.stderr
    assert '"duplicate": true' in again.stdout
    assert '"status": "delivered"' in again.stdout
    cli.work_until_idle("second")
    assert_delivered_once_and_merged_once(cli)


def test_a_worker_delivers_an_accepted_event_whose_sender_died(tmp_path):
    cli = start_and_park(tmp_path)
    killed = send_in_a_process(cli, fault="kill:after_event_accepted@1")
    assert killed.returncode == -9, killed.stderr
    # No retry: a worker's sweep finds the waiting run's event in its mailbox.
    cli.work_until_idle("sweeper")
    assert_delivered_once_and_merged_once(cli)


def test_a_worker_killed_after_the_run_resumed_repeats_no_step_and_no_effect(tmp_path):
    cli = start_and_park(tmp_path)
    sent = send_in_a_process(cli, fault=None)
    assert '"status": "delivered"' in sent.stdout, sent.stderr
    # The run resumed from the event; its next step (the merge) is killed after the tool
    # acted and before its checkpoint.
    crashed = cli.spawn_worker("crashes", fault="kill:after_tool@2").wait(timeout=120)
    assert crashed == -9
    assert cli.head(RUN).step == 1
    cli.work_until_idle("recovers")
    assert_delivered_once_and_merged_once(cli)
    tries = [k for k in data(cli) if k.startswith(f"tries/{RUN}/step-2/")]
    assert len(tries) == 2  # tried twice, applied once


def test_a_sleeping_run_is_woken_once_across_worker_restarts(tmp_path):
    cli = Cli(tmp_path)
    cli.ok("start", "--agent", "tests.waits_agent:agent", "--run-id", RUN, "--param", "nap=true")
    cli.work_until_idle("first")
    assert '"status": "delivered"' in send_in_a_process(cli, fault=None).stdout
    cli.work_until_idle("second")
    head = cli.head(RUN)
    assert head.waiting is not None
    assert head.waiting.kind == "timer"
    due = head.waiting.due
    assert due is not None
    # A worker that finds only a sleeping run has nothing to do, and leaves it asleep (if
    # the machine is slow enough that it ends after the due time, it may rightly wake it).
    cli.work_until_idle("idle")
    if datetime.now(UTC) < due:
        assert cli.head(RUN).version == head.version
    # One is killed around the due time, and one started after it picks the run up at once.
    doomed = cli.spawn_worker("doomed", until_idle=False)
    doomed.kill()
    doomed.wait(timeout=30)
    while datetime.now(UTC) <= due:  # the condition is the clock itself, not a guess of it
        time.sleep(0.05)
    cli.work_until_idle("after")
    assert cli.head(RUN).status is RunStatus.DONE
    settled = [e for e in records(cli) if isinstance(e, WaitSettled)]
    assert [s.how for s in settled] == ["event", "due"]
