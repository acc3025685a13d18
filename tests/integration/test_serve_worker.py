"""`ratchet serve`'s worker: `ratchet worker`'s loop on a thread with a store connection of its
own. It works what is runnable, stops when told (saying nothing), and tells the server when it
stops on its own, so the server stops too."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from ratchet.adapters.sqlite.leases import WorkerIdInUse
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.serving import ServeWorker
from ratchet.state import RunOptions, RunState, RunStatus

LOG = logging.getLogger("ratchet.tests.serve_worker")
PATIENCE = 30.0


def _settings(root: Path) -> LocalSettings:
    return LocalSettings(store=f"sqlite:///{root / 'ratchet.db'}")


def _start(runtime: LocalRuntime, run_id: str) -> None:
    state = RunState(
        run_id=run_id, agent="notebook", goal="file a note", options=RunOptions(model="scripted")
    )
    assert runtime.engine(worker_id="test", logger=LOG).start(state)


def test_it_works_the_runs_and_stops_when_told_without_complaint(tmp_path):
    settings = _settings(tmp_path)
    runtime = LocalRuntime.open(settings)
    stopped: list[BaseException | None] = []
    worker = ServeWorker(
        settings,
        worker_id="serve-test",
        logger=LOG,
        on_park=lambda *_: None,
        on_stopped=stopped.append,
    )
    try:
        worker.start()
        _start(runtime, "n1")
        deadline = time.monotonic() + PATIENCE
        while (head := runtime.store.load_head("n1")) is None or head.status is not RunStatus.DONE:
            assert time.monotonic() < deadline, f"never done: {head}"
            time.sleep(0.05)
        steps = [c for c in runtime.store.list_checkpoints("n1") if c.event.kind == "step"]
        assert {c.worker_id for c in steps} == {"serve-test"}
    finally:
        assert worker.stop(), "an idle worker stops at once"
        runtime.close()
    assert stopped == [], "a stop asked for is not news"
    assert not any(t.name == "ratchet serve worker" for t in threading.enumerate())


def test_a_worker_that_stops_on_its_own_says_why(tmp_path):
    # Given a live worker holding the id already
    settings = _settings(tmp_path)
    runtime = LocalRuntime.open(settings)
    runtime.leases.register_worker("taken", "someone-else", 30.0)
    told = threading.Event()
    stopped: list[BaseException | None] = []

    def on_stopped(failure: BaseException | None) -> None:
        stopped.append(failure)
        told.set()

    worker = ServeWorker(
        settings, worker_id="taken", logger=LOG, on_park=lambda *_: None, on_stopped=on_stopped
    )
    try:
        worker.start()
        assert told.wait(PATIENCE), "the server is told"
    finally:
        worker.stop()
        runtime.close()
    (failure,) = stopped
    assert isinstance(failure, WorkerIdInUse)
