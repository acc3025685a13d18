"""Schedules fired by real `ratchet worker` processes: two workers started at once fire a due
time exactly once (one run, done), and a worker started again afterwards fires nothing more;
`ratchet schedule pause|resume|remove`, run while a worker's fire starts its run, stays done;
`ratchet schedule` refuses what cannot fire in one line, writing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ratchet.adapters.sqlite.schedules import SqliteScheduleBook
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.schedules import Schedule, ScheduleSpec, fire_run_id, latest_due
from ratchet.state import RunStatus
from tests.processes import Cli, clean_env

PAUSED = 10
GATED = textwrap.dedent(
    """
    import time
    from pathlib import Path

    from ratchet.tools import Agent, Done

    HERE = Path(__file__).parent


    def _held(ctx):
        # The fire has read its schedule and not yet written it back: the test acts here.
        (HERE / f"arrived-{ctx.run_id}").touch()
        deadline = time.monotonic() + 120
        while not (HERE / f"go-{ctx.run_id}").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the test never let the start go on")
            time.sleep(0.05)


    agent = Agent(
        name="gated", goal="Nothing.", tools=[], policy=lambda view: Done(summary="-"),
        prepare=_held,
    )
    """
)
"""An agent whose start (its `prepare` hook, run by the worker's fire between reading the
schedule and writing it back) waits for the test's go."""


def _due_schedule(
    cli: Cli, name: str = "minutely", agent: str = "migration", input: dict[str, int] | None = None
) -> datetime:
    """An every-minute schedule added ten minutes ago whose worker never ran: due now."""
    now = datetime.now(UTC)
    spec = ScheduleSpec(
        name=name, agent=agent, every_seconds=60, input={"batches": 1} if input is None else input
    )
    schedule = Schedule(
        spec=spec, anchor=now - timedelta(minutes=10), next_fire=now - timedelta(minutes=9)
    )
    runtime = LocalRuntime.open(LocalSettings(store=cli.store))
    try:
        assert SqliteScheduleBook(runtime.db).add(schedule)
    finally:
        runtime.close()
    due = latest_due(schedule, now)
    assert due is not None
    return due


def _arrived(folder: Path, name: str, worker: subprocess.Popen[str]) -> str:
    """The run id of `name`'s fire, once its start is held."""
    deadline = time.monotonic() + 120
    while not (held := sorted(folder.glob(f"arrived-{name}-2*"))):
        assert worker.poll() is None, "the worker ended before the fire"
        assert time.monotonic() < deadline, f"{name} never fired"
        time.sleep(0.05)
    (arrived,) = held
    return arrived.name.removeprefix("arrived-")


def test_two_workers_and_a_restarted_one_fire_a_due_time_exactly_once(tmp_path):
    cli = Cli(tmp_path)
    due = _due_schedule(cli)

    workers = [cli.spawn_worker(f"w{n}") for n in range(2)]
    for worker in workers:
        assert worker.wait(timeout=120) == 0
    fired = json.loads(cli.ok("list", "--json"))["runs"]
    restarted = cli.spawn_worker("restarted")
    assert restarted.wait(timeout=120) == 0
    after = json.loads(cli.ok("list", "--json"))["runs"]

    expected = fire_run_id("minutely", due)
    assert [r["run_id"] for r in fired] == [expected]
    assert [r["run_id"] for r in after] == [expected]  # the restart fired nothing again
    # The migration parks for its approval: it was worked, by one worker.
    assert cli.head(expected).status is RunStatus.WAITING
    (row,) = json.loads(cli.ok("schedule", "list", "--json"))["schedules"]
    assert row["last_run"] == expected
    assert datetime.fromisoformat(row["next_fire"]) > due


def test_a_pause_resume_or_removal_run_while_a_worker_fires_stays_done(tmp_path):
    cli = Cli(tmp_path)
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "gated.py").write_text(GATED)
    paused = [f"paused-{n}" for n in range(PAUSED)]
    for name in [*paused, "removed", "resumed"]:
        _due_schedule(cli, name, agent="gated:agent", input={})
    path = os.pathsep.join([str(agents), os.environ.get("PYTHONPATH", "")])
    worker = subprocess.Popen(
        cli.argv("worker", "--until-idle", "--worker-id", "firer", "--lease-seconds", "0.5"),
        stdout=(tmp_path / "firer.log").open("a"),
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(PYTHONPATH=path),
    )

    # Each command runs, to its exit 0, while the worker holds that schedule's fire between
    # reading the schedule and writing it back (the fires go by name).
    answered = {}
    try:
        for name in [*paused, "removed", "resumed"]:
            run_id = _arrived(agents, name, worker)
            if name == "removed":
                cli.ok("schedule", "remove", name)
            elif name == "resumed":
                cli.ok("schedule", "pause", name)
                answered[name] = cli.json("schedule", "resume", name)
            else:
                answered[name] = cli.json("schedule", "pause", name)
            (agents / f"go-{run_id}").touch()
        assert worker.wait(timeout=120) == 0, (tmp_path / "firer.log").read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    kept = {r["name"]: r for r in cli.json("schedule", "list")["schedules"]}
    stayed = [name for name in paused if kept[name]["paused"]]
    print(f"\n{len(stayed)} of {PAUSED} schedules paused during a fire stayed paused")
    assert all(answered[name]["paused"] for name in paused)
    assert stayed == paused
    assert "removed" not in kept
    assert kept["resumed"] == answered["resumed"]
    assert not kept["resumed"]["paused"]
    # What a worker would fire from now on, however late: the resumed schedule alone.
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        due = SqliteScheduleBook(runtime.db).due(datetime.now(UTC) + timedelta(days=400))
    finally:
        runtime.close()
    assert [s.name for s in due] == ["resumed"]


def test_a_schedule_that_cannot_fire_is_one_line_and_writes_nothing(tmp_path):
    cli = Cli(tmp_path)
    LocalRuntime.open(LocalSettings(store=cli.store)).close()  # an empty store
    for args, said in [
        (["--cron", "61 * * * *"], "ratchet: cron: '61 * * * *' is not a five-field cron"),
        (["--every", "30s"], "ratchet: every: 30s is under a minute, the shortest interval"),
        (["--cron", "0 2 * * *", "--timezone", "Mars/Olympus"], "ratchet: timezone: "),
        (["--cron", "0 2 * * *", "--every", "1h"], "ratchet: give either --cron or --every"),
    ]:
        done = cli.run("schedule", "add", "nightly", "--agent", "migration", *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(said), done.stderr
        assert done.stderr.count("\n") == 1
    assert json.loads(cli.ok("schedule", "list", "--json")) == {"schedules": []}
