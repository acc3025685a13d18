"""The step deadline: the agent's code on a thread of its own, under the agent's time limit.

The agent's own code (its hooks, the model call, the tool) runs on one daemon thread per calling
thread (`StepClock.run`); what it raises there, `SystemExit` and `KeyboardInterrupt` too, is the
attempt's failure (`AgentCodeExited` for those two), never the caller's end. A call over the
step's deadline is abandoned: since only the calling thread commits, whatever it returns later is
never written. Python cannot stop the abandoned call, so this process fences it off: the run's
next attempt waits for it before running the agent's code again (`StepClock.wait_for_abandoned`),
and the run is not failed while it runs (`wait_for_abandoned`, `AbandonedCallRunning`).
"""

from __future__ import annotations

import contextvars
import functools
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ratchet.errors import StepTimedOut

ABANDONED_GRACE_SECONDS = 30.0
"""Before failing a run by its strikes, how long the engine waits for a call of the run that
this process abandoned at a step deadline to end (see `AbandonedCallRunning`)."""

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
        if isinstance(job.error, Exception):
            raise job.error
        if job.error is not None:
            # The agent's own `SystemExit` or `KeyboardInterrupt` (raised on this thread by its
            # code, not by the process's signal handlers, which run on the caller's): a failure
            # of the attempt like any other, never the end of the caller.
            raise AgentCodeExited(job.error) from job.error
        value: T = job.value
        return value


_agent_threads = threading.local()


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
