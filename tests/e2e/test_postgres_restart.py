"""The database goes away under load and comes back: four `ratchet worker` processes work 30
runs of keyed steps on a cluster of the test's own, whose server the test stops once some
steps are committed and starts again once every worker has said it lost it. The workers
reconnect (their pools, their listening connections), every run ends done, every key is
applied once and every step committed once at its first attempt (an outage is no strike),
and each worker says what happened in one line when the store went and one when it came back,
never a traceback nor a line per failed try."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ratchet
from ratchet.adapters.postgres.database import WORK_CHANNEL
from ratchet.errors import StoreBusy
from ratchet.state import RunStatus, StepCompleted
from tests.keyed_effects_agent import AGENT, effects
from tests.postgres_support import Cluster, private_cluster

WORKERS = 4
RUNS = 30
STEPS = 5
STOP_AFTER_EFFECTS = 40
"""Keys applied before the server is stopped: the workers are mid-run, most runs unfinished."""
WAIT_SECONDS = 120.0
LOST = re.compile(r"the store is unreachable \(.+\); retrying")
BACK = re.compile(r"the store is reachable again after \d+\.\d s")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.chdir(tmp_path)  # the world (world.db) and the store's host files live here
    with private_cluster() as own:
        yield own


def _spawn(store: str, name: str, root: Path) -> subprocess.Popen[str]:
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(REPO)) if p)
    env = {k: v for k, v in os.environ.items() if k not in {"RATCHET_FAULT", "RATCHET_STORE"}}
    # The default lease (30 s) outlasts the outage: each run stays with its worker.
    worker = ["worker", "--worker-id", name]
    return subprocess.Popen(
        [sys.executable, "-m", "ratchet.cli", "--store", store, *worker],
        stdout=(root / f"{name}.out").open("w"),
        stderr=(root / f"{name}.err").open("w"),
        text=True,
        env={**env, "PYTHONPATH": path},
    )


def _said(root: Path, name: str) -> list[str]:
    return [
        line
        for stream in ("out", "err")
        for line in (root / f"{name}.{stream}").read_text().splitlines()
    ]


def _listening(store: str) -> int:
    """How many sessions listen for work, by the server's own account: each is a worker's
    listening connection, whose last statement was its LISTEN."""
    import psycopg

    with psycopg.connect(store, autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s",
            (f"LISTEN {WORK_CHANNEL}",),
        ).fetchone()
    return int(row[0]) if row else 0


def _wait(done: Callable[[], bool], failure: str, root: Path) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not done():
        if time.monotonic() > deadline:
            logs = {p.name: p.read_text()[-3000:] for p in sorted(root.glob("w*.[oe][ur][tr]"))}
            pytest.fail(f"{failure}: {logs}")
        time.sleep(0.05)


def test_workers_ride_out_a_database_restart_each_key_once_and_one_line_each_way(
    cluster_of_its_own: Cluster, tmp_path: Path
) -> None:
    postgres = cluster_of_its_own
    store = postgres.url(postgres.fresh_database())
    client = ratchet.connect(store)
    runs = [f"keyed-{n:02d}" for n in range(RUNS)]
    workers = {f"w{n}": _spawn(store, f"w{n}", tmp_path) for n in range(WORKERS)}

    def all_done() -> bool:
        try:
            heads = [client.runtime.store.load_head(run_id) for run_id in runs]
        except StoreBusy:  # this process's pool meets the restart too
            return False
        return all(h is not None and h.status is RunStatus.DONE for h in heads)

    try:
        # Given the workers, idle and listening for work, given 30 runs, and mid-run
        _wait(lambda: _listening(store) == WORKERS, "the workers never listened", tmp_path)
        for run_id in runs:
            client.start(run_id=run_id, agent=AGENT, input={"steps": STEPS})
        _wait(lambda: len(effects()) >= STOP_AFTER_EFFECTS, "no work done", tmp_path)

        # When the server stops, and starts again once every worker has said it lost it
        postgres.stop_server()
        stopped = time.monotonic()
        applied_while_up = len(effects())
        _wait(
            lambda: all(any(LOST.search(line) for line in _said(tmp_path, w)) for w in workers),
            "not every worker said it lost the store",
            tmp_path,
        )
        down_seconds = time.monotonic() - stopped
        postgres.start_server()
        _wait(all_done, "not every run done after the restart", tmp_path)
        elapsed = time.monotonic() - stopped
        # And each idle worker listens for work again, on a connection made anew (the
        # server's sessions all ended with it): a run started now is done
        _wait(lambda: _listening(store) == WORKERS, "not listening again", tmp_path)
        late = time.monotonic()
        client.start(run_id="after", agent=AGENT, input={"steps": 1})
        runs.append("after")
        _wait(all_done, "the run started after the restart was not done", tmp_path)
        after_ms = (time.monotonic() - late) * 1000
        alive = {name: worker.poll() for name, worker in workers.items()}
    finally:
        for worker in workers.values():
            worker.send_signal(signal.SIGTERM)
        codes = {}
        for name, worker in workers.items():
            try:
                codes[name] = worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()

    # Then every worker lived through it, saying so in one line each way, and no more
    assert alive == dict.fromkeys(workers), alive
    assert codes == dict.fromkeys(workers, 0), codes
    came_back = {}
    for name in workers:
        said = _said(tmp_path, name)
        lost = [line for line in said if LOST.search(line)]
        back = [line for line in said if BACK.search(line)]
        assert len(lost) == 1, (name, lost)
        assert len(back) == 1, (name, back)
        came_back[name] = back[0]
        assert said.index(lost[0]) < said.index(back[0]), said
        assert not [line for line in said if "Traceback" in line], said
        answered = [line for line in said if "did not answer" in line]
        assert answered == lost, (name, answered)  # the outage's cause, once
    # And every run is done, every key applied once, every step committed once at its first
    # attempt
    applied = effects()
    expected = {
        (f"{run_id}/step-{n}", run_id)
        for run_id in runs
        for n in range(1, (1 if run_id == "after" else STEPS) + 1)
    }
    assert len(applied) == len(expected)
    assert set(applied) == expected
    for run_id in runs:
        steps = [
            c.event
            for c in client.runtime.store.list_checkpoints(run_id)
            if isinstance(c.event, StepCompleted)
        ]
        length = 1 if run_id == "after" else STEPS
        assert Counter(s.step for s in steps) == Counter(range(1, length + 1)), (run_id, steps)
        assert {s.attempt for s in steps} == {1}, (run_id, [(s.step, s.attempt) for s in steps])
    print(
        f"\n{RUNS} runs x {STEPS} steps over {WORKERS} workers; server stopped after "
        f"{applied_while_up} keys, every worker said so {down_seconds:.1f} s after; every run done "
        f"{elapsed:.1f} s after the stop; {len(applied)} keys applied once; a run started "
        f"after it done in {after_ms:.0f} ms; "
        f"{came_back}"
    )
    client.runtime.close()
