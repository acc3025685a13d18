"""Child runs with real worker processes, SIGKILL and SIGSTOP: a worker killed after its
parent's step started 10 children and before that step's checkpoint leaves the next workers to
retry the step, which starts none of them twice (each child works once), and the parent ends
done with their 10 results; a worker killed right after a child's last commit, before it told
the parent, leaves the parent to a live worker's sweep, which settles it. A parent cancelled
(`ratchet cancel`) while its worker stands still inside the fan-out step, before any child is
created, with 2 of 5 created, or with all 5 created and the step not committed, leaves no
child to run: each one created ends cancelled, and none runs to done; a child whose worker
stands still inside its first step when the cancel lands ends cancelled too."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    ("fault", "pause_at", "created"),
    [
        pytest.param("stop:after_tool@1", None, 0, id="before-any-child-is-created"),
        pytest.param(None, 2, 3, id="with-2-of-5-created"),
        pytest.param("stop:after_children_started@1", None, 5, id="after-all-5-before-the-commit"),
    ],
)
def test_a_parent_cancelled_inside_its_fan_out_step_leaves_no_child_running(
    tmp_path, fault, pause_at, created
):
    # Given a worker standing still inside the parent's fan-out step (SIGSTOP)
    cli = Cli(tmp_path)
    _start(cli, "p", children=5, pause_at=pause_at)
    paused = cli.spawn_worker("paused", fault=fault)
    _wait_stopped(paused, tmp_path / "paused.log")
    children = [child_run_id("p", 1, i) for i in range(5)]
    assert cli.head("p").step == 0  # the fan-out step is under way, not committed

    # When the parent is cancelled, and the worker goes on with the step, then workers work
    # whatever is left to run
    cli.ok("cancel", "p", "--reason", "not needed", "--by", "ops")
    _go_on(paused)
    cli.work_until_idle()

    # Then every child that was created ended cancelled, and none ran to done
    heads = {c: _head_or_none(cli, c) for c in children}
    ended = Counter(head.status.value for head in heads.values() if head is not None)
    print(f"cancel {fault or f'pause_at={pause_at}'}: {dict(ended)} of 5 children")
    assert cli.head("p").status is RunStatus.CANCELLED
    assert ended[RunStatus.DONE.value] == 0
    assert ended == ({RunStatus.CANCELLED.value: created} if created else {})
    for head in heads.values():
        if head is not None:
            assert head.summary is not None
            assert head.summary.endswith("its parent run p was cancelled")


def test_a_child_already_working_when_its_parent_is_cancelled_mid_fan_out_is_cancelled_too(
    tmp_path,
):
    # Given the parent's worker standing still after creating 5 children, its step not
    # committed, and a second worker standing still inside one child's first step, past the
    # check of its parent (leases long enough that no one takes either run meanwhile)
    cli = Cli(tmp_path)
    log = tmp_path / "work.log"
    _start(cli, "p", children=5, log=str(log))
    parents = cli.spawn_worker("parents", fault="stop:after_children_started@1", lease=60)
    _wait_stopped(parents, tmp_path / "parents.log")
    children = cli.spawn_worker("children", fault="stop:after_tool@1", lease=60)
    _wait_stopped(children, tmp_path / "children.log")
    (working,) = _worked(log)  # its tool ran; its step is not committed

    # When the parent is cancelled, and both workers go on with their steps (and stop there),
    # then a worker finishes what is left
    cli.ok("cancel", "p", "--reason", "not needed", "--by", "ops")
    _go_on(parents, children, then_stop=True)
    cli.work_until_idle()

    # Then the child that was working ended cancelled (its step's commit refused), as did
    # every other, and none ran to done
    ended = Counter(cli.head(child_run_id("p", 1, i)).status.value for i in range(5))
    print(f"cancel with {working} mid-step: {dict(ended)} of 5 children")
    assert cli.head(working).status is RunStatus.CANCELLED
    assert cli.head(working).step == 0
    assert ended == {RunStatus.CANCELLED.value: 5}
    assert _worked(log) == {working: 1}  # no other child's tool ran


def _wait_stopped(process: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not _stopped(process):
        assert process.poll() is None, f"the worker exited: {log.read_text()}"
        assert time.monotonic() < deadline, f"the worker never stopped: {log.read_text()}"
        time.sleep(0.05)


def _go_on(*processes: subprocess.Popen[str], then_stop: bool = False) -> None:
    """Let the stopped workers go on (SIGCONT) until they exit (with `then_stop`, once the
    step each stands in is over: SIGTERM); one that stops again (the same point reached in
    another run's step, which the test does not pause) is killed there: the lease it holds
    lapses and the next worker takes over."""
    for process in processes:
        if then_stop:
            process.send_signal(signal.SIGTERM)  # handled once it goes on
        process.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + WAIT_SECONDS
    while any(process.poll() is None for process in processes):
        for process in processes:
            if process.poll() is None and _stopped(process):
                process.kill()
                process.wait(timeout=WAIT_SECONDS)
        assert time.monotonic() < deadline, "the workers never ended"
        time.sleep(0.05)


def _stopped(process: subprocess.Popen[str]) -> bool:
    try:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _head_or_none(cli: Cli, run_id: str) -> RunState | None:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        return runtime.store.load_head(run_id)
    finally:
        runtime.close()
