"""`ratchet start` and `ratchet approve` load what they use (issue 36): not typer (the entry
point reads their options, `ratchet.cli.quick_writes`), not rich (they write plain lines,
`ratchet.cli.context.say_line`), not the engine's event loop (`asyncio`, loaded by the commands
that work steps), not the schedules (`ratchet.schedules`, and the cron reader `croniter` with
`dateutil`, loaded by whatever reads a schedule), not the feed or the worker (loaded by what
follows or works runs), not the store's books of webhook deliveries, hooks, housekeeping and the
event mailbox (loaded by the commands that use them: `ratchet.runtime.local`) and not the
approval messages' templates (loaded by a run that parks for a person, to write them to the
outbox). `start` writes no log line, and so does not load the JSON logger (Powertools, made at
its first line: `ratchet.observability.json_logger`); `approve` logs the checkpoint it writes.

Held on the modules a command loads, not on its time, which a shared machine makes noisy."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

UNUSED = (
    "typer",
    "rich",
    "ratchet.cli.app",
    "ratchet.feed",
    "ratchet.worker",
    "ratchet.schedules",
    "ratchet.cli.readout",
    "ratchet.waiting.hooks",
    "ratchet.adapters.sqlite.deliveries",
    "ratchet.adapters.sqlite.hooks",
    "ratchet.adapters.sqlite.housekeeping",
    "ratchet.adapters.sqlite.mailbox",
    "asyncio",
    "croniter",
    "dateutil",
    "ratchet.adapters.outbox",
    "ratchet.approvals.messages",
)
"""What neither command uses, and so must not load."""
UNUSED_BY_START = ("aws_lambda_powertools", "jmespath", "ratchet.approvals.desk")
"""What `start` does not use: it logs nothing, and opens and decides no approval request."""
BUDGETS = {"start": 312, "approve": 362}
"""The most modules each command may have loaded when it exits (the interpreter's own
included). `start` loaded 519 before issue 36, 467 with its lazy imports, 414 through the
entry point's own reading of its options, without typer, and 308 without rich, Powertools, the
feed, the worker, the schedules, the read commands' text, the approval desk and the store's
books that neither uses (webhook deliveries, hooks, housekeeping, the mailbox; `approve`: 358,
with Powertools and the approval desk); 310 and 360 on the main this budget was last set on
(f19768f), with nothing to spare; 312 and 362 since the engine reserves a run's budget
(`ratchet.engine.spending`) and holds its agent's day (`ratchet.adapters.sqlite.daily_spend`,
issue 38); a new import at the top of a module on their path shows
here first, with the modules it brought."""

PROBE = (
    "import sys\n"
    "from ratchet.cli.quick import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit as exit:\n"
    "    assert not exit.code, exit.code\n"
    "print('MODULES', ' '.join(sorted(sys.modules)))\n"
)


def _loaded(store: Path, *args: str) -> set[str]:
    """The modules `ratchet ARGS` had loaded when it finished, in a process of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "ANTHROPIC_"))}
    env["RATCHET_STORE"] = f"sqlite:///{store}"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=env,
        cwd=store.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("MODULES "), done.stdout
    return set(last.removeprefix("MODULES ").split())


def test_start_and_approve_load_only_what_they_use(tmp_path: Path) -> None:
    store = tmp_path / "ratchet.db"
    migration = ("--scenario=migration", "--param=batches=2")
    started = _loaded(store, "start", *migration, "--run-id=started")
    worked = _loaded(store, "run", *migration, "--run-id=parked")  # to the wait for a person
    approved = _loaded(store, "approve", "parked")

    # The probe is not blind: the run that parks for a person writes its messages.
    assert {"ratchet.adapters.outbox", "ratchet.approvals.messages"} <= worked
    # `run` is read by the entry point too: it works its steps without typer or the full CLI.
    assert not sorted(m for m in worked if m.partition(".")[0] == "typer" or m == "ratchet.cli.app")
    assert "aws_lambda_powertools" in approved  # the probe sees the logger a line loads
    for name, loaded, unwanted in (
        ("start", started, UNUSED + UNUSED_BY_START),
        ("approve", approved, UNUSED),
    ):
        unused = sorted(m for m in loaded if m.partition(".")[0] in unwanted or m in unwanted)
        assert not unused, f"ratchet {name} loaded {unused}"
        assert len(loaded) <= BUDGETS[name], f"ratchet {name} loaded {len(loaded)} modules"


def test_start_leaves_the_migrations_app_data_to_its_first_step(tmp_path: Path) -> None:
    # A start need not wait for the syncs of a SQLite file the worker makes anyway: the
    # migration's data is made and seeded by the step that first opens it.
    store = tmp_path / "ratchet.db"
    migration = ("--scenario=migration", "--param=batches=2")

    _loaded(store, "start", *migration, "--run-id=started")

    assert not list(tmp_path.rglob("app.db"))
    _loaded(store, "run", *migration, "--run-id=worked")  # to the wait for a person
    (data,) = tmp_path.rglob("app.db")
    with closing(sqlite3.connect(data)) as app:
        assert app.execute("SELECT value FROM meta WHERE name = 'source_rows'").fetchone() == (
            "2000",
        )
        assert app.execute("SELECT count(*) FROM orders").fetchone() == (2000,)
