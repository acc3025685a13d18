"""Concurrency limits with real worker processes: 20 runs of an agent with `max_concurrent=3`
and 4 workers never have more than 3 steps in flight (each step's tool logs when it starts and
ends), and all 20 finish; a SIGKILLed worker's slot frees when its lease lapses, not before."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions, RunState, RunStatus
from tests.bounded_agent import AGENT, agent, in_flight
from tests.processes import Cli, clean_env

WAIT_SECONDS = 60.0


def _start(cli: Cli, run_ids: list[str], **params: object) -> None:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store))
    try:
        engine = runtime.engine(worker_id="test", logger=None)
        for run_id in run_ids:
            options = RunOptions(params={**agent.default_params, **params})
            assert engine.start(RunState(run_id=run_id, agent=AGENT, goal="Work", options=options))
    finally:
        runtime.close()


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_twenty_runs_of_an_agent_bounded_at_three_never_have_more_than_three_steps_in_flight(
    tmp_path,
):
    cli = Cli(tmp_path)
    log = tmp_path / "steps.log"
    run_ids = [f"r-{n:02d}" for n in range(20)]
    _start(cli, run_ids, log=str(log))

    workers = [cli.spawn_worker(f"w{n}") for n in range(4)]
    for worker in workers:
        assert worker.wait(timeout=180) == 0

    most, started = in_flight(log)
    assert most <= 3, f"{most} steps of a bound-3 agent were in flight at once"
    assert {run_id: cli.head(run_id).status for run_id in run_ids} == dict.fromkeys(
        run_ids, RunStatus.DONE
    )
    assert started == dict.fromkeys(run_ids, 2)  # no step of any run taken twice


def test_a_killed_workers_slot_frees_when_its_lease_lapses_and_not_before(tmp_path):
    cli = Cli(tmp_path)
    log = tmp_path / "steps.log"
    _start(cli, ["held"], log=str(log), hold=120, steps=1)
    _start(cli, ["next"], log=str(log), steps=1)
    env = clean_env(RATCHET_MAX_CONCURRENT='{"bounded": 1}')
    holder = _worker(cli, "holder", env, lease=2.0)
    _until(lambda: log.exists() and "held" in log.read_text(), "the holder to start its step")

    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    lapses_at = _lease_expiry(tmp_path / "ratchet.db", "held")
    other = _worker(cli, "other", env, lease=2.0)
    assert other.wait(timeout=120) == 0, (tmp_path / "other.log").read_text()

    starts = [line.split() for line in log.read_text().splitlines() if line.startswith("start")]
    after_kill = [float(moment) for _, moment, _, _ in starts[1:]]
    assert after_kill, "the other worker took no step"
    assert min(after_kill) >= lapses_at, "a step started while the dead worker's slot was live"
    assert cli.head("held").status is RunStatus.DONE
    assert cli.head("next").status is RunStatus.DONE


def _worker(cli: Cli, name: str, env: dict[str, str], *, lease: float):
    import subprocess

    out = (cli.root / f"{name}.log").open("a")
    return subprocess.Popen(
        cli.argv("worker", "--until-idle", "--worker-id", name, "--lease-seconds", str(lease)),
        stdout=out,
        stderr=out,
        text=True,
        env=env,
    )


def _lease_expiry(db: Path, run_id: str) -> float:
    connection = sqlite3.connect(db)
    try:
        (expires_at,) = connection.execute(
            "SELECT expires_at FROM leases WHERE run_id = ?", (run_id,)
        ).fetchone()
    finally:
        connection.close()
    return float(expires_at)
