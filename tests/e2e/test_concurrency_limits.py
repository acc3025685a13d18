"""Concurrency limits with real worker processes: 20 runs of an agent with `max_concurrent=3`
and 4 workers never have more than 3 steps in flight (each step's tool logs when it starts and
ends), and all 20 finish; a SIGKILLed worker's slot frees when its lease lapses, not before.
The bound is the agent's, however its runs name it (two import paths of it, a registered name),
and an override naming no agent the workers know stops them before they claim anything."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import JsonValue

from ratchet.agents import LOCAL, AgentRegistry
from ratchet.client import Client
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions, RunState, RunStatus
from tests.bounded_agent import AGENT, TWO, agent, in_flight
from tests.processes import Cli, clean_env

WAIT_SECONDS = 60.0
HELD_LEASE = 10.0
"""The lease of a worker whose step is held for seconds: long enough that a busy machine's late
heartbeat never lets it lapse (a lapsed lease frees its slot, by design, and another worker
would take the run)."""
ALIAS_TWO = "tests.bounded_alias:two"
"""`tests.bounded_agent:two` under another import path (its module re-exports it)."""
REGISTERED = AgentRegistry().with_agents({"two-by-name": ALIAS_TWO})
"""The agents as `ratchet serve --agent two-by-name=tests.bounded_alias:two` (or a project's
`[tool.ratchet] agents`) registers them: its runs API starts `two` by that name, and the run
records the name's target."""


def _start(cli: Cli, run_ids: list[str], **params: object) -> None:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store))
    try:
        engine = runtime.engine(worker_id="test", logger=None)
        for run_id in run_ids:
            options = RunOptions(params={**agent.default_params, **params})
            assert engine.start(RunState(run_id=run_id, agent=AGENT, goal="Work", options=options))
    finally:
        runtime.close()


def _start_as(
    cli: Cli, agents: AgentRegistry, reference: str, run_ids: list[str], **params: JsonValue
) -> None:
    """Start the runs as the client starts them (the CLI, serve's runs API) with `agents`."""
    runtime = LocalRuntime.open(LocalSettings(store=cli.store))
    try:
        client = Client(runtime, agents=agents, worker_id="test", logger=None)
        for run_id in run_ids:
            client.start(run_id=run_id, agent=reference, input=params)
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
    env = clean_env(RATCHET_MAX_CONCURRENT=json.dumps({AGENT: 1}))
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


def _hold_until_the_others_wait(
    cli: Cli, log: Path, workers: Mapping[str, subprocess.Popen[str]], bound: int
) -> None:
    """Until `bound` runs are in their gated first step and every other worker has been turned
    away by a claim while they are (it then says whose leases it waits for: a claim finds
    nothing only while no run it could take is free); failing as soon as more than `bound`
    runs are in flight."""

    def settled() -> bool:
        if not log.exists():
            return False
        most, started = in_flight(log)
        assert most <= bound, f"{most} runs of an agent bounded at {bound} in flight at once"
        lines = [line.split() for line in log.read_text().splitlines()]
        holders = {int(pid) for what, _, _, pid in lines if what == "start"}
        waiting = [
            name
            for name, process in workers.items()
            if process.pid not in holders
            and all(
                f"lease on {run} until" in (cli.root / f"{name}.log").read_text() for run in started
            )
        ]
        return len(started) == bound and len(waiting) == len(workers) - bound

    _until(settled, f"{bound} runs in flight and the other workers waiting")


def _most_in_flight(log: Path, namings: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """The most runs in flight at once under each naming, and of all of them together."""
    figures = {naming: in_flight(log, runs)[0] for naming, runs in namings.items()}
    figures["together"] = in_flight(log)[0]
    return figures


def test_an_agent_started_by_two_names_has_its_bound_of_runs_in_flight_not_one_per_name(
    tmp_path,
):
    # Given an agent bounded at 2, two runs started by its import path and two by a
    # registered name whose target is another import path of it, and four workers.
    cli = Cli(tmp_path)
    log, gate = tmp_path / "steps.log", tmp_path / "gate"
    namings = {"import path": ["path-0", "path-1"], "registered name": ["name-0", "name-1"]}
    _start_as(cli, LOCAL, TWO, namings["import path"], log=str(log), gate=str(gate))
    _start_as(
        cli, REGISTERED, "two-by-name", namings["registered name"], log=str(log), gate=str(gate)
    )
    assert {cli.head(run).agent for runs in namings.values() for run in runs} == {TWO, ALIAS_TWO}

    # When two runs hold their slots until every other worker has tried for one.
    workers = {f"w{n}": _worker(cli, f"w{n}", clean_env(), lease=HELD_LEASE) for n in range(4)}
    try:
        _hold_until_the_others_wait(cli, log, workers, bound=2)
    finally:
        gate.touch()  # a failed check lets the held steps go, and the workers end
    for name, worker in workers.items():
        assert worker.wait(timeout=120) == 0, (tmp_path / f"{name}.log").read_text()

    # Then never more than 2 were in flight, under either name or both.
    most = _most_in_flight(log, namings)
    print(f"most runs in flight, bound 2: {most}")
    assert max(most.values()) <= 2, most
    runs = [run for names in namings.values() for run in names]
    assert {run: cli.head(run).status for run in runs} == dict.fromkeys(runs, RunStatus.DONE)
    assert in_flight(log)[1] == dict.fromkeys(runs, 2)


def test_an_override_by_one_name_of_an_agent_bounds_its_runs_under_every_name(tmp_path):
    # Given the agent bounded at 1 by RATCHET_MAX_CONCURRENT, keyed by its import path, and
    # runs started by that path and by a registered name of another path of it.
    cli = Cli(tmp_path)
    log, gate = tmp_path / "steps.log", tmp_path / "gate"
    namings = {"import path": ["path-0", "path-1"], "registered name": ["name-0", "name-1"]}
    _start_as(cli, LOCAL, TWO, namings["import path"], log=str(log), gate=str(gate))
    _start_as(
        cli, REGISTERED, "two-by-name", namings["registered name"], log=str(log), gate=str(gate)
    )
    env = clean_env(RATCHET_MAX_CONCURRENT=json.dumps({TWO: 1}))

    workers = {f"w{n}": _worker(cli, f"w{n}", env, lease=HELD_LEASE) for n in range(3)}
    try:
        _hold_until_the_others_wait(cli, log, workers, bound=1)
    finally:
        gate.touch()  # a failed check lets the held steps go, and the workers end
    for name, worker in workers.items():
        assert worker.wait(timeout=120) == 0, (tmp_path / f"{name}.log").read_text()

    most = _most_in_flight(log, namings)
    print(f"most runs in flight, overridden to 1: {most}")
    assert max(most.values()) <= 1, most
    runs = [run for names in namings.values() for run in names]
    assert {run: cli.head(run).status for run in runs} == dict.fromkeys(runs, RunStatus.DONE)


def test_a_worker_refuses_to_start_with_an_override_that_names_no_agent_it_knows(tmp_path):
    # An agent's own name is not a name a worker loads an agent by: the override would bound
    # nothing it could check, so the worker stops before it claims a run, saying so.
    cli = Cli(tmp_path)
    log = tmp_path / "steps.log"
    _start_as(cli, LOCAL, TWO, ["r-0"], log=str(log))
    env = clean_env(RATCHET_MAX_CONCURRENT='{"bounded-two": 1}')

    worker = _worker(cli, "w0", env, lease=0.5)

    assert worker.wait(timeout=120) == 2
    said = (tmp_path / "w0.log").read_text().strip()
    assert said.startswith("ratchet: RATCHET_MAX_CONCURRENT: 'bounded-two' names no agent"), said
    assert len(said.splitlines()) == 1, said
    assert not log.exists(), "a step ran under an override that bounds nothing"
    assert cli.head("r-0").status is RunStatus.RUNNING
