"""Schedules fired by real `ratchet worker` processes: two workers started at once fire a due
time exactly once (one run, done), and a worker started again afterwards fires nothing more;
`ratchet schedule` refuses what cannot fire in one line, writing nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from ratchet.adapters.sqlite.schedules import SqliteScheduleBook
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.schedules import Schedule, ScheduleSpec, fire_run_id, latest_due
from ratchet.state import RunStatus
from tests.processes import Cli


def _due_schedule(cli: Cli) -> datetime:
    """An every-minute schedule added ten minutes ago whose worker never ran: due now."""
    now = datetime.now(UTC)
    spec = ScheduleSpec(name="minutely", agent="migration", every_seconds=60, input={"batches": 1})
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
