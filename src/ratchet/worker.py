"""`ratchet worker`: claim runnable runs, advance them step by step, survive anything.

A worker holds an expiring lease on the run it works on. A heartbeat thread renews it every
third of its length for as long as the worker holds the run, through model calls and tools
however slow, so a live worker keeps its run and a dead one (SIGKILL, a lost machine) lets it
lapse: any other worker then resumes the run from its last checkpoint. Waiting, done and failed
runs are never claimed: a parked run costs nothing.

A step's agent code that overran its deadline cannot be stopped (Python cannot end a thread):
the engine abandons it, and fences it off in this process (the next attempt waits for it; the
run is not failed while it runs). A worker whose run's strikes run out while such a call still
runs stops (`AbandonedCallRunning`) without releasing that run's lease: the end of the process
ends the call, the lease lapses, and the next worker fails the run.

After a failed attempt the engine records in the run's head when the next attempt may start
(`not_before`, an exponential backoff with jitter). The worker waits until then, holding its
lease, so no other worker retries the run early; a worker that claims a run whose `not_before`
is still ahead (its last worker died while backing off) waits out the rest the same way.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from ratchet.engine import Engine, Outcome, StepOutcome
from ratchet.errors import (
    AbandonedCallRunning,
    AgentUnloadable,
    InvalidInput,
    RatchetError,
    RunNotFound,
    StaleVersion,
    StepAttemptFailed,
    StoreBusy,
    StoreUnreachable,
    is_transient,
)
from ratchet.ports import ConcurrencyBound, Leases, check_lease_seconds
from ratchet.state import RunState, utcnow

DEFAULT_LEASE_SECONDS = 30.0
POLL_SECONDS = 0.1
FALLBACK_POLL_SECONDS = 2.0
"""How long a worker told of new work by its store (`WakeUps`) waits for word before it looks
anyway: the bound on how late it finds work whose notification it missed."""
RETRY_PAUSE_SECONDS = 0.05
"""The pause before retrying a step that crashed without a recorded failure (the engine's
backoff, `not_before`, covers the failures it recorded)."""
BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 10.0
"""Transient failures the engine could not record (a busy or briefly failing store) are retried
after 0.5 s, 1 s, 2 s, ... up to this: the engine's strikes still bound how often one step is
tried."""
RECONNECT_MAX_SECONDS = 5.0
"""The longest pause between a worker's tries of a store it cannot reach (0.5 s, 1 s, 2 s, ...
up to this): a database back from a restart is found within about this long."""
MAX_WORKER_ID_CHARS = 200
EXPIRY_CHECK_SECONDS = 5.0
"""How often, by the worker's clock, it looks for approval requests past their deadline."""
SCHEDULE_CHECK_SECONDS = 1.0
"""How often, by the worker's clock, it looks for schedules due to fire."""


def check_worker_id(worker_id: str) -> str:
    """`worker_id` if it is printable text of a sane length; `InvalidInput` otherwise."""
    try:
        worker_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("worker id is not valid UTF-8 text") from None
    if not 0 < len(worker_id) <= MAX_WORKER_ID_CHARS or not worker_id.isprintable():
        raise InvalidInput(
            f"worker id must be 1 to {MAX_WORKER_ID_CHARS} printable characters, not {worker_id!r}"
        )
    return worker_id


@dataclass(frozen=True)
class StepReport:
    """What `Worker.on_step` gets after each step this worker committed (or a run's end)."""

    outcome: StepOutcome
    state: RunState
    """The run's head right after the commit."""
    ms: float
    """How long the step took in this worker, the commit included."""


class StoreOutage:
    """Says that the store went out of reach once, when the first try fails, and that it
    answers again once, when a try next succeeds, however many tries (the worker's, its
    heartbeat's) fail between: an outage is two lines, not a line per try, nor a traceback.
    Shared by the worker's threads."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._lock = threading.Lock()
        self._since: float | None = None
        self._tries = 0

    def lost(self, error: StoreUnreachable) -> None:
        with self._lock:
            first, self._since = self._since is None, self._since or time.monotonic()
        if first:
            self._say(f"the store is unreachable ({error}); retrying")

    def next_pause(self) -> float:
        """How long the worker waits before its next try: 0.5 s after the first, doubling,
        at most `RECONNECT_MAX_SECONDS`."""
        with self._lock:
            self._tries += 1
            tries = self._tries
        return min(_backoff(tries), RECONNECT_MAX_SECONDS)

    def answered(self) -> None:
        with self._lock:
            since, self._since, self._tries = self._since, None, 0
        if since is not None:
            self._say(f"the store is reachable again after {time.monotonic() - since:.1f} s")


@dataclass
class _Hold:
    run_id: str
    lost: threading.Event = field(default_factory=threading.Event)


class Heartbeat:
    """Renews a worker's registration, and its lease on the run it holds, from a thread with
    its own store connection, so no step is too slow for the lease. It never stops a step: it
    raises flags (`displaced`, a hold's `lost`) that the worker acts on between steps."""

    def __init__(
        self,
        leases: Leases,
        *,
        worker_id: str,
        token: str,
        lease_seconds: float,
        interval: float,
        logger: Any,
        outage: StoreOutage | None = None,
    ) -> None:
        self._leases = leases
        self._outage = outage
        self._worker_id = worker_id
        self._token = token
        self._lease_seconds = lease_seconds
        self._interval = interval
        self._log = logger
        self._hold: _Hold | None = None
        self._stopped = threading.Event()
        self.displaced = threading.Event()
        self._thread = threading.Thread(
            target=self._beat_until_stopped, name=f"heartbeat {worker_id}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        self._thread.join()

    def hold(self, run_id: str) -> _Hold:
        """Keep the lease on `run_id` from now on; the hold's `lost` is set if it goes."""
        self._hold = _Hold(run_id)
        return self._hold

    def let_go(self) -> None:
        self._hold = None

    def _beat_until_stopped(self) -> None:
        leases: Leases | None = None
        try:
            while not self._stopped.wait(self._interval):
                try:
                    leases = leases or self._leases.on_own_connection()
                    self._beat(leases)
                except StoreUnreachable as unreachable:
                    # Said once for the whole worker; the lease may lapse meanwhile (above).
                    if self._outage is not None:
                        self._outage.lost(unreachable)
                except RatchetError as error:
                    # A busy or vanished store: the lease may lapse, and then the run is
                    # another worker's; the version check keeps our late commit out.
                    self._log.warning(
                        "heartbeat missed",
                        extra={"worker_id": self._worker_id, "error": str(error)},
                    )
        finally:
            if leases is not None:
                leases.close()

    def _beat(self, leases: Leases) -> None:
        hold = self._hold  # one read: the worker may let go of it meanwhile
        beat = leases.beat(
            self._worker_id, self._token, self._lease_seconds, hold.run_id if hold else None
        )
        if self._outage is not None:
            self._outage.answered()
        if not beat.registered and not self.displaced.is_set():
            self._log.error(
                "worker id taken over by another live worker; stopping after this step",
                extra={"worker_id": self._worker_id},
            )
            self.displaced.set()
        # A worker that let go meanwhile released the lease itself: that is no loss.
        let_go = self._hold is not hold
        if hold is not None and not beat.holds_lease and not let_go and not hold.lost.is_set():
            self._log.warning(
                "lease lost", extra={"run_id": hold.run_id, "worker_id": self._worker_id}
            )
            hold.lost.set()


class WakeUps(Protocol):
    """A store's word that there may be work (a new run, an event, a decision, a due timer),
    for a worker with none, instead of asking the store every `POLL_SECONDS`."""

    def wait(self, seconds: float) -> bool:
        """Return when told of work (True), or after about `seconds` (False)."""
        ...

    def close(self) -> None: ...


@dataclass
class Worker:
    engine: Engine
    leases: Leases
    logger: Any
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    poll_seconds: float = POLL_SECONDS
    stop: threading.Event = field(default_factory=threading.Event)
    sleep: Callable[[float], None] | None = None
    """How the worker pauses before a retry; by default a wait that `stop` cuts short."""
    clock: Callable[[], datetime] = utcnow
    """What the worker compares a run's `not_before` with."""
    on_park: Callable[[str], None] | None = None
    """Called with the run id when a step of this worker parks a run for a person."""
    on_step: Callable[[StepReport], None] | None = None
    """Called after each step this worker committed, and when a run it works ends."""
    on_wait: Callable[[str], None] | None = None
    """Called with a sentence when the worker starts waiting for another worker's lease, when
    an attempt fails, and when it leaves a run whose agent it cannot load."""
    heartbeat_seconds: float | None = None
    """How often the lease is renewed; by default a third of `lease_seconds`."""
    expire_approvals: Callable[[datetime], Sequence[str]] | None = None
    """Called with the time (by `clock`) every `EXPIRY_CHECK_SECONDS` between claims: records
    the expiry of requests nobody answered in time, and returns the runs that go on."""
    deliver_decisions: Callable[[datetime], Sequence[str]] | None = None
    """Called with the time (by `clock`) with `expire_approvals`: records the decisions their
    deciders left undelivered (they died after settling the request), and returns the runs
    that go on (`ratchet.runtime.local_approvals.deliver_undelivered`)."""
    settle_waits: Callable[[datetime], Sequence[str]] | None = None
    """Called with the time (by `clock`) before every claim: settles the waits due by then
    (a timer's time, an event wait's timeout) and those whose event is in the mailbox, and
    returns the runs that go on (runnable now, so the claim that follows may take them)."""
    fire_schedules: Callable[[datetime], Sequence[str]] | None = None
    """Called with the time (by `clock`) every `SCHEDULE_CHECK_SECONDS` between claims: starts
    the runs of the schedules due by then and returns their ids (`ratchet.schedules`)."""
    limits: Callable[[str], ConcurrencyBound | None] | None = None
    """The bound on concurrent runs of an agent, by a run's stored reference (None: no bound):
    such runs are claimed only while their agent (by its name, whatever reference its runs
    store) has a free slot, and let go after each step, so the runs waiting their turn take it
    in order (`ratchet.limits`)."""
    wake_ups: WakeUps | None = None
    """Where an idle worker waits for word of new work, looking anyway every
    `fallback_poll_seconds` (None: it looks every `poll_seconds`)."""
    fallback_poll_seconds: float = FALLBACK_POLL_SECONDS
    unreadable: set[str] = field(default_factory=set, init=False)
    """Runs this worker found it cannot read; it leaves them alone from then on."""
    unloadable: dict[str, AgentUnloadable] = field(default_factory=dict, init=False)
    """Runs whose agent this worker cannot load, and why; it leaves them to other workers."""
    _failures: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _waited_for: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)
    _beat_every: float = field(default=0.0, init=False, repr=False)
    _expiry_checked: datetime | None = field(default=None, init=False, repr=False)
    _schedules_checked: datetime | None = field(default=None, init=False, repr=False)
    _outage: StoreOutage = field(init=False, repr=False)
    _owed: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    """Runs whose attempt an outage cut short, by the version that counted it: given back
    before the run's next step (`Engine.give_back_attempt`)."""

    def __post_init__(self) -> None:
        check_worker_id(self.worker_id)
        check_lease_seconds(self.lease_seconds)
        beat_every = (
            self.lease_seconds / 3 if self.heartbeat_seconds is None else self.heartbeat_seconds
        )
        # Two beats at least per lease: one missed beat (a busy store) must not lose the run.
        if not (math.isfinite(beat_every) and 0 < beat_every <= self.lease_seconds / 2):
            raise InvalidInput(
                "heartbeat seconds must be above 0 and at most half the lease "
                f"({self.lease_seconds:g} s), not {self.heartbeat_seconds!r}"
            )
        self._beat_every = beat_every
        self._outage = StoreOutage(self._say_outage)
        if not (math.isfinite(self.poll_seconds) and 0 <= self.poll_seconds <= 60):
            raise InvalidInput(f"poll seconds must be from 0 to 60, not {self.poll_seconds!r}")

    @property
    def worker_id(self) -> str:
        return self.engine.worker_id

    @property
    def _skipped(self) -> set[str]:
        return self.unreadable | self.unloadable.keys()

    def run(self, *, until_idle: bool = False, run_id: str | None = None) -> None:
        """Work until stopped; with `until_idle`, until no run (or `run_id`) is running.

        Raises `WorkerIdInUse` before claiming anything if a live worker has this id."""
        token = uuid.uuid4().hex
        self.leases.register_worker(self.worker_id, token, self.lease_seconds)
        self.logger.info("worker started", extra={"worker_id": self.worker_id})
        try:
            with Heartbeat(
                self.leases,
                worker_id=self.worker_id,
                token=token,
                lease_seconds=self.lease_seconds,
                interval=self._beat_every,
                logger=self.logger,
                outage=self._outage,
            ) as heartbeat:
                self._claim_and_work(heartbeat, until_idle=until_idle, run_id=run_id)
        finally:
            if self.wake_ups is not None:
                self.wake_ups.close()
            self.leases.unregister_worker(self.worker_id, token)

    def _claim_and_work(
        self, heartbeat: Heartbeat, *, until_idle: bool, run_id: str | None
    ) -> None:
        busy = 0
        said_idle = False
        while not self.stop.is_set() and not heartbeat.displaced.is_set():
            self._expire_overdue_approvals()
            self._fire_schedules()
            self._settle_waits()
            try:
                claimed = self.leases.claim(
                    self.worker_id,
                    self.lease_seconds,
                    run_id=run_id,
                    skip=self._skipped,
                    limit_of=self.limits,
                )
                idle = claimed is None and not self.leases.running_runs(run_id, skip=self._skipped)
            except StoreUnreachable as unreachable:
                self._outage.lost(unreachable)
                self._pause(self._outage.next_pause())
                continue
            except StoreBusy as error:  # another process holds the write lock for long
                busy += 1
                self.logger.warning(
                    "store busy", extra={"worker_id": self.worker_id, "error": str(error)}
                )
                self._pause(_backoff(busy))
                continue
            busy = 0
            self._outage.answered()
            if claimed is None:
                if until_idle and (idle or (run_id is None and self._left_to_live_workers())):
                    return
                if not idle:
                    self._say_whose_lease(run_id)
                elif not said_idle and self.on_wait is not None:
                    # Once per stretch of idleness: a worker with nothing to do is not silent.
                    self.on_wait("no run to work; waiting for one (Ctrl-C or SIGTERM stops)")
                said_idle = True
                self._wait_for_work()
                continue
            said_idle = False
            self._work_on(claimed, heartbeat)

    def _expire_overdue_approvals(self) -> None:
        if self.expire_approvals is None and self.deliver_decisions is None:
            return
        now = self.clock()
        last = self._expiry_checked
        if last is not None and (now - last).total_seconds() < EXPIRY_CHECK_SECONDS:
            return
        self._expiry_checked = now
        checks = (
            (self.deliver_decisions, "a decision left undelivered is recorded; the run goes on"),
            (self.expire_approvals, "approval expired; the run goes on without a decision"),
        )
        for check, said in checks:
            if check is None:
                continue
            try:
                resumed = check(now)
            except StoreUnreachable as unreachable:
                self._outage.lost(unreachable)  # the next check tries again
                continue
            except RatchetError as error:
                # A busy store, or a run moved on meanwhile: the next check tries again.
                self.logger.warning(
                    "approvals not checked",
                    extra={"worker_id": self.worker_id, "error": str(error)},
                )
                continue
            for run_id in resumed:
                self.logger.info(said, extra={"run_id": run_id, "worker_id": self.worker_id})

    def _fire_schedules(self) -> None:
        if self.fire_schedules is None:
            return
        now = self.clock()
        last = self._schedules_checked
        if last is not None and (now - last).total_seconds() < SCHEDULE_CHECK_SECONDS:
            return
        self._schedules_checked = now
        try:
            self.fire_schedules(now)
        except StoreUnreachable as unreachable:
            self._outage.lost(unreachable)  # the next check fires the same times
        except RatchetError as error:
            # A busy store: the next check fires the same times, under the same run ids.
            self.logger.warning(
                "schedules not checked",
                extra={"worker_id": self.worker_id, "error": str(error)},
            )

    def _settle_waits(self) -> None:
        if self.settle_waits is None:
            return
        try:
            resumed = self.settle_waits(self.clock())
        except StoreUnreachable as unreachable:
            self._outage.lost(unreachable)  # the next pass tries again
            return
        except RatchetError as error:
            # A busy store: the next pass tries again, and nothing was half done (each wait
            # settles in one commit).
            self.logger.warning(
                "waits not checked", extra={"worker_id": self.worker_id, "error": str(error)}
            )
            return
        for run_id in resumed:
            self.logger.info(
                "wait settled; the run goes on",
                extra={"run_id": run_id, "worker_id": self.worker_id},
            )

    def _left_to_live_workers(self) -> bool:
        """Whether every run still running is held by another worker that is alive (a process
        on this host, by its default id `host:pid`): then a worker that stops when idle has
        nothing it could work, and ends, saying what it left. A holder it cannot see alive
        (another host, an id of its own, a process gone) may be dead: its lease lapses, and
        this worker waits to take the run over."""
        try:
            held = self.leases.held_by_others(self.worker_id, skip=self._skipped)
            running = self.leases.running_runs(skip=self._skipped)
        except RatchetError:
            return False
        if not held or len(held) != running or not all(_alive_here(h) for _, h, _ in held):
            return False
        for held_run, holder, _ in held:
            said = f"left {held_run} to worker {holder}, which is working it"
            self.logger.info(
                said, extra={"run_id": held_run, "worker_id": self.worker_id, "holder": holder}
            )
            if self.on_wait is not None:
                self.on_wait(said)
        return True

    def _say_whose_lease(self, run_id: str | None) -> None:
        """Once per run and holder: which live worker's lease this worker waits out, and
        until when (a dead worker's lease lapses on its own; until then nothing shows)."""
        try:
            held = self.leases.held_by_others(self.worker_id, run_id, skip=self._skipped)
        except RatchetError:
            return
        for held_run, holder, expires_at in held:
            if (held_run, holder) in self._waited_for:
                continue
            self._waited_for.add((held_run, holder))
            until = datetime.fromtimestamp(expires_at, UTC).astimezone()
            message = (
                f"waiting for worker {holder}'s lease on {held_run} until "
                f"{until:%H:%M:%S} (it is renewed while that worker lives)"
            )
            self.logger.info(
                message,
                extra={
                    "run_id": held_run,
                    "worker_id": self.worker_id,
                    "holder": holder,
                    "lease_expires_at": until.isoformat(),
                },
            )
            if self.on_wait is not None:
                self.on_wait(message)

    def _work_on(self, run_id: str, heartbeat: Heartbeat) -> None:
        self.logger.info("run claimed", extra={"run_id": run_id, "worker_id": self.worker_id})
        hold = heartbeat.hold(run_id)
        try:
            head = self._head(run_id)
            self._wait_until(run_id, head.not_before if head is not None else None)
            # A run of a bounded agent holds one of its slots: it takes one step, then lets
            # go, so that the runs waiting for a slot take their turns in order.
            bounded = (
                head is not None
                and self.limits is not None
                and (self.limits(head.agent) is not None)
            )
            while not self.stop.is_set() and not heartbeat.displaced.is_set():
                if hold.lost.is_set():
                    # Another worker holds the run now. Whatever this worker committed was
                    # version-checked; from here on the run is theirs.
                    self.logger.warning(
                        "run given up: lease lost",
                        extra={"run_id": run_id, "worker_id": self.worker_id},
                    )
                    return
                if not self._step(run_id) or bounded:
                    return
        finally:
            heartbeat.let_go()
            self._failures.pop(run_id, None)
            # An attempt owed back and not given back by now stays counted: the run may be
            # another worker's already.
            self._owed.pop(run_id, None)
            # A call of the run that this process abandoned at a deadline may still act: the
            # lease stays, so no other worker takes the run until it lapses after this
            # process ends (which ends the call).
            if not self.engine.abandoned_call_running(run_id):
                self._release(run_id)

    def _release(self, run_id: str) -> None:
        try:
            self.leases.release(run_id, self.worker_id)
        except StoreUnreachable as unreachable:
            # The lease lapses by itself; another worker may take the run then.
            self._outage.lost(unreachable)

    def _step(self, run_id: str) -> bool:
        """One step; True if the worker should go on with this run."""
        started = time.perf_counter()
        try:
            self._give_back_owed_attempt(run_id)
            outcome = self.engine.advance(run_id)
        except StoreUnreachable as unreachable:
            # The database went away: not the step's failure. The attempt it cut short is
            # given back once the store answers; until then, tries at a bounded pace.
            self._outage.lost(unreachable)
            if unreachable.attempt_version is not None:
                self._owed[run_id] = unreachable.attempt_version
            self._pause(self._outage.next_pause())
            return True
        except StaleVersion as stale:
            # Another worker advanced the run under us (our lease had lapsed): it owns the run
            # now and our write changed nothing. Let go.
            self.logger.warning(
                "stale write rejected",
                extra={"run_id": run_id, "worker_id": self.worker_id, "error": str(stale)},
            )
            return False
        except AbandonedCallRunning as running:
            # Only the end of the process ends that call, and the run must not be failed
            # while it may still act: stop here, holding the run (see `_work_on`).
            self.logger.error(
                "worker stops: a call it abandoned still runs",
                extra={"run_id": run_id, "worker_id": self.worker_id, "error": str(running)},
            )
            raise
        except AgentUnloadable as unloadable:
            # Nothing was counted (the engine gave the attempt back): the run waits, as it
            # was, for a worker that can load its agent. This one says so once and goes on.
            self.unloadable[run_id] = unloadable
            self.logger.error(
                "run left: its agent cannot be loaded here",
                extra={"run_id": run_id, "worker_id": self.worker_id, "error": str(unloadable)},
            )
            if self.on_wait is not None:
                self.on_wait(str(unloadable))
            return False
        except StepAttemptFailed as failure:
            # Counted by the engine, and recorded with the time the next attempt may start
            # (unless the store refused that write too); the next attempt, or the last strike,
            # is the next advance.
            self._say_attempt_failed(run_id, failure)
            if failure.not_before is not None:
                self._wait_until(run_id, failure.not_before)
            else:
                self._pause_before_retry(run_id, failure)
            return True
        except Exception as error:
            unreadable = self._unreadable_error(run_id)
            if unreadable is not None:
                self._skip(run_id, unreadable)
                return False
            # An unexpected crash in a step (a bug, a lost disk, an injected fault) counts like
            # a killed process: the attempt is already on record, the next advance retries.
            self.logger.exception(
                "step crashed", extra={"run_id": run_id, "worker_id": self.worker_id}
            )
            self._pause_before_retry(run_id, error)
            return True
        self._failures.pop(run_id, None)
        self._outage.answered()
        if outcome.bytes_written and self.on_step is not None:
            self._report(outcome, (time.perf_counter() - started) * 1000)
        if outcome.outcome is Outcome.WAITING and outcome.bytes_written and self.on_park:
            try:
                self.on_park(run_id)
            except Exception:
                # The run is parked and durable; `ratchet link RUN` can ask again later.
                self.logger.exception(
                    "could not open the approval request",
                    extra={"run_id": run_id, "worker_id": self.worker_id},
                )
        if outcome.outcome is Outcome.QUEUED:
            # The deployment's model calls this minute are used up, or the step's at-most-once
            # call may still be running in a worker frozen in it: nothing was done and no
            # attempt used. Wait until then, holding the run (a pause, not a busy loop).
            seconds = outcome.retry_after or self.poll_seconds
            if outcome.why is None:  # else the engine said why
                self.logger.info(
                    "model call rate limit reached; waiting",
                    extra={"run_id": run_id, "worker_id": self.worker_id, "seconds": seconds},
                )
            self._pause(seconds)
            return True
        if outcome.outcome is not Outcome.CONTINUE:
            self.logger.info(
                "run left",
                extra={
                    "run_id": run_id,
                    "worker_id": self.worker_id,
                    "outcome": outcome.outcome.value,
                    "step": outcome.step,
                },
            )
            return False
        return True

    def _give_back_owed_attempt(self, run_id: str) -> None:
        version = self._owed.get(run_id)
        if version is None:
            return
        try:
            self.engine.give_back_attempt(run_id, version)
        except StaleVersion:
            # The run moved on meanwhile (another worker took it, or the commit landed after
            # all and only its answer was lost): nothing is owed.
            del self._owed[run_id]
            return
        del self._owed[run_id]
        self.logger.info(
            "attempt cut short by the store's outage given back",
            extra={"run_id": run_id, "worker_id": self.worker_id},
        )

    def _say_outage(self, said: str) -> None:
        if self.on_wait is not None:
            self.on_wait(said)
        else:
            self.logger.warning(said, extra={"worker_id": self.worker_id})

    def _say_attempt_failed(self, run_id: str, failure: StepAttemptFailed) -> None:
        """`attempt 1 of step 3 failed: ...; next in 5 s`, as it happens: a retry's backoff
        is never a blank screen."""
        if self.on_wait is None or failure.step is None:
            return
        said = f"{run_id}: attempt {failure.attempt} of step {failure.step} failed: {failure}"
        if failure.not_before is not None:
            seconds = max(0.0, (failure.not_before - self.clock()).total_seconds())
            said += f"; next in {seconds:.0f} s"
        try:
            self.on_wait(said)
        except Exception:
            # Progress output is a courtesy: the failure is on record whatever happens to it.
            self.logger.exception(
                "could not report progress", extra={"run_id": run_id, "worker_id": self.worker_id}
            )

    def _report(self, outcome: StepOutcome, ms: float) -> None:
        assert self.on_step is not None
        try:
            # The head carries the step's tool, arguments and result preview: the one the
            # engine committed, else one read.
            state = outcome.head or self.engine.load(outcome.run_id)
            self.on_step(StepReport(outcome=outcome, state=state, ms=ms))
        except Exception:
            # Progress output is a courtesy: the step is committed whatever happens to it.
            self.logger.exception(
                "could not report progress",
                extra={"run_id": outcome.run_id, "worker_id": self.worker_id},
            )

    def _unreadable_error(self, run_id: str) -> Exception | None:
        """The error reading the run's head, if that is what stops its steps: a state from a
        newer Ratchet (`UnsupportedSchema`), a damaged row or store (`StoreUnavailable`, or a
        parse error). None if it reads, or if reading failed only for now."""
        try:
            self.engine.load(run_id)
        except RunNotFound:
            return None
        except (RatchetError, ValueError) as error:
            # A busy store is not a property of the run's row: that step is retried.
            return None if is_transient(error) else error
        return None

    def _skip(self, run_id: str, error: Exception) -> None:
        # Remembered by this process only. Nothing is written: a newer Ratchet may well read
        # the run, and a repaired row is picked up again when the worker restarts. Not
        # retrying it keeps it from starving the other runs and lets --until-idle end.
        self.unreadable.add(run_id)
        self.logger.error(
            "run skipped: its state cannot be read",
            extra={
                "run_id": run_id,
                "worker_id": self.worker_id,
                "error": f"{type(error).__name__}: {error}",
            },
        )

    def _head(self, run_id: str) -> RunState | None:
        """The run's head; None if it cannot be read now (the step that follows finds out why
        and deals with it)."""
        try:
            return self.engine.load(run_id)
        except (RatchetError, ValueError):
            return None

    def _wait_until(self, run_id: str, not_before: datetime | None) -> None:
        """Back off until `not_before`, still holding the lease (the heartbeat renews it); a
        stop cuts the wait short."""
        if not_before is None:
            return
        seconds = (not_before - self.clock()).total_seconds()
        if seconds <= 0:
            return
        self.logger.info(
            "backing off before the next attempt",
            extra={
                "run_id": run_id,
                "worker_id": self.worker_id,
                "seconds": round(seconds, 3),
                "not_before": not_before.isoformat(),
            },
        )
        self._pause(seconds)

    def _pause_before_retry(self, run_id: str, error: BaseException) -> None:
        if not is_transient(error):
            self._pause(min(self.poll_seconds, RETRY_PAUSE_SECONDS))
            return
        failures = self._failures.get(run_id, 0) + 1
        self._failures[run_id] = failures
        delay = _backoff(failures)
        self.logger.warning(
            "transient failure; backing off",
            extra={
                "run_id": run_id,
                "worker_id": self.worker_id,
                "seconds": delay,
                "error": str(error),
            },
        )
        self._pause(delay)

    def _wait_for_work(self) -> None:
        if self.wake_ups is None:
            self.stop.wait(self.poll_seconds)
        else:
            # Until word comes, a timer is due or the fallback poll's time is up: a stop asked
            # meanwhile is seen then, within `fallback_poll_seconds`.
            self.wake_ups.wait(self.fallback_poll_seconds)

    def _pause(self, seconds: float) -> None:
        if self.sleep is not None:
            self.sleep(seconds)
        else:
            self.stop.wait(seconds)


def _alive_here(worker_id: str) -> bool:
    """Whether `worker_id` is a default id (`host:pid`) of a process alive on this host."""
    host, _, pid = worker_id.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except PermissionError:  # alive, and another user's
        return True
    except OSError:
        return False
    return True


def _backoff(failures: int) -> float:
    """0.5 s after the first transient failure in a row, doubling, capped."""
    return float(min(BACKOFF_FIRST_SECONDS * 2 ** min(failures - 1, 16), BACKOFF_MAX_SECONDS))
