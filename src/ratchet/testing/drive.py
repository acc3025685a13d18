"""Drive one run to its end on the public local runtime, in this process: work it as a worker
does, and answer each wait from a script on a fake clock (`ratchet.testing.script`).

A crash on purpose ends the process's life with the run: an exception (`InjectedFault`) raised
at the fault point, which ends the work here (the worker stops after it, as a worker whose
process died would), or SIGKILL (`ratchet.faults`), which ends the process. Either way the next
life opens a fresh runtime and goes on from the run's last checkpoint.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratchet.client import Client, Run
from ratchet.errors import InjectedFault, InvalidInput
from ratchet.faults import NO_FAULTS, FaultPlan, FaultPoint
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus
from ratchet.testing.clock import FakeClock
from ratchet.testing.script import WaitScript
from ratchet.tools import CallRan

LOG = logging.getLogger("ratchet.testing")
"""The engine's and workers' log lines while a check drives a run: a crash on purpose logs a
traceback, which is no news to the person checking."""
LOG.addHandler(logging.NullHandler())
LOG.propagate = False

MAX_ROUNDS = 500
"""Waits answered in one life at most: a run that waits more often than this is stuck."""
CALL_RAN_SCHEMA = CallRan.model_json_schema()
WAITS_FILE = "waits.jsonl"
"""The waits a life answered, one JSON line each, beside the store: read by the next life
(the n-th wait for an event gets the script's n-th payload) and by the check."""


def store_of(root: Path) -> str:
    return f"sqlite:///{root / 'ratchet.db'}"


def open_runtime(root: Path, clock: FakeClock, *, fault: str | None = None) -> LocalRuntime:
    """The local runtime on the store in `root`, on `clock`; `fault` is the fault plan of its
    desks (an approval, an event sent: `after_wait_settled`, `after_event_accepted`)."""
    return LocalRuntime.open(LocalSettings(store=store_of(root), fault=fault), clock=clock)


@dataclass(frozen=True)
class CrashOnce(FaultPlan):
    """The plan's first fault to fire raises `InjectedFault` and sets `stop`: the worker that
    catches it (as it catches any crash in a step) stops there, and the life is over."""

    stop: threading.Event = field(default_factory=threading.Event)

    def hit(self, point: FaultPoint, step: int) -> None:
        if self.stop.is_set():
            return
        for fault in self.faults:
            if fault.point is point and fault.step == step:
                self.stop.set()
                raise InjectedFault(f"injected fault {fault}")


class ScriptRanOut(InvalidInput):
    """The run waits for something the script does not answer (an event it has no payload
    for, with no timeout): it would wait for ever."""


@dataclass
class Driver:
    """Works run `run_id` (and the child runs it starts) to its end in this process, answering
    its waits from `script` on `clock`. `call_ran` is what a person answers when an
    at-most-once call's fate is asked (the check knows: it crashed the call, before it ran or
    after). `faults` crash the steps worked here; the runtime's own plan crashes its desks."""

    runtime: LocalRuntime
    run_id: str
    script: WaitScript
    clock: FakeClock
    root: Path
    faults: FaultPlan = NO_FAULTS
    stop: threading.Event = field(default_factory=threading.Event)
    call_ran: bool = True
    lease_seconds: float | None = None
    worker_id: str = field(default_factory=lambda: f"check-{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        self.client = Client(self.runtime, worker_id=self.worker_id, logger=LOG)

    def drive(self) -> bool:
        """Work the run until it ends; True if a fault ended this life first."""
        try:
            return self._drive(self.run_id)
        except InjectedFault:
            return True

    def _drive(self, run_id: str) -> bool:
        for _ in range(MAX_ROUNDS):
            self.runtime.work(
                run_id,
                worker_id=self.worker_id,
                logger=LOG,
                faults=self.faults,
                stop=self.stop,
                lease_seconds=self.lease_seconds,
            )
            if self.stop.is_set():
                return True
            run = self.client.get(run_id)
            if run.status is not RunStatus.WAITING:
                return False
            if self._answer(run):
                return True
        raise ScriptRanOut(f"run {run_id!r} waited {MAX_ROUNDS} times; it does not end")

    def _answer(self, run: Run) -> bool:
        wait = run.wait
        assert wait is not None
        if wait.kind == "children":
            for child in wait.children or []:
                if self.client.get(child).status is RunStatus.WAITING and self._drive(child):
                    return True
            return False
        if wait.kind == "timer":
            self._note(run, "timer", None)
            if wait.until is not None:
                self.clock.advance_to(wait.until)
                self.clock.advance(1)
            return False
        if wait.kind == "event":
            assert wait.name is not None
            sends, payload = self.script.event(wait.name, self._earlier_events(run, wait.name))
            self._note(run, "event" if sends else "event-timeout", wait.name)
            if sends:
                # The id is the wait's own: a life that died after sending it sends the same
                # event again, and the mailbox takes it once.
                self.client.send_event(
                    run.run_id, wait.name, payload, event_id=f"check-{wait.name}-{wait.step}"
                )
            elif wait.until is not None:
                self.clock.advance_to(wait.until)
                self.clock.advance(1)
            else:
                raise ScriptRanOut(
                    f"run {run.run_id!r} waits at step {wait.step} for the event "
                    f"{wait.name!r}, and the script sends none (give its payloads in the "
                    "script's events)"
                )
            return False
        self._decide(run)
        return False

    def _decide(self, run: Run) -> None:
        wait = run.wait
        assert wait is not None
        by = self.script.by
        # As a worker's park does (`ratchet worker` prints its link): the decision then goes
        # through the request, past the desk's own fault point (`after_wait_settled`).
        self.runtime.approval_desk(worker_id=self.worker_id, logger=LOG).open(
            run.run_id, timeout_seconds=self.runtime.settings.approval_timeout_seconds
        )
        if wait.answer_schema == CALL_RAN_SCHEMA:
            self._note(run, "call", None)
            self.client.approve(run.run_id, by=by, answer={"ran": self.call_ran})
            return
        self._note(run, "person", None)
        rule = self.script.approval_for(wait.prompt)
        if rule.approve:
            self.client.approve(run.run_id, by=by, comment=rule.comment, answer=rule.answer)
        else:
            self.client.reject(run.run_id, by=by, comment=rule.comment)

    def _note(self, run: Run, kind: str, name: str | None) -> None:
        assert run.wait is not None
        line = {"run_id": run.run_id, "step": run.wait.step, "kind": kind, "name": name}
        with (self.root / WAITS_FILE).open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    def _earlier_events(self, run: Run, name: str) -> int:
        assert run.wait is not None
        step = run.wait.step
        return len(
            {
                wait["step"]
                for wait in waits_answered(self.root)
                if wait["run_id"] == run.run_id
                and wait["kind"] == "event"
                and wait["name"] == name
                and wait["step"] < step
            }
        )


def waits_answered(root: Path) -> list[dict[str, Any]]:
    """The waits the lives of a run in `root` answered, in order (`WAITS_FILE`)."""
    path = root / WAITS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
