"""The step deadline: the agent's code on a thread of its own, under the agent's time limit.

The agent's own code (its hooks, the model call, the tool) runs on one daemon thread per calling
thread (`StepClock.run`); what it raises there, `SystemExit` and `KeyboardInterrupt` too, is the
attempt's failure (`AgentCodeExited` for those two), never the caller's end. A call over the
step's deadline is abandoned: since only the calling thread commits, whatever it returns later is
never written. Python cannot stop the abandoned call, so this process fences it off: the run's
next attempt waits for it before running the agent's code again (`StepClock.wait_for_abandoned`),
and the run is not failed while it runs (`wait_for_abandoned`, `AbandonedCallRunning`).

A coroutine (an `async def` tool, an async `resources` hook) runs instead on the process's one
event loop (`agent_loop`), on a daemon thread of its own started on first use: one per worker
process or Lambda container, so a client a hook opened there serves the tools on that same
loop. Unlike a thread, a coroutine can be stopped: one over its deadline is cancelled, and if it
truly ends within `CANCEL_GRACE_SECONDS` it is not fenced (nothing of it runs any more); one that
holds out (it caught the cancellation, or blocks the loop) is fenced as an abandoned call is.
"""

from __future__ import annotations

import contextvars
import functools
import os
import queue
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ratchet.errors import StepTimedOut

if TYPE_CHECKING:
    import asyncio

ABANDONED_GRACE_SECONDS = 30.0
"""Before failing a run by its strikes, how long the engine waits for a call of the run that
this process abandoned at a step deadline to end (see `AbandonedCallRunning`)."""

STEP_MARGIN_SECONDS = 60.0
"""What a step takes beyond its agent's code: the engine's DynamoDB calls around it (load the
head, read the ledger, commit), each bounded by the client's timeouts. The step function's
own timeout is the longest step time limit plus this (`ratchet/cdk/functions.py`, kept equal by
tests/infra), so every step an invocation takes has at least the room its first one has."""

CANCEL_GRACE_SECONDS = 1.0
"""How long a coroutine cancelled at its deadline has to end (its `finally` blocks, a client's
close) before it counts as still running, and is fenced as an abandoned thread is."""

T = TypeVar("T")


class AgentCodeExited(Exception):
    """The agent's code raised a `BaseException` that is not an `Exception` (`SystemExit`,
    `KeyboardInterrupt`, ...): the attempt fails with that cause, described as it."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(str(raised))
        self.raised = raised


@dataclass(frozen=True)
class StepClock:
    """One attempt's deadline (`None`: no limit), as a `time.monotonic()` reading: the agent's
    code of the attempt runs under it."""

    run_id: str
    step: int
    limit: float | None
    deadline: float | None

    def wait_for_abandoned(self) -> None:
        """Wait, within this attempt's time, for the run's calls that an earlier attempt in
        this process abandoned: the agent's code never runs beside its own abandoned call."""
        if not _ABANDONED.wait(self.run_id, self.deadline):
            raise StepTimedOut(
                f"step {self.step} timed out after {self.limit:g} s (waiting for the call an "
                "earlier attempt abandoned, still running in this process); nothing was called "
                "beside it"
            )

    def run(self, work: Callable[[], T], doing: str) -> T:
        """Run the agent's `work` on its thread; `StepTimedOut` if it overruns the deadline."""
        runner: _AgentThread | None = getattr(_agent_threads, "runner", None)
        if runner is None:
            runner = _agent_threads.runner = _AgentThread()
        try:
            return runner.run(work, self.deadline)
        except _Overran as overran:
            _agent_threads.runner = None
            _ABANDONED.add(self.run_id, overran.job)
            raise StepTimedOut(
                f"step {self.step} timed out after {self.limit:g} s ({doing}); the late result, "
                "if any, is discarded"
            ) from None

    def run_async(self, work: Callable[[], Coroutine[Any, Any, T]], doing: str) -> T:
        """Await the coroutine `work()` makes on the process's event loop (`work` is called
        there too, so no agent code runs on the caller's thread); one over the deadline is
        cancelled and `StepTimedOut`, fenced only if it does not end when cancelled."""
        try:
            return agent_loop().run(work, self.deadline)
        except _Cancelled as cancelled:
            if cancelled.ended:
                ended = StepTimedOut(
                    f"step {self.step} timed out after {self.limit:g} s ({doing}); the "
                    "coroutine was cancelled and has ended"
                )
                ended.still_running = False
                raise ended from None
            _ABANDONED.add(self.run_id, cancelled.job)
            raise StepTimedOut(
                f"step {self.step} timed out after {self.limit:g} s ({doing}); the coroutine "
                f"was cancelled but had not ended {CANCEL_GRACE_SECONDS:g} s later (it caught "
                "the cancellation, or blocks the event loop); the late result, if any, is "
                "discarded"
            ) from None


def await_on_loop(awaitable: Awaitable[T]) -> T:
    """Wait, on this thread, for `awaitable` on the process's event loop (an async
    `resources` hook's result), under no deadline of its own: the caller's clock bounds it."""

    async def awaited() -> T:
        return await awaitable

    return agent_loop().run(awaited, None)


def abandoned_call_running(run_id: str) -> bool:
    """Whether a call of the run's agent that this process abandoned is still running."""
    return bool(_ABANDONED.running(run_id))


def wait_for_abandoned(run_id: str, deadline: float | None) -> bool:
    """True once none of the run's calls abandoned in this process runs; False if one still
    does at `deadline` (a `time.monotonic()` reading; None: wait as long as they take)."""
    return _ABANDONED.wait(run_id, deadline)


# --- the agent's own thread -----------------------------------------------------------------


class _Overran(Exception):
    def __init__(self, job: _Job) -> None:
        super().__init__()
        self.job = job


@dataclass
class _Job:
    work: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None

    def outcome(self) -> Any:
        """What the finished job returned, or what it raised, for its caller to raise."""
        if isinstance(self.error, Exception):
            raise self.error
        if self.error is not None:
            # The agent's own `SystemExit` or `KeyboardInterrupt` (raised on its thread by its
            # code, not by the process's signal handlers, which run on the caller's): a failure
            # of the attempt like any other, never the end of the caller.
            raise AgentCodeExited(self.error) from self.error
        return self.value


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while (job := jobs.get()) is not None:
        try:
            job.value = job.work()
        except BaseException as error:  # handed to the caller, which decides what it means
            job.error = error
        finally:
            job.done.set()
        del job


class _AgentThread:
    """One daemon thread that runs the agent's code for one calling thread, step after step
    (so a handle a `resources` hook opened stays on the thread that opened it). A job that
    overruns its deadline is abandoned with its thread, which ends when the job does; being a
    daemon, a job that never ends cannot keep the process alive."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        threading.Thread(
            target=_serve, args=(self._jobs,), name="ratchet-agent", daemon=True
        ).start()
        # When the calling thread ends, and this object with it, let the agent thread end too.
        self._stop = weakref.finalize(self, self._jobs.put, None)

    def run(self, work: Callable[[], T], deadline: float | None) -> T:
        # In the caller's context: what the agent's code does nests under the engine's span
        # of the call (an instrumented HTTP client's spans, say), as if it ran on the caller.
        job = _Job(functools.partial(contextvars.copy_context().run, work))
        self._jobs.put(job)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not job.done.wait(timeout):
            self._stop()
            raise _Overran(job)
        value: T = job.outcome()
        return value


_agent_threads = threading.local()


# --- the process's event loop -----------------------------------------------------------------


class _Cancelled(Exception):
    def __init__(self, job: _Job, *, ended: bool) -> None:
        super().__init__()
        self.job = job
        self.ended = ended


class AgentLoop:
    """One asyncio event loop on a daemon thread, for the agent's coroutines of every run this
    process works. Each call waits on its caller's thread; the loop interleaves the
    coroutines of many callers, so a coroutine that blocks (a sync sleep, a sync client)
    holds up every other."""

    def __init__(self) -> None:
        # `asyncio` is loaded with the first loop, not with this module: a command that works
        # no step (`ratchet start`, `approve`) has no use for it (bench/cli_start.py).
        import asyncio

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="ratchet-agent-loop", daemon=True
        )
        self.thread.start()

    def run(self, work: Callable[[], Coroutine[Any, Any, T]], deadline: float | None) -> T:
        if threading.current_thread() is self.thread:
            raise RuntimeError("agent code on Ratchet's event loop cannot wait for that loop")
        job = _Job(work)
        tasks: list[asyncio.Task[None]] = []

        async def guarded() -> None:
            try:
                job.value = await work()
            except BaseException as error:  # handed to the caller, as on the agent's thread
                job.error = error

        def start() -> None:
            task = self.loop.create_task(guarded())
            # Set when the task has really ended, cancelled before it began included.
            task.add_done_callback(lambda _: job.done.set())
            tasks.append(task)

        self.loop.call_soon_threadsafe(start)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not job.done.wait(timeout):
            # Scheduled after `start`, so the task exists; whatever the coroutine does with the
            # cancellation, `done` waits for its real end.
            self.loop.call_soon_threadsafe(lambda: tasks[0].cancel())
            raise _Cancelled(job, ended=job.done.wait(CANCEL_GRACE_SECONDS))
        value: T = job.outcome()
        return value


_loop_lock = threading.Lock()
_loop: AgentLoop | None = None


def agent_loop() -> AgentLoop:
    """The process's event loop for agent coroutines, started on first use."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = AgentLoop()
        return _loop


def _forget_loop() -> None:
    # A forked child has the parent's loop object but not its thread: it starts its own.
    global _loop, _loop_lock
    _loop, _loop_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_loop)


# --- the fence of abandoned calls -----------------------------------------------------------


class _Abandoned:
    """The agent calls of each run that this process abandoned at their deadline and that
    still run. One for the process: whichever engine takes the run's next attempt here (a
    worker's, `ratchet serve`'s, the step function's next invocation in a thawed sandbox)
    must see them, since Python cannot stop a thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, list[_Job]] = {}

    def add(self, run_id: str, job: _Job) -> None:
        with self._lock:
            self._jobs.setdefault(run_id, []).append(job)

    def running(self, run_id: str) -> list[_Job]:
        with self._lock:
            jobs = [j for j in self._jobs.pop(run_id, []) if not j.done.is_set()]
            if jobs:
                self._jobs[run_id] = jobs
            return jobs

    def wait(self, run_id: str, deadline: float | None) -> bool:
        """True once none of the run's abandoned calls runs; False if one still does at
        `deadline` (None: wait as long as they take)."""
        for job in self.running(run_id):
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not job.done.wait(timeout):
                return False
        return True


_ABANDONED = _Abandoned()
