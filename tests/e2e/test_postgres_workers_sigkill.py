"""Eight `ratchet worker` processes on one Postgres store, each with its own pool, work 50 runs
of an agent whose steps apply keyed effects, while the test SIGKILLs a worker at random
moments and starts another in its place: every run ends done, every step's key is applied
once, and each step is committed once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ratchet
from ratchet.state import RunState, RunStatus, StepCompleted
from tests.keyed_effects_agent import AGENT, effects
from tests.postgres_support import Cluster

WORKERS = 8
RUNS = 50
STEPS = 3
KILLS = 12
DEADLINE_SECONDS = 300.0
LEASE_SECONDS = "1"
"""Short, so a killed worker's run is taken by another soon after."""
WORKER = [sys.executable, "-m", "ratchet.cli"]
WAIT_SECONDS = 60.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(postgres: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.chdir(tmp_path)  # the world (world.db) and the store's host files live here
    name = postgres.fresh_database(store=True)
    yield postgres.url(name)
    postgres.drop_database(name)


def _spawn(
    store: str, name: str, root: Path, *, fault: str | None = None, until_idle: bool = False
) -> subprocess.Popen[str]:
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(REPO)) if p)
    env = {k: v for k, v in os.environ.items() if k not in {"RATCHET_FAULT", "RATCHET_STORE"}}
    if fault is not None:
        env["RATCHET_FAULT"] = fault
    log = (root / f"{name}.log").open("a")
    flags = ["--until-idle"] if until_idle else []
    worker = ["worker", *flags, "--worker-id", name, "--lease-seconds", LEASE_SECONDS]
    return subprocess.Popen(
        [*WORKER, "--store", store, *worker],
        stdout=log,
        stderr=log,
        text=True,
        env={**env, "PYTHONPATH": path},
    )


def test_eight_workers_killed_at_random_finish_fifty_runs_each_key_applied_once(
    store: str, tmp_path: Path
) -> None:
    # Given 50 runs started on the store
    client = ratchet.connect(store)
    runs = [f"keyed-{n:02d}" for n in range(RUNS)]
    for run_id in runs:
        client.start(run_id=run_id, agent=AGENT, input={"steps": STEPS})

    # When eight workers work them, one SIGKILLed and replaced at random moments
    chance = random.Random(39)
    workers = {f"w{n}": _spawn(store, f"w{n}", tmp_path) for n in range(WORKERS)}
    started = time.monotonic()
    kills = 0
    try:
        while time.monotonic() - started < DEADLINE_SECONDS:
            now = [client.runtime.store.load_head(run_id) for run_id in runs]
            if all(h is not None and h.status is RunStatus.DONE for h in now):
                break
            if kills < KILLS:
                time.sleep(chance.uniform(0.2, 0.8))
                victim = chance.choice(sorted(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(timeout=30)
                kills += 1
                workers[f"{victim}-{kills}"] = _spawn(store, f"{victim}-{kills}", tmp_path)
                del workers[victim]
            else:
                time.sleep(0.2)
        elapsed = time.monotonic() - started
    finally:
        for worker in workers.values():
            worker.send_signal(signal.SIGTERM)
        for worker in workers.values():
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()

    # Then every run is done, every step's key applied once, each step committed once
    heads = {run_id: client.runtime.store.load_head(run_id) for run_id in runs}
    not_done = {
        run_id: head.status.value if head else None
        for run_id, head in heads.items()
        if head is None or head.status is not RunStatus.DONE
    }
    assert not not_done, f"not done after {elapsed:.0f}s: {not_done}"
    applied = effects()
    expected = {(f"{run_id}/step-{n}", run_id) for run_id in runs for n in range(1, STEPS + 1)}
    assert set(applied) == expected
    assert len(applied) == len(expected)
    for run_id in runs:
        steps = Counter(
            c.step
            for c in client.runtime.store.list_checkpoints(run_id)
            if isinstance(c.event, StepCompleted)
        )
        assert steps == Counter(range(1, STEPS + 1)), (run_id, steps)
    calls = len((tmp_path / "calls.log").read_text().splitlines())
    print(
        f"\n{RUNS} runs x {STEPS} steps over {WORKERS} workers, {kills} SIGKILLs: done in "
        f"{elapsed:.1f}s; {len(applied)} keys applied once, {calls} tool calls"
    )
    client.runtime.close()


def test_of_two_workers_racing_one_run_one_wins_and_the_stale_writer_changes_nothing(
    store: str, tmp_path: Path
) -> None:
    # Given a worker standing still (SIGSTOP) after step 2's tool, before its commit, its
    # lease lapsing meanwhile
    client = ratchet.connect(store)
    client.start(run_id="race", agent=AGENT, input={"steps": STEPS})
    frozen = _spawn(store, "frozen", tmp_path, fault="stop:before_commit@2", until_idle=True)
    _wait(lambda: _stopped(frozen), "the worker never stood still", tmp_path / "frozen.log")
    assert _head(client, "race").step == 1

    # When another worker takes the run and works it to its end, and the first goes on
    taker = _spawn(store, "taker", tmp_path)
    try:
        _wait(
            lambda: _head(client, "race").status is RunStatus.DONE,
            "the second worker never finished the run",
            tmp_path / "taker.log",
        )
    finally:
        taker.send_signal(signal.SIGTERM)
        taker.wait(timeout=WAIT_SECONDS)
    won = client.runtime.store.list_checkpoints("race")
    frozen.send_signal(signal.SIGCONT)
    assert frozen.wait(timeout=WAIT_SECONDS) == 0, (tmp_path / "frozen.log").read_text()

    # Then the run's history is the winner's, unchanged by the stale writer's commit, and
    # the step both ran applied its key once
    assert client.runtime.store.list_checkpoints("race") == won
    by_step = {c.step: c.worker_id for c in won if isinstance(c.event, StepCompleted)}
    assert by_step == {1: "frozen", 2: "taker", 3: "taker"}
    calls = (tmp_path / "calls.log").read_text().split()
    assert calls.count("race/step-2") == 2, calls  # both workers ran step 2's tool
    assert sorted(key for key, _ in effects()) == [f"race/step-{n}" for n in (1, 2, 3)]
    client.runtime.close()


def _head(client: ratchet.Client, run_id: str) -> RunState:
    head = client.runtime.store.load_head(run_id)
    assert head is not None
    return head


def _wait(done: Callable[[], bool], failure: str, log: Path) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not done():
        assert time.monotonic() < deadline, f"{failure}: {log.read_text()}"
        time.sleep(0.05)


def _stopped(process: subprocess.Popen[str]) -> bool:
    try:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")
