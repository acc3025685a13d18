"""Fair shares with real worker processes: 30 runs of an agent with `max_concurrent_per_key=2`,
10 of each of 3 keys, never have more than 2 of a key in flight (each step's tool logs when it
starts and ends), all 30 end, and the runs started with a high priority wait less for their
first step than those started before them with a low one. A SIGKILLed worker's slot of a key
frees when its lease lapses, not before, while a run of another key goes on meanwhile."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from statistics import mean

from pydantic import JsonValue

from ratchet.agents import LOCAL
from ratchet.client import Client
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus
from tests.bounded_agent import KEYED, KEYED_ONE, in_flight
from tests.processes import Cli, clean_env

WAIT_SECONDS = 60.0
KEYS = ("acme", "globex", "initech")
HIGH, LOW = 9, 0


def _start(cli: Cli, reference: str, runs: list[tuple[str, str, int]], **params: JsonValue) -> None:
    """Start each (run id, key, priority) as the CLI and the runs API start runs."""
    runtime = LocalRuntime.open(LocalSettings(store=cli.store))
    try:
        client = Client(runtime, agents=LOCAL, worker_id="test", logger=None)
        for run_id, key, priority in runs:
            client.start(
                run_id=run_id, agent=reference, input=params, concurrency_key=key, priority=priority
            )
    finally:
        runtime.close()


def _starts(log: Path) -> dict[str, list[float]]:
    """When each run's steps started, by the tool's own log."""
    moments: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        what, moment, run_id, _ = line.split()
        if what == "start":
            moments.setdefault(run_id, []).append(float(moment))
    return moments


def _worker(cli: Cli, name: str, *, lease: float) -> subprocess.Popen[str]:
    out = (cli.root / f"{name}.log").open("a")
    return subprocess.Popen(
        cli.argv("worker", "--until-idle", "--worker-id", name, "--lease-seconds", str(lease)),
        stdout=out,
        stderr=out,
        text=True,
        env=clean_env(),
    )


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_thirty_runs_of_three_keys_bounded_at_two_a_key_and_the_high_priority_ones_first(
    tmp_path,
):
    # Given 10 runs of each of 3 keys, of an agent bounded at 2 runs a key (and not at all
    # otherwise): in each key 5 of priority 0 started first, then 5 of priority 9.
    cli = Cli(tmp_path)
    log = tmp_path / "steps.log"
    runs = [
        (f"{key}-{priority}-{n}", key, priority)
        for key in KEYS
        for priority in (LOW, HIGH)
        for n in range(5)
    ]
    _start(cli, KEYED, runs, log=str(log))

    # When 5 workers work them.
    began = time.time()
    workers = {f"w{n}": _worker(cli, f"w{n}", lease=10.0) for n in range(5)}
    for name, worker in workers.items():
        assert worker.wait(timeout=180) == 0, (tmp_path / f"{name}.log").read_text()

    # Then never more than 2 of a key were in flight, and every run ended, each step once.
    most = {key: in_flight(log, [r for r, k, _ in runs if k == key])[0] for key in KEYS}
    together, started = in_flight(log)
    print(f"most runs in flight by key, bound 2 a key: {most}; of all keys at once: {together}")
    assert max(most.values()) <= 2, most
    assert together > 2, "no two keys were ever at work at once: the bound is not per key"
    assert {r: cli.head(r).status for r, _, _ in runs} == dict.fromkeys(
        [r for r, _, _ in runs], RunStatus.DONE
    )
    assert started == dict.fromkeys([r for r, _, _ in runs], 2)

    # And the runs of priority 9 waited less for their first step than those of priority 0.
    first = {run_id: min(moments) - began for run_id, moments in _starts(log).items()}
    waits = {
        priority: mean(first[r] for r, _, p in runs if p == priority) for priority in (HIGH, LOW)
    }
    print(
        f"mean wait for the first step: priority {HIGH} {waits[HIGH]:.3f} s, "
        f"priority {LOW} {waits[LOW]:.3f} s"
    )
    assert waits[HIGH] < waits[LOW], waits


def test_a_killed_workers_slot_of_a_key_frees_when_its_lease_lapses_and_not_before(tmp_path):
    # Given an agent bounded at 1 run a key: a run of key k1 held in its step, a second run of
    # k1, and a run of k2.
    cli = Cli(tmp_path)
    log = tmp_path / "steps.log"
    _start(cli, KEYED_ONE, [("held", "k1", 0)], log=str(log), hold=120, steps=1)
    _start(cli, KEYED_ONE, [("next", "k1", 0), ("other", "k2", 0)], log=str(log), steps=1)
    holder = _worker(cli, "holder", lease=10.0)
    _until(lambda: log.exists() and "held" in log.read_text(), "the holder to start its step")

    # When the worker holding k1's slot is SIGKILLed and another worker comes.
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    lapses_at = _lease_expiry(tmp_path / "ratchet.db", "held")
    other = _worker(cli, "other", lease=10.0)
    assert other.wait(timeout=120) == 0, (tmp_path / "other.log").read_text()

    # Then the run of k2 went on at once, and k1's second run only once the lease lapsed.
    starts = _starts(log)
    print(
        f"lease lapsed at {lapses_at:.3f}; k2's run started {starts['other'][0] - lapses_at:+.3f} "
        f"s from it, k1's second run {starts['next'][0] - lapses_at:+.3f} s"
    )
    assert starts["other"][0] < lapses_at, "a run of another key waited for k1's slot"
    assert min(starts["next"]) >= lapses_at, "a step of k1 started while the dead one's was live"
    assert [cli.head(r).status for r in ("held", "next", "other")] == [RunStatus.DONE] * 3


def _lease_expiry(db: Path, run_id: str) -> float:
    connection = sqlite3.connect(db)
    try:
        (expires_at,) = connection.execute(
            "SELECT expires_at FROM leases WHERE run_id = ?", (run_id,)
        ).fetchone()
    finally:
        connection.close()
    return float(expires_at)
