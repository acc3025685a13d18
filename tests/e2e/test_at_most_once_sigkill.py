"""At-most-once tools with real worker processes: a worker SIGKILLed at each point of a step
that calls one, and another worker after it. Where the call may have run, the second worker
parks the run for a person instead of calling again, and `ratchet approve --answer` (what the
person saw at the bank) resumes it; every point ends with the wire sent exactly once (the
bank's own file, written across processes) and the run done.

A worker frozen in the middle of the call (SIGSTOP), not killed, is the harder case: its lease
lapses and another worker takes the run, but the call goes on when it thaws. The second worker
must not ask while the call may still run, past the call's deadline too, for as long as the
frozen worker holds it; only the thawed call's end lets the person be asked, and then the bank
shows its wire."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ratchet.faults import FaultPoint
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions, RunState, RunStatus
from tests.at_most_once_agent import AGENT, agent, wires
from tests.processes import Cli

MAY_HAVE_RUN = {FaultPoint.AFTER_CALL_STARTED, FaultPoint.AFTER_TOOL, FaultPoint.BEFORE_COMMIT}
PATIENCE = 120.0
"""Seconds any one condition of a schedule has to come true (each is waited on, never slept)."""


def _start(cli: Cli, **params: str) -> Path:
    bank = cli.root / "bank.log"
    runtime = LocalRuntime.open(LocalSettings(store=cli.store))
    options = RunOptions(params={**agent.default_params, "bank": str(bank), **params})
    runtime.engine(worker_id="test", logger=None).start(
        RunState(run_id="pay", agent=AGENT, goal="Pay ACME", options=options)
    )
    runtime.close()
    return bank


@pytest.mark.parametrize(
    "point",
    [
        FaultPoint.AFTER_DECISION,
        FaultPoint.AFTER_CALL_STARTED,
        FaultPoint.AFTER_TOOL,
        FaultPoint.BEFORE_COMMIT,
        FaultPoint.AFTER_COMMIT,
    ],
)
def test_a_sigkill_at_any_point_of_the_call_sends_the_wire_once(tmp_path, point):
    cli = Cli(tmp_path)
    bank = _start(cli)

    killed = cli.spawn_worker("killed", fault=f"kill:{point.value}@1")
    assert killed.wait(timeout=60) == -signal.SIGKILL
    cli.work_until_idle("second")
    asked = cli.head("pay").status is RunStatus.WAITING
    if asked:
        ran = len(wires(bank)) == 1
        cli.ok("approve", "pay", "--by", "dana", "--answer", json.dumps({"ran": ran}))
        cli.work_until_idle("third")

    assert asked is (point in MAY_HAVE_RUN)
    assert cli.head("pay").status is RunStatus.DONE
    assert len(wires(bank)) == 1


def test_a_worker_frozen_in_the_call_sends_the_wire_once(tmp_path):
    cli = Cli(tmp_path)
    freeze = tmp_path / "frozen.pid"
    bank = _start(cli, freeze=str(freeze))
    workers: list[subprocess.Popen[str]] = []
    try:
        # Given a worker frozen in the middle of the wire's call (its lease lapses)
        frozen = cli.spawn_worker("frozen")
        workers.append(frozen)
        _until(lambda: _stopped(frozen), "the first worker to freeze in the call")
        before = cli.head("pay")

        # When another worker takes the run over, and the call's deadline passes
        second = cli.spawn_worker("second")
        workers.append(second)
        _until(
            lambda: cli.head("pay").status is RunStatus.WAITING or _waits_for_held_call(cli),
            "the second worker to ask a person, or to wait for the frozen call",
        )
        asked_while_frozen = cli.head("pay").status is RunStatus.WAITING
        if asked_while_frozen:
            # The person looks at the bank: no wire. "It did not run"; a worker calls again.
            assert wires(bank) == []
            cli.ok("approve", "pay", "--by", "dana", "--answer", json.dumps({"ran": False}))
            cli.work_until_idle("third")
        else:
            # Then, while it waits, the step is not taken: no attempt counted, nothing written
            waiting = cli.head("pay")
            assert (waiting.version, waiting.attempts) == (before.version, before.attempts)

        # And the frozen worker thaws: its call goes on
        frozen.send_signal(signal.SIGCONT)
        asked_after = 0
        for answer in range(1, 4):
            for worker in workers:
                assert worker.wait(timeout=PATIENCE) == 0
            if cli.head("pay").status is not RunStatus.WAITING:
                break
            # Asked once the call cannot run any more: the bank shows what it did.
            asked_after = answer
            ran = len(wires(bank)) == 1
            cli.ok("approve", "pay", "--by", "dana", "--answer", json.dumps({"ran": ran}))
            workers.append(cli.spawn_worker(f"after-{answer}"))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGCONT)
                worker.kill()
                worker.wait()

    sent = wires(bank)
    print(
        f"frozen worker: wires sent {len(sent)}, asked while frozen {asked_while_frozen}, "
        f"asked after it thawed {asked_after}"
    )
    assert cli.head("pay").status is RunStatus.DONE
    assert len(sent) == 1
    assert not asked_while_frozen
    assert sent[0].split()[-1] == freeze.read_text()  # the frozen worker's own wire


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _stopped(process: subprocess.Popen[str]) -> bool:
    """Whether the process is stopped (SIGSTOP), its stop left for others to see."""
    assert process.poll() is None, "the worker exited instead of freezing"
    found = os.waitid(os.P_PID, process.pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    return found is not None and found.si_code == os.CLD_STOPPED


def _waits_for_held_call(cli: Cli) -> bool:
    """Whether the second worker has waited for a call a process here holds: its deadline had
    passed, and the frozen worker still held it."""
    return any(record.get("because") == "held" for record in _log_records(cli.root / "second.log"))


def _log_records(log: Path) -> list[dict[str, Any]]:
    records = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
