"""Child runs with real worker processes and SIGKILL: a worker killed after its parent's step
started 10 children and before that step's checkpoint leaves the next workers to retry the
step, which starts none of them twice (each child works once), and the parent ends done with
their 10 results; a worker killed right after a child's last commit, before it told the
parent, leaves the parent to a live worker's sweep, which settles it."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunState, RunStatus, WaitSettled, child_run_id
from tests.children_agent import PARENT, parent
from tests.processes import Cli

WAIT_SECONDS = 60.0


def _start(cli: Cli, run_id: str, **params: object) -> None:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store))
    try:
        options = {"params": {**parent.default_params, **params}}
        state = RunState.model_validate(
            {"run_id": run_id, "agent": PARENT, "goal": "Delegate", "options": options}
        )
        assert runtime.engine(worker_id="test", logger=None).start(state)
    finally:
        runtime.close()


def _outcomes(cli: Cli, run_id: str) -> list[tuple[str, RunStatus]]:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        (settled,) = [
            c.event
            for c in runtime.store.list_checkpoints(run_id)
            if isinstance(c.event, WaitSettled)
        ]
    finally:
        runtime.close()
    assert settled.children is not None
    return [(o.run_id, o.status) for o in settled.children]


def _worked(log: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in log.read_text().splitlines())


def test_a_worker_killed_between_starting_children_and_the_checkpoint_starts_none_twice(
    tmp_path,
):
    cli = Cli(tmp_path)
    log = tmp_path / "work.log"
    _start(cli, "p", children=10, log=str(log))

    killed = cli.spawn_worker("killed", fault="kill:after_children_started@1")
    assert killed.wait(timeout=60) == -signal.SIGKILL
    children = [child_run_id("p", 1, i) for i in range(10)]
    assert cli.head("p").step == 0  # the step's checkpoint was never written
    assert all(cli.head(c).status is RunStatus.RUNNING for c in children)

    workers = [cli.spawn_worker(f"w{n}") for n in range(2)]
    for worker in workers:
        assert worker.wait(timeout=120) == 0

    assert cli.head("p").status is RunStatus.DONE
    assert _outcomes(cli, "p") == [(c, RunStatus.DONE) for c in children]
    assert _worked(log) == dict.fromkeys(children, 1)  # no child started (or worked) twice


def test_a_child_whose_worker_died_before_telling_its_parent_is_found_by_the_sweep(tmp_path):
    cli = Cli(tmp_path)
    _start(cli, "p", children=1)

    # The child's step 2 is its end (it is done); the parent's step 2 comes only after it.
    killed = cli.spawn_worker("killed", fault="kill:after_commit@2")
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert cli.head("p.step-1.0").status is RunStatus.DONE
    assert cli.head("p").status is RunStatus.WAITING  # never told

    sweeper = cli.spawn_worker("sweeper", until_idle=False)
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while cli.head("p").status is not RunStatus.DONE:
            assert time.monotonic() < deadline, (tmp_path / "sweeper.log").read_text()
            time.sleep(0.1)
    finally:
        sweeper.send_signal(signal.SIGTERM)
        sweeper.wait(timeout=30)

    assert _outcomes(cli, "p") == [("p.step-1.0", RunStatus.DONE)]
