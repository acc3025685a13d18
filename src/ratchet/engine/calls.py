"""When a person may be asked whether an at-most-once call ran: not while it may still run.

A retried step that finds its call started with no outcome used to ask at once. But the worker
that started it may be frozen rather than dead (SIGSTOP, a paused VM, a long GC): its lease
lapsed, and when it thaws it goes on with the call. A person asked meanwhile sees nothing at
the bank and says it did not run; the call is made again, the thawed one lands too: two wires.
So the question waits until the first call cannot be running any more:

- its deadline has passed since it started (`CallStart.deadline`: the step's time limit, past
  which the engine that made it gave it up; on AWS the step function's timeout ends a sandbox
  that is still in it, so nothing of the call runs later);
- locally, no process on this host holds its lock (`CallLocks`): a frozen worker keeps it for
  as long as it is frozen, a dead one has let it go, a live one lets go when the call ends.

This process knows more of its own calls: one still running here (given up at its deadline,
on its thread still) may run; one that ended here (returned, raised, or never began, the
attempt failing between the recorded start and the tool) is over, and is asked about at once,
as a tool that raised and is retried by its own worker always was. On AWS a sandbox that gave
up a call at its deadline is ended (`running_calls`, `ratchet.handlers.step`), so that it does
not thaw for a later invocation with the call in it, past the deadline the ledger keeps.

While the call may run, the step is not taken (`CallUnderWay`, which the engine answers with
`Outcome.QUEUED`): nothing is written, no attempt used, and it is tried again when the deadline
has passed, or every `CALL_RECHECK_SECONDS` while a process here holds the call.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime

from ratchet.engine.deadline import STEP_MARGIN_SECONDS
from ratchet.errors import CallUnderWay
from ratchet.ports import CallLocks, CallStart, HeldCall, LedgerEntry, LedgerStatus
from ratchet.tools import MAX_STEP_TIMEOUT_SECONDS

CALL_RECHECK_SECONDS = 5.0
"""How often a step waiting for a call that a process on this host holds looks again."""

UNLIMITED_CALL_SECONDS = MAX_STEP_TIMEOUT_SECONDS + STEP_MARGIN_SECONDS
"""How long the call of an agent with no step time limit may run: the step function's
timeout, which ends the sandbox on AWS (locally its lock says more)."""

ENDED_REMEMBERED = 4096
"""How many calls that ended in this process it remembers (the most recent)."""


class StartedCall:
    """An at-most-once call this process started (its start recorded, its lock held). `end`
    once the call is over, from whichever thread knows it first; `let_go` when this process
    stops knowing (the attempt is torn down by a `BaseException`, standing for its end)."""

    def __init__(self, key: str, held: HeldCall | None) -> None:
        self.key = key
        self._held = held
        _CALLS.start(key)

    def end(self) -> None:
        _CALLS.end(self.key)
        self.let_go()

    def let_go(self) -> None:
        _CALLS.forget(self.key)
        if self._held is not None:
            self._held.release()


def call_start(at: datetime, limit: float | None, by: str) -> CallStart:
    """What the ledger keeps of a call starting now under a step time limit of `limit`."""
    return CallStart(at=at, seconds=UNLIMITED_CALL_SECONDS if limit is None else limit, by=by)


def under_way(entry: LedgerEntry, *, now: datetime, locks: CallLocks | None) -> CallUnderWay | None:
    """Why the person may not be asked yet whether the call `entry` records ran (it may still
    be running), or None: it is over, ask. `now` is by the engine's clock."""
    if entry.status is not LedgerStatus.CALLED:
        return None
    if _CALLS.running(entry.key):
        return CallUnderWay(
            entry.key,
            CALL_RECHECK_SECONDS,
            "held",
            f"the call under {entry.key} is still running in this process (given up at its "
            "deadline, it goes on on its own thread): a person is asked whether it ran once it "
            "ends",
        )
    if _CALLS.ended(entry.key):
        return None
    start = entry.call
    if start is not None and now < start.deadline:
        left = (start.deadline - now).total_seconds()
        return CallUnderWay(
            entry.key,
            left,
            "deadline",
            f"the call under {entry.key} that {start.by} started at {start.at.isoformat()} may "
            f"still be running until its deadline, {start.deadline.isoformat()}: a person is "
            "asked whether it ran no sooner",
        )
    # Past its deadline (or with none: a key an older Ratchet marked called), only a lock on
    # this host can still say that the call runs.
    if locks is not None and locks.held(entry.key):
        by = start.by if start is not None else "a worker"
        return CallUnderWay(
            entry.key,
            CALL_RECHECK_SECONDS,
            "held",
            f"the call under {entry.key} that {by} started is held by a process on this host "
            "(still in the call, or frozen in it): a person is asked whether it ran once it "
            "lets go",
        )
    return None


def held_elsewhere(key: str) -> CallUnderWay:
    """A call about to start finds the key's lock held: another call of it is under way here,
    or about to start (its worker frozen between taking the lock and recording the start)."""
    return CallUnderWay(
        key,
        CALL_RECHECK_SECONDS,
        "held",
        f"another call under {key} is held by a process on this host: it may be starting or "
        "running, so this step does not call, nor ask, until it lets go",
    )


def running_calls(run_id: str) -> bool:
    """Whether an at-most-once call of the run is still running in this process."""
    return _CALLS.running_of(run_id)


class _Calls:
    """The at-most-once calls of this process: those running, and the keys of those that
    ended here (the latest `limit`, the oldest first out)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._running: set[str] = set()
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, key: str) -> None:
        with self._lock:
            self._running.add(key)

    def end(self, key: str) -> None:
        with self._lock:
            self._running.discard(key)
            self._ended[key] = None
            self._ended.move_to_end(key)
            while len(self._ended) > self._limit:
                self._ended.popitem(last=False)

    def forget(self, key: str) -> None:
        with self._lock:
            self._running.discard(key)

    def running(self, key: str) -> bool:
        with self._lock:
            return key in self._running

    def running_of(self, run_id: str) -> bool:
        prefix = f"{run_id}/step-"  # `idempotency_key`'s form
        with self._lock:
            return any(key.startswith(prefix) for key in self._running)

    def ended(self, key: str) -> bool:
        with self._lock:
            return key in self._ended


_CALLS = _Calls(ENDED_REMEMBERED)
"""One for the process: whichever engine here takes the step's retry knows what runs and what
ended here."""
