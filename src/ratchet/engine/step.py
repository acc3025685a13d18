"""The step engine: advances a run by exactly one step, then commits it.

It knows nothing of processes, Lambda or Step Functions. Whoever drives it (a local worker, the
step Lambda) calls `advance(run_id)` and acts on the outcome. The order inside a step is what
makes a crash at any point cost at most that step and never repeat a side effect:

1. load the head; stop rules (not running, step cap, third strike);
2. count the attempt, durably, as the step begins and before any work (a crash before it, right
   after the step before committed, is no strike on this step);
3. with a budget, reserve the most the attempt's model calls can cost, in a commit of its own
   before any call (and, with an agent's daily budget, on the agent's counter before that), or
   park the run when that would not fit (`spending`);
   decide: reuse the decision recorded under the step's key, or call the model once and record
   it before acting;
4. act: run the one tool with the key `<run_id>/step-<n>`;
5. commit the step record and the new head in one write, conditional on the version read.

Whatever fails in 3-5 is recorded on the run with its cause (an `attempt_failed` checkpoint)
and raised as a `StepAttemptFailed`, except what cannot succeed on retry (`TERMINAL_ERRORS`),
which fails the run at once, and an `InjectedFault`, which stands for the process dying and so
is left unrecorded, as a real crash would be. The agent's own code (its hooks, the model call,
the tool) runs on a thread of its own under the agent's step time limit (what it raises there,
`SystemExit` and `KeyboardInterrupt` too, is the attempt's failure); a step over it is
abandoned, and since only the calling thread commits, whatever the abandoned code returns later
is never written. Python cannot stop the abandoned call, so this process fences it off: the
run's next attempt waits for it before running the agent's code again, and the run is not
failed while it runs (`AbandonedCallRunning`). Tool arguments, outputs and summaries over
`INLINE_BYTES` are kept by reference to the blob store, so no record grows with what the agent
passes around.

This file holds that order; beside it, `attempt` decides and acts (3-4), `commits` writes (2's
failed attempts, 5), `deadline` runs the agent's code under its time limit and keeps the fence,
and `decisions` checks and keeps what the model decided.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from ratchet import tracing
from ratchet.backoff import DEFAULT_BACKOFF, Backoff
from ratchet.engine import spending
from ratchet.engine.attempt import Attempted, Binding, StepWork
from ratchet.engine.commits import Commits
from ratchet.engine.deadline import (
    ABANDONED_GRACE_SECONDS,
    StepClock,
    abandoned_call_running,
)
from ratchet.engine.decisions import result_digest
from ratchet.engine.failures import (
    added,
    attempt_failure,
    cut,
    describe,
    paid_for,
)
from ratchet.engine.outcome import Outcome, StepOutcome
from ratchet.errors import (
    AgentSetupFailed,
    AgentUnloadable,
    CallUnderWay,
    ChildRunsRefused,
    InjectedFault,
    NotCancellable,
    NotRetryable,
    NotWaiting,
    RatchetError,
    RunNotFound,
    RunUnreadable,
    StaleVersion,
    StepAttemptFailed,
    StepTimedOut,
    StoreUnreachable,
    is_transient,
)
from ratchet.faults import NO_FAULTS, FaultPlan, FaultPoint
from ratchet.ports import (
    BlobStore,
    CallLocks,
    CheckpointStore,
    ChildRuns,
    ConcurrencyBound,
    Consumption,
    DailySpend,
    IdempotencyLedger,
    LedgerCompletion,
    RateLimit,
    Slots,
)
from ratchet.state import (
    MAX_ATTEMPTS,
    PREVIEW_CHARS,
    AnyWait,
    BudgetAsked,
    ChildrenWait,
    Created,
    Done,
    EventWait,
    Finished,
    PersonDecided,
    Reserved,
    Retried,
    RunState,
    RunStatus,
    StartRuns,
    StepCompleted,
    StoredCheckpoint,
    TimerWait,
    ToolOutput,
    Usage,
    WaitSettled,
    idempotency_key,
    parent_cancelled,
    stamped,
    utcnow,
)
from ratchet.tools import MAX_STEP_TIMEOUT_SECONDS

Binder = Callable[[RunState], Binding]
SLOT_MARGIN_SECONDS = 60.0
MODEL_REQUESTS = "model"
"""The name the deployment's model-call rate limit counts under (`requests_per_minute`)."""


class Engine:
    """Takes runs' steps (`advance`), and moves a run as a supervisor or a person asks (`fail`,
    `retry`, `cancel`, `decide_waiting`): every change is one conditional commit."""

    def __init__(
        self,
        *,
        store: CheckpointStore,
        ledger: IdempotencyLedger,
        blobs: BlobStore,
        bind: Binder,
        unbind: Callable[[str], None] | None = None,
        worker_id: str,
        logger: logging.Logger | Any,
        faults: FaultPlan = NO_FAULTS,
        sleep: Callable[[float], None] = time.sleep,
        backoff: Backoff = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
        clock: Callable[[], datetime] = utcnow,
        abandoned_grace_seconds: float = ABANDONED_GRACE_SECONDS,
        slots: Slots | None = None,
        limits: Callable[[str], ConcurrencyBound | None] | None = None,
        rate: RateLimit | None = None,
        requests_per_minute: int | None = None,
        children: ChildRuns | None = None,
        call_locks: CallLocks | None = None,
        daily_spend: DailySpend | None = None,
    ) -> None:
        """With `slots` and `limits` (the bound of a run's stored agent, None for none), a
        step of a bounded agent's run takes one of its agent's slots (by the agent's name,
        which every reference to it shares), and one of its key's if the agent bounds runs
        per key, before any work and gives them back once the step is over; finding none
        free, it is `Outcome.QUEUED` (on AWS; a local worker's claim bounds its runs instead,
        see `ratchet.limits`).

        With `rate` and `requests_per_minute`, every step (each may call the model) counts
        one request of the deployment's shared limit before its attempt is counted; over it,
        the step is `Outcome.QUEUED` with the seconds until the next minute.

        With `children` (`attach_children`), a tool may start child runs (`start_runs`):
        they are started before the step commits, and every head this engine moves is told
        to them, so a child's end settles its parent's wait. Without, such a step fails the
        run (`ChildRunsRefused`).

        With `call_locks` (the local runtime's), an at-most-once call holds its lock on this
        host while it runs, and a retried step that finds it started asks a person whether it
        ran only once no process here holds it; everywhere, only once its deadline has passed
        (`ratchet.engine.calls`). Until then the step is `Outcome.QUEUED`.

        With `daily_spend` (the store's or deployment's shared counter), a run of an agent
        with a daily budget (`Agent.max_cost_usd_per_day`) holds each attempt's bound on its
        agent's counter for the day before any call, and settles it after the step's commit;
        finding no room, the run waits for the next UTC day or a raise (`spending`)."""
        self._store = store
        self._daily = daily_spend
        self._children = children
        self._rate = rate
        self._requests_per_minute = requests_per_minute
        self._slots = slots
        self._limits = limits
        self._logger = logger
        self._clock = clock
        self._bind = bind
        self._unbind = unbind
        self._worker_id = worker_id
        self._faults = faults
        self._commits = Commits(
            store=store,
            worker_id=worker_id,
            logger=logger,
            backoff=backoff,
            rng=rng or random.Random(),
            clock=clock,
            abandoned_grace_seconds=abandoned_grace_seconds,
        )
        self._work = StepWork(
            ledger=ledger,
            blobs=blobs,
            faults=faults,
            sleep=sleep,
            logger=logger,
            worker_id=worker_id,
            clock=clock,
            call_locks=call_locks,
        )

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def faults(self) -> FaultPlan:
        """The faults this engine injects; the desks that settle with it inject them too."""
        return self._faults

    def attach_children(self, children: ChildRuns) -> None:
        """Let this engine's runs start child runs through `children` (which settles
        parents' waits with this engine, so it is built after it)."""
        self._children = children

    def _told(self, head: RunState | None) -> None:
        """Tell the children port of a head this engine moved or found ended (see
        `ChildRuns.after`): a run's end may settle its parent's wait."""
        if self._children is None or head is None:
            return
        if head.parent is None and not isinstance(
            head.waiting.request if head.waiting else None, ChildrenWait
        ):
            return
        try:
            self._children.after(head)
        except Exception:
            # Durable either way: the parent is settled by the next child's end, or a sweep.
            self._logger.warning(
                "parent or children not told of the run's move",
                extra={"run_id": head.run_id, "parent": head.parent},
                exc_info=True,
            )

    def abandoned_call_running(self, run_id: str) -> bool:
        """Whether a call of the run's agent that this process abandoned at a step deadline
        is still running (a worker keeps the run's lease until it ends, or the process does)."""
        return abandoned_call_running(run_id)

    # --- runs ------------------------------------------------------------------------------

    def start(self, state: RunState) -> bool:
        """Create the run at version 1. False (and nothing written) if the id is taken."""
        state = state.model_copy(update={"version": 1})
        checkpoint = StoredCheckpoint(
            run_id=state.run_id,
            version=1,
            # A fork starts at its source's step: its window's reads find the record there.
            step=state.step,
            status=state.status,
            worker_id=self._worker_id,
            event=Created(state=state),
        )
        return self._store.create_run(state, checkpoint)

    def load(self, run_id: str) -> RunState:
        """The run's head. Raises `RunNotFound`, `UnsupportedSchema` (a newer Ratchet wrote
        it) or `RunUnreadable` (it does not parse): the last two are never worth a retry."""
        try:
            state = self._store.load_head(run_id)
        except ValueError as error:  # a head that is not JSON, or not a RunState
            raise RunUnreadable(run_id, describe(error)) from error
        if state is None:
            raise RunNotFound(run_id)
        return state

    def give_back_attempt(self, run_id: str, version: int) -> None:
        """Uncount the attempt that a store outage cut short (`StoreUnreachable`'s
        `attempt_version`), if the run is still at that version: an outage is no strike.
        Raises `StaleVersion` if the run moved on meanwhile (another worker took it, or the
        step's commit landed after all and only its answer was lost): then nothing is owed."""
        self._store.release_attempt(run_id, version)

    def advance(self, run_id: str) -> StepOutcome:
        """Take exactly one step of the run (or apply a stop rule) and commit it.

        Raises `StaleVersion` if another worker moved the run meanwhile (nothing was written),
        and `StepAttemptFailed` (a subclass naming what failed, with `transient` set when a
        worker should back off) after recording a failed attempt that may be retried. A
        failure no retry can fix (`TERMINAL_ERRORS`) and the third failed attempt are not
        raised: the run is failed with the cause and the outcome returned. A head that cannot
        be read raises `UnsupportedSchema` or `RunUnreadable`; retrying those is pointless.

        A caller that goes straight on to the next step (a worker's loop, a step Lambda taking
        several) just calls again: each step counts its own attempt as it begins.
        """
        outcome = self._advance(run_id)
        if outcome.outcome is not Outcome.QUEUED and outcome.outcome is not Outcome.CONTINUE:
            # Found ended too: a step retried after its run's end told no one (a crash) tells
            # its parent now; telling twice changes nothing.
            self._told(outcome.head)
        return outcome

    def _advance(self, run_id: str) -> StepOutcome:
        state = self.load(run_id)
        if state.status is not RunStatus.RUNNING:
            return StepOutcome.of(state)
        cancelled_parent = self._cut_off_parent(state)
        if cancelled_parent is not None:
            # Created after its parent's cancel looked for its children (`ratchet.children`):
            # no one else will cancel it. It has done nothing yet, so nothing of it to undo.
            finished = _cancelled(self._worker_id, parent_cancelled(cancelled_parent))
            return self._commits.finish(state, finished)
        if state.step >= state.options.max_steps:
            summary = (
                f"Stopped at the step cap of {state.options.max_steps} steps before the goal "
                "was reported done."
            )
            return self._commits.finish(state, Finished(status=RunStatus.STOPPED, summary=summary))
        if state.budget is not None and state.budget.refused is not None:
            # A person would not raise the run's budget: it ends here, with their reason.
            refused = Finished(status=RunStatus.STOPPED, summary=cut(state.budget.refused))
            return self._commits.finish(state, refused)
        bound = self._limits(state.agent) if self._slots and self._limits else None
        names = self._slot_names(bound, state) if bound is not None else []
        if not names:
            return self._take_step(state)
        if not self._take_slots(names, state):
            return StepOutcome.queued(state)
        try:
            return self._take_step(state)
        finally:
            self._give_back_slots([name for name, _ in names], state)

    @staticmethod
    def _slot_names(bound: ConcurrencyBound, state: RunState) -> list[tuple[str, int]]:
        """The slots a step of the run takes, by name and limit: its key's first, so a run of
        a key at its bound waits for the key alone and holds back no run of another key."""
        names = []
        if bound.per_key is not None and state.concurrency_key is not None:
            names.append((bound.key_slots(state.concurrency_key), bound.per_key))
        if bound.limit is not None:
            names.append((bound.agent, bound.limit))
        return names

    def _take_slots(self, names: list[tuple[str, int]], state: RunState) -> bool:
        """Take each of the step's slots, in order; if one is not free, give back those taken
        (the run waits holding none) and say False."""
        assert self._slots is not None
        seconds = self._slot_seconds(state)
        taken: list[str] = []
        for name, limit in names:
            if not self._slots.take(name, limit, state.run_id, seconds, priority=state.priority):
                self._give_back_slots(taken, state)
                return False
            taken.append(name)
        return True

    def _take_step(self, state: RunState) -> StepOutcome:
        run_id, step = state.run_id, state.next_step
        if state.attempts:
            # A retry (an attempt of the step began and did not commit): its at-most-once
            # call may have started and may still run, in a worker frozen in it. Read before
            # anything is written, so such a worker, thawed, still commits the step it was
            # taking (its version stands).
            under_way = self._work.call_under_way(state)
            if under_way is not None:
                return self._wait_for_call(state, under_way)
        if self._rate is not None and self._requests_per_minute is not None:
            wait = self._rate.take(MODEL_REQUESTS, self._requests_per_minute)
            if wait > 0:
                return StepOutcome.queued(state, retry_after=wait)
        if state.attempts >= MAX_ATTEMPTS:
            last = state.error or "the worker died during the step"
            error = f"step {step} failed {state.attempts} times; last error: {last}"
            return self._commits.fail_run(state, Finished(status=RunStatus.FAILED, error=error))
        # The attempt is counted here, as the step begins, in a write of its own: a process
        # that dies in this step leaves it counted, so a step that keeps killing its process
        # fails at its third attempt. It is never counted sooner (in the commit of the step
        # before, which would save this write): a process that died between that commit and
        # this point would leave a strike on a step that never began.
        version = self._store.begin_attempt(run_id, state.version)
        state = state.model_copy(update={"version": version, "attempts": state.attempts + 1})
        with tracing.step_span(
            run_id, step, state.attempts, agent=state.agent, resumes=state.parked_span
        ) as span:
            outcome = self._attempt_and_commit(state, span)
            span.set({tracing.OUTCOME: outcome.outcome.value})
            if outcome.outcome is Outcome.FAILED:
                span.failed(outcome.head.error if outcome.head and outcome.head.error else "failed")
            elif outcome.outcome is Outcome.WAITING and outcome.head and outcome.head.waiting:
                span.set({tracing.WAITS_FOR: outcome.head.waiting.kind})
            return outcome

    def _attempt_and_commit(self, state: RunState, span: tracing.Span) -> StepOutcome:
        step = state.next_step
        started = time.perf_counter()
        try:
            reserved = self._reserve(state)
            if isinstance(reserved, StepOutcome):
                return reserved
            holds, (state, day_hold) = reserved[0] is not state, reserved
            attempted = self._attempt(state, span)
            if holds and attempted.usage is None:
                # Reserved, and no model called after all (a step made again with the call a
                # person said did not run): the reservation settles to nothing, not in full.
                attempted = replace(attempted, usage=Usage())
        except (StaleVersion, InjectedFault):
            raise
        except StoreUnreachable as unreachable:
            raise _owed_back(unreachable, state) from None
        except CallUnderWay as under_way:
            # Found as the attempt came to the call (a worker thawed and took it up between
            # the read before this attempt and now): the step is not taken after all, so its
            # attempt is given back, as a queued step uses none.
            version = self._store.release_attempt(state.run_id, state.version)
            given_back = state.model_copy(
                update={"version": version, "attempts": state.attempts - 1}
            )
            return self._wait_for_call(given_back, under_way)
        except AgentUnloadable:
            # This process cannot import the run's agent (started in another folder, say):
            # nothing of the step began, so its attempt is given back and the run is left for
            # a process that can load it, with no strike against it.
            self._store.release_attempt(state.run_id, state.version)
            raise
        except Exception as error:
            return self._record_failure(state, attempt_failure(error, f"step {step} failed"))
        self._faults.hit(FaultPoint.BEFORE_COMMIT, step)
        try:
            head, written = self._commit_step(state, attempted, started=started, span=span)
        except (StaleVersion, InjectedFault):
            raise
        except StoreUnreachable as unreachable:
            raise _owed_back(unreachable, state) from None
        except Exception as error:
            failure = attempt_failure(error, f"step {step} could not be committed")
            return self._record_failure(state, paid_for(failure, attempted.usage))
        if day_hold is not None and attempted.usage is not None:
            self._settle_day(state, day_hold, attempted.usage)
        self._faults.hit(FaultPoint.AFTER_COMMIT, step)
        return StepOutcome.of(head, bytes_written=written, step_limit=attempted.step_limit)

    def _reserve(self, state: RunState) -> tuple[RunState, spending.DayHold | None] | StepOutcome:
        """With a budget: hold the most this attempt's model calls can cost against what is
        left, in a commit of its own before any call (`ratchet.engine.spending`), and return
        the head it wrote; or, when that would not fit, park the run for a person to raise
        the budget and return that outcome. With an agent's daily budget, the same bound is
        held on the agent's counter for the day first (returned beside the head, for the
        settling), or the run waits for the next day. Without either (or with no call to
        make), `state` and no hold."""
        budget = state.budget
        if budget is None and self._daily is None:
            return state, None
        binding = self._bound(state, time.monotonic() + MAX_STEP_TIMEOUT_SECONDS)
        per_day = binding.agent.max_cost_usd_per_day if self._daily is not None else None
        if budget is None and per_day is None:
            return state, None
        cost = spending.attempt_bound(
            state,
            binding.agent,
            spending.price_of(state.options.model),
            decides=self._work.decides(state),
        )
        if cost.tokens == 0:
            return state, None  # no call to make: the decision is recorded, no summary is due
        if budget is not None and not spending.fits(budget, cost):
            asked = BudgetAsked(
                step=state.next_step, request=spending.ask_to_raise(state, budget, cost)
            )
            head, written = self._commits.commit(state, asked, step=state.step)
            return StepOutcome.of(head, bytes_written=written)
        day_hold = None
        if per_day is not None:
            held = self._hold_day(state, binding.agent.name, per_day, cost)
            if isinstance(held, StepOutcome):
                return held
            day_hold = held
        event = Reserved(
            step=state.next_step,
            attempt=state.attempts,
            usd=cost.usd or 0.0,
            tokens=cost.tokens,
            day=day_hold.day if day_hold else None,
            day_usd=day_hold.micros / spending.MICROS if day_hold else 0.0,
        )
        head, _ = self._commits.commit(state, event, step=state.step)
        return head, day_hold

    def _hold_day(
        self, state: RunState, agent: str, per_day: float, cost: spending.Cost
    ) -> spending.DayHold | StepOutcome:
        """Hold `cost` on the agent's counter for today (UTC, by the engine's clock), or,
        with no room left, park the run until tomorrow or a raise and return that outcome.
        The counter is moved before the run's record of it: a process that dies between the
        two leaves the hold counted in full, never a record of a hold the counter lacks."""
        assert self._daily is not None
        now = self._clock()
        if cost.usd is None:
            error = (
                f"agent {agent!r} has a daily budget in dollars, and its model "
                f"{state.options.model!r} has no price (set RATCHET_PRICES for it)"
            )
            return self._commits.fail_run(state, Finished(status=RunStatus.FAILED, error=error))
        hold = spending.DayHold(agent, spending.day_of(now), spending.micros(cost.usd))
        if self._daily.reserve(agent, hold.day, hold.micros, spending.micros(per_day)):
            return hold
        asked = BudgetAsked(step=state.next_step, request=spending.day_wait(agent, per_day, now))
        head, written = self._commits.commit(state, asked, step=state.step)
        self._logger.info(
            "the agent's daily budget is spent; the run waits for the next day or a raise",
            extra={"run_id": state.run_id, "agent": agent, "day": hold.day},
        )
        return StepOutcome.of(head, bytes_written=written)

    def _settle_day(self, state: RunState, hold: spending.DayHold, usage: Usage) -> None:
        """Settle the attempt's hold on the day's counter to what its calls used, once the
        step is committed. Not settled (this fails, or the process dies first), the hold
        counts in full: the counter may say more was spent than was, never less."""
        assert self._daily is not None
        used = spending.day_used(hold, usage, spending.price_of(state.options.model))
        try:
            self._daily.settle(hold.agent, hold.day, hold.micros, used)
        except RatchetError:
            self._logger.warning(
                "the day's hold not settled; it counts in full",
                extra={"run_id": state.run_id, "agent": hold.agent, "day": hold.day},
                exc_info=True,
            )

    def _wait_for_call(self, state: RunState, under_way: CallUnderWay) -> StepOutcome:
        self._logger.info(
            "at-most-once call may still be running; the step waits",
            extra={
                "run_id": state.run_id,
                "step": state.next_step,
                "worker_id": self._worker_id,
                "key": under_way.key,
                "because": under_way.because,
                "seconds": round(under_way.seconds, 3),
                "detail": str(under_way),
            },
        )
        return StepOutcome.queued(state, retry_after=under_way.seconds, why=str(under_way))

    def _cut_off_parent(self, state: RunState) -> str | None:
        """The parent's id if `state` is a child run, before its first step, whose parent's
        step that started it was cut off by a cancel (`RunState.cut_off_at`). Read at every
        attempt of the first step: each begins after the child's creation, so after any
        cancel its parent's step did not see in time."""
        if state.step or state.parent is None or state.parent_step is None:
            return None
        try:
            parent = self._store.load_head(state.parent)
        except ValueError:  # a parent that cannot be read stops no child
            return None
        if parent is None or not parent.cut_off_at(state.parent_step):
            return None
        return parent.run_id

    def _slot_seconds(self, state: RunState) -> float:
        """How long a step's slot holds if it is never given back (its holder died): the
        step's own time limit, and a margin for the engine's reads and writes."""
        try:
            limit = self.step_timeout(state)
        except Exception:  # an agent that cannot be set up: its attempt says why, and counts
            limit = None
        return (MAX_STEP_TIMEOUT_SECONDS if limit is None else limit) + SLOT_MARGIN_SECONDS

    def _give_back_slots(self, names: list[str], state: RunState) -> None:
        assert self._slots is not None
        try:
            for name in names:
                self._slots.release(name, state.run_id)
        except Exception:
            # The step is over whatever happened: the slot lapses at its time instead.
            self._logger.warning(
                "slot not given back; it lapses on its own",
                extra={"run_id": state.run_id, "agent": state.agent},
            )

    def step_timeout(self, state: RunState) -> float | None:
        """The time limit, in seconds, of one step of this run's agent (`None`: no limit).
        Whatever drives the engine must allow a step at least this long plus the engine's own
        reads and writes; `MAX_STEP_TIMEOUT_SECONDS` bounds it for every agent."""
        return self._bound(
            state, time.monotonic() + MAX_STEP_TIMEOUT_SECONDS
        ).agent.step_timeout_seconds

    def _commit_step(
        self,
        state: RunState,
        attempted: Attempted,
        *,
        started: float,
        span: tracing.Span = tracing.OFF,
    ) -> tuple[RunState, int]:
        """Commit what the attempt decided and did (`started`: its `time.perf_counter()`);
        returns the new head and the bytes written."""
        step = state.next_step
        key = idempotency_key(state.run_id, step)
        decision = attempted.decision
        if isinstance(decision, Done):
            finished = Finished(
                status=RunStatus.DONE,
                summary=decision.summary,
                attempts=state.attempts,
                usage=attempted.usage,
            )
            return self._commits.commit(
                state, finished, step=state.step, completes=LedgerCompletion(key, "DONE")
            )
        output, wait, folded = attempted.output, attempted.wait, attempted.folded
        assert output is not None
        if isinstance(wait, EventWait | TimerWait):
            # A wait's times count from its step's commit, by the engine's clock.
            now = self._clock()
            wait = stamped(wait, now)
            if isinstance(wait, TimerWait) and wait.until is not None and wait.until <= now:
                # `sleep_until` a time already past: the run goes straight on.
                when = wait.until.strftime("%Y-%m-%d %H:%M:%S UTC")
                output = output.model_copy(update={"text": f"Not sleeping: {when} is past."})
                wait = None
        event = StepCompleted(
            step=step,
            key=key,
            call=decision,
            output=output,
            wait=wait,
            attempt=state.attempts,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
            usage=attempted.usage,
            memory=folded.summary if folded else None,
            memory_through=folded.through if folded else None,
            started=attempted.started,
            span=span.link() if wait is not None else None,
        )
        return self._commits.commit(
            state, event, step=step, completes=LedgerCompletion(key, result_digest(output.text))
        )

    def fail(self, run_id: str, reason: str) -> RunState:
        """Mark the run failed, keeping its last checkpoint (a supervisor gave up on it).
        A run that has already finished is left as it is."""
        state = self.load(run_id)
        if state.is_finished:
            return state
        head, _ = self._commits.commit(
            state,
            Finished(status=RunStatus.FAILED, error=cut(reason), attempts=state.attempts),
            step=state.step,
        )
        self._told(head)
        return head

    def retry(self, run_id: str, *, by: str) -> RunState:
        """Give a failed run a fresh set of attempts at the step that failed, from its last
        checkpoint: recorded decisions and applied keys are honoured as on any resume."""
        state = self.load(run_id)
        if state.status is not RunStatus.FAILED:
            raise NotRetryable(run_id, state.status)
        head, _ = self._commits.commit(state, Retried(by=by), step=state.step)
        return head

    def cancel(self, run_id: str, *, by: str, reason: str = "") -> RunState:
        """End a running or waiting run as `cancelled`, keeping its checkpoints. A step that
        is under way elsewhere finds the run cancelled when it commits (a stale version), or
        before it creates its next child run. With `children`, the child runs it started
        that have not ended are cancelled with it (`ChildRuns.cancelled`): those it waits
        for, and those the step under way had created."""
        state = self.load(run_id)
        if state.is_finished:
            raise NotCancellable(run_id, state.status)
        head, _ = self._commits.commit(state, _cancelled(by, reason), step=state.step)
        self._told(head)
        if self._children is not None:
            self._children.cancelled(state, by=by)
        return head

    def decide_waiting(
        self,
        run: str | RunState,
        decision: PersonDecided | WaitSettled,
        *,
        step: int | None = None,
        consumes: Consumption | None = None,
    ) -> RunState:
        """Settle a waiting run's wait: record a person's decision, or an event, a timeout, a
        timer come due (`WaitSettled`); the run becomes runnable again, the answer the
        waiting step's result. Every wait settles here, in one conditional write.

        `run` is the run's id, or its head as the caller read it: the commit is conditional
        on the version read, so with `step` (only if the run waits at that step) the check
        and the settling are one, and a head that moved since is a `StaleVersion`. A
        `WaitSettled` settles only a wait of its kind (an event or a timeout: an event wait;
        a time: a timer). With `consumes`, the same write takes the event from the run's
        mailbox, and lands only if it was still there. The decision is recorded as given:
        the approval desk checks an answer against the request's schema, the event desk a
        payload against the wait's."""
        state = self.load(run) if isinstance(run, str) else run
        if state.status is not RunStatus.WAITING or (step is not None and state.step != step):
            raise NotWaiting(state.run_id, state.status)
        if not _settles(state, decision):
            kind = state.waiting.kind if state.waiting else "nothing"
            raise NotWaiting(state.run_id, f"waiting for {_KIND_WORDS.get(kind, kind)}")
        how = decision.how if isinstance(decision, WaitSettled) else "decided"
        with tracing.settle_span(state.run_id, state.step, how=how, parked=state.parked_span):
            head, _ = self._commits.commit(state, decision, step=state.step, consumes=consumes)
        return head

    # --- one step --------------------------------------------------------------------------

    def _attempt(self, state: RunState, span: tracing.Span = tracing.OFF) -> Attempted:
        """Decide and act: what the step's commit records. The agent's code runs under the
        agent's time limit, counted from the start of the attempt."""
        started = time.monotonic()
        binding = self._bound(state, started + MAX_STEP_TIMEOUT_SECONDS)
        limit = binding.agent.step_timeout_seconds
        clock = StepClock(
            state.run_id, state.next_step, limit, None if limit is None else started + limit
        )
        clock.wait_for_abandoned()
        decision, usage = self._work.decide(state, binding, clock, span)
        if isinstance(decision, Done):
            return Attempted(decision, usage=usage)
        try:
            output, asked = self._work.act(state, binding, decision, clock)
            wait: AnyWait | None
            children: list[str] | None = None
            if isinstance(asked, StartRuns):
                output, wait, children = self._start_children(state, output, asked)
            else:
                wait = asked
            folded = self._work.summarise(state, binding, clock)
        except (StaleVersion, InjectedFault, CallUnderWay):
            raise
        except Exception as error:
            failure = paid_for(attempt_failure(error, f"step {state.next_step} failed"), usage)
            if failure is error:
                raise
            raise failure from error
        if folded is not None:
            usage = added(usage, folded.usage)
        return Attempted(
            decision,
            output=output,
            wait=wait,
            usage=usage,
            folded=folded,
            started=children,
            step_limit=limit,
        )

    def _start_children(
        self, state: RunState, output: ToolOutput, request: StartRuns
    ) -> tuple[ToolOutput, ChildrenWait | None, list[str]]:
        """Start the runs the tool asked for, before the step commits: a crash from here on
        retries the step, which finds them started (their ids derive from its key)."""
        if self._children is None:
            raise ChildRunsRefused("this runtime starts no child runs")
        step = state.next_step
        started = self._children.start(state, step, request)
        self._faults.hit(FaultPoint.AFTER_CHILDREN_STARTED, step)
        if request.wait == "none":
            listed = ", ".join(started)
            if len(listed) > PREVIEW_CHARS:
                listed = listed[: PREVIEW_CHARS - 1] + "…"
            output = output.model_copy(update={"text": f"{output.text} Their ids: {listed}."})
        return output, request.waits_for(state.run_id, step), started

    def _bound(self, state: RunState, deadline: float) -> Binding:
        clock = StepClock(state.run_id, state.next_step, MAX_STEP_TIMEOUT_SECONDS, deadline)
        try:
            return clock.run(lambda: self._bind(state), f"setting up agent {state.agent!r}")
        except (StepTimedOut, AgentUnloadable):
            raise
        except Exception as error:  # the agent's own hooks run here: any failure is this attempt's
            raise AgentSetupFailed(
                f"cannot set up agent {state.agent!r} for the step: {describe(error)}",
                transient=is_transient(error),
            ) from error

    def _record_failure(self, state: RunState, error: StepAttemptFailed) -> StepOutcome:
        """Record the failed attempt and raise it, or fail the run (`Commits.record_failure`)."""
        if isinstance(error, StepTimedOut) and error.still_running and self._unbind is not None:
            # The abandoned step may still be using the run's resources: the next attempt
            # gets its own. (A cancelled coroutine that has ended uses nothing any more.)
            self._unbind(state.run_id)
        return self._commits.record_failure(state, error)


def _owed_back(unreachable: StoreUnreachable, state: RunState) -> StoreUnreachable:
    """The outage, with the version whose attempt it cut short: the database going away is
    not the step's failure, so no failed attempt is recorded (nothing could be written
    anyway) and the attempt is given back once the store answers (`give_back_attempt`)."""
    unreachable.attempt_version = state.version
    return unreachable


def _cancelled(by: str, reason: str) -> Finished:
    summary = f"Cancelled by {by}" + (f": {reason}" if reason else ".")
    return Finished(status=RunStatus.CANCELLED, summary=cut(summary))


_KIND_WORDS = {
    "person": "a person",
    "event": "an event",
    "timer": "a time",
    "children": "child runs",
}
_SETTLES = {"event": ("event", "timeout"), "timer": ("due", "woken"), "children": ("children",)}


def _settles(state: RunState, decision: PersonDecided | WaitSettled) -> bool:
    """Whether `decision` answers what the run waits for (a head written before there were
    other waits, with no `waiting`, waits for a person)."""
    kind = state.waiting.kind if state.waiting is not None else "person"
    if isinstance(decision, WaitSettled):
        return decision.how in _SETTLES.get(kind, ())
    return kind == "person"
