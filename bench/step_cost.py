"""What one Ratchet step costs: bytes written, engine time per step, and resume time.

`make bench` (`python -m bench.step_cost`) runs the scripted agent of `bench.scripted_agent`
(each step one tool call with 200 B of arguments and a 1 KB result: 1.4 KB of new data a step)
for 10,000 steps through the real local runtime and engine, in this process, on the store's
own durable settings (WAL, synchronous=FULL). It prints each figure beside its target (issues 2
and 9). The machine is shared and noisy, so the unit the figures compare against is one durable
SQLite commit, measured in the same run on the same disk.

Bytes written by a step are logical bytes, the values handed to SQLite:

- the engine's commit receipt, which the store also keeps in the `bytes` column of
  `checkpoints`: the new head (the run state as JSON), the step record (event JSON, run id,
  worker id, status) and the ledger result, as UTF-8;
- the ledger's decision row, written before the tool runs: every column but `result` (the
  receipt has it), text as UTF-8 and integers as 8 bytes; its decision as `begin` wrote it,
  which the commit drops from the row once the step's record holds it (the record's call);
- the attempt bump as the step begins, before any work: `runs.attempts` and `runs.version`,
  two integers, in a commit of its own (a count in the commit of the step before would leave a
  strike on this step if the process died in between).

SQLite writes whole pages to its WAL: the WAL bytes of a step are measured exactly, by emptying
the WAL (a TRUNCATE checkpoint) before the step and reading its size after.

The engine's overhead is a step's wall time minus the time inside the agent's tool handler,
which is the app's own work (copying 1,000 rows), timed by wrapping the tools; it is split into
this process's CPU time and the rest (waiting on the disk, or for a CPU).

Resume is timed in a new process, from after its imports until its step is durable. The
resume processes take steps 11-15 and 997-1,001 of the same run, so that they start from the
run at steps 10-14 and 996-1,000.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

# Imported up front, as a worker does at start-up, so a resume's timer does not pay for it.
import aws_lambda_powertools  # noqa: F401

from bench.measure import DISCARD, WRITES_KNOWN, bytes_written_by_process, wal_position
from bench.postgres_requests import PostgresRequests, Requests
from bench.scripted_agent import ARGUMENT_BYTES, RESULT_BYTES, new_scripted_run
from ratchet import stored
from ratchet.adapters.sqlite.database import PAGE_SIZE
from ratchet.engine import Binder, Binding, Engine, Outcome
from ratchet.engine.decisions import decision_from, payload_of
from ratchet.observability import json_logger
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import Budget, RunState, idempotency_key
from ratchet.tools import Handler, ToolContext, ToolResult

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RUN_ID = "bench-run"
WORKER_ID = "bench"
"""The same id in this process and in the resume processes, so their records weigh the same."""

STEPS = 10_000
MAX_STEPS = 10_000
BYTES_AT_STEPS = (10, 100, 1000, 10_000)
START_WINDOW = (1, 50)
END_WINDOW = (950, 1000)
RESUME_SAMPLES = 5
"""Fresh processes per resume figure, one after the other: each takes the run's next step."""
START_RESUMES_FROM = 10
END_RESUMES_FROM = END_WINDOW[1] - RESUME_SAMPLES + 1
"""So that the last resume process starts from step 1,000 and copies the last batch."""
BASELINE_ROW_BYTES = 1536
ENGINE_COMMITS_PER_STEP = 3
"""The attempt bump (not synced: the decision's commit syncs it), the ledger decision and the
step commit."""

ATTEMPT_BUMP_BYTES = 16
INTEGER_BYTES = 8

NEW_DATA_BYTES = ARGUMENT_BYTES + RESULT_BYTES + 200
"""What a step adds that no earlier step wrote: the call, the result and ~200 B of step number,
key, tool name and timing: the floor of what a step must write."""
MAX_STEP_BYTES = 2200
"""Rows written by a step: at most 1.6 x its new data (DBOS writes 2.1 KB on the same agent)."""
MAX_WAL_BYTES = 16 * 1024
WAL_STEPS = 20
"""Steps the WAL figure is averaged over (one step's pages depend on where its rows land)."""
MAX_GROWTH_BYTES = 64
"""Step 10,000 over step 100: numbers get wider (versions, steps, keys); nothing else may."""
MAX_ENGINE_MS = 2.0
MAX_RESUME_MS = 20.0
MAX_RESUME_RATIO = 2.0


@dataclass(frozen=True)
class Cost:
    wall_ms: float = 0.0
    cpu_ms: float = 0.0
    """This process's CPU time: the part of `wall_ms` not spent waiting on the disk or others."""
    written: int = 0
    """Bytes handed to write(2): SQLite's WAL pages and checkpoints, for the store."""

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.wall_ms + other.wall_ms, self.cpu_ms + other.cpu_ms, self.written + other.written
        )

    def __sub__(self, other: Cost) -> Cost:
        return Cost(
            self.wall_ms - other.wall_ms, self.cpu_ms - other.cpu_ms, self.written - other.written
        )


# --- timing the app's tool apart from the engine ---------------------------------------------


class ToolClock:
    """Wraps an agent's tool handlers to meter them, so that what the engine costs is a step's
    cost minus the tool's (the app's own work, here copying 1,000 rows)."""

    def __init__(self) -> None:
        self.spent = Cost()
        self._bound: dict[str, Binding] = {}

    def binder(self, bind: Binder) -> Binder:
        def metered_bind(state: RunState) -> Binding:
            binding = self._bound.get(state.run_id)
            if binding is None:
                binding = bind(state)
                tools = [replace(t, handler=self._metered(t.handler)) for t in binding.agent.tools]
                binding = replace(binding, agent=replace(binding.agent, tools=tools))
                self._bound[state.run_id] = binding
            return binding

        return metered_bind

    def close(self) -> None:
        for binding in self._bound.values():
            close = getattr(binding.resources, "close", None)
            if close is not None:
                close()

    def _metered(self, handler: Handler[Any]) -> Handler[Any]:
        # The bench's tools are sync: what a handler returns is its whole work.
        def metered(args: Any, ctx: ToolContext) -> ToolResult | str | Awaitable[ToolResult | str]:
            # Reading the counters happens inside the tool's span, so it is not the engine's.
            wall, cpu, written = (
                time.perf_counter(),
                time.process_time(),
                bytes_written_by_process(),
            )
            try:
                return handler(args, ctx)
            finally:
                written = bytes_written_by_process() - written
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                self.spent += Cost(wall * 1000, cpu * 1000, written)

        return metered


def bench_engine(runtime: LocalRuntime, clock: ToolClock) -> Engine:
    """The engine `LocalRuntime.engine` builds, with the agent's tools metered by `clock`."""
    return Engine(
        store=runtime.store,
        ledger=runtime.ledger,
        blobs=runtime.blobs,
        bind=clock.binder(runtime.bind),
        worker_id=WORKER_ID,
        logger=json_logger(DISCARD),
    )


# --- one run, stepped in this process --------------------------------------------------------


@dataclass(frozen=True)
class StepTiming:
    step: int
    whole: Cost
    tool: Cost

    @property
    def engine(self) -> Cost:
        return self.whole - self.tool


@dataclass(frozen=True)
class StepBytes:
    """What the commit of one step wrote, as counted in the module docstring."""

    step: int
    receipt: int
    ledger_decision: int
    attempt_bump: int = ATTEMPT_BUMP_BYTES
    wal: float | None = None
    """What a step appended to SQLite's WAL (whole pages), over `WAL_STEPS` steps from
    `wal_step`."""
    wal_step: int | None = None

    @property
    def total(self) -> int:
        return self.receipt + self.ledger_decision + self.attempt_bump


class BenchRun:
    """A run of the scripted agent in a fresh store under `directory`, advanced by the real
    engine."""

    def __init__(
        self,
        directory: Path,
        *,
        steps: int,
        max_steps: int,
        budget: Budget | None = None,
        url: str | None = None,
    ) -> None:
        self.url = url or f"sqlite:///{directory / 'ratchet.db'}"
        self.runtime = _open(self.url)
        self.clock = ToolClock()
        self.engine = bench_engine(self.runtime, self.clock)
        # What `ratchet start --agent bench.scripted_agent:agent --param steps=N` does (with
        # `--budget`, when given one).
        state = new_scripted_run(RUN_ID, steps=steps, max_steps=max_steps)
        if not self.engine.start(state.model_copy(update={"budget": budget})):
            raise RuntimeError(f"run {RUN_ID} already exists in {self.url}")

    def __enter__(self) -> BenchRun:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def step(self) -> int:
        return self.engine.load(RUN_ID).step

    def advance_to(
        self,
        step: int,
        *,
        between: Callable[[int], None] | None = None,
        start: int | None = None,
    ) -> list[StepTiming]:
        """Take steps until the run has completed `step`; each must complete and leave the
        run running. `between` is called after each, outside the timing. `start`: the step
        the run is at, when the caller knows it, so that nothing but the steps is sent to the
        store (reading it is a transaction of its own)."""
        timings = []
        for expected in range((self.step if start is None else start) + 1, step + 1):
            timings.append(self._advance(expected))
            if between is not None:
                between(expected)
        return timings

    def _advance(self, expected: int) -> StepTiming:
        self.clock.spent = Cost()
        written, cpu, wall = bytes_written_by_process(), time.process_time(), time.perf_counter()
        outcome = self.engine.advance(RUN_ID)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        written = bytes_written_by_process() - written
        if outcome.outcome is not Outcome.CONTINUE or outcome.step != expected:
            raise RuntimeError(f"expected step {expected} to complete, got {outcome}")
        return StepTiming(expected, Cost(wall * 1000, cpu * 1000, written), self.clock.spent)

    def wal_bytes_per_step(self, steps: int = WAL_STEPS) -> float:
        """Take the next `steps` steps with the WAL emptied first: the WAL's size after them is
        exactly what their commits appended (a frame of 24 B and a page for every page a commit
        changed; the 32 B header out), page splits and all. Per step."""
        self.runtime.db.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for _ in range(steps):
            self._advance(self.step + 1)
        wal = self.runtime.db.path.with_name(self.runtime.db.path.name + "-wal")
        return (wal.stat().st_size - 32) / steps

    def step_bytes(self, step: int) -> StepBytes:
        connection = self.runtime.db.connection
        codec = self.runtime.codec
        opened = (
            (record_step, size, stored.open_sealed_text(event, codec, part="event", run_id=RUN_ID))
            for record_step, size, event in connection.execute(
                "SELECT step, bytes, event FROM checkpoints WHERE run_id = ? AND step = ?",
                (RUN_ID, step),
            )
        )
        records = {
            record_step: (size, json.loads(event))
            for record_step, size, event in opened
            if json.loads(event)["kind"] == "step"
        }
        receipts = [records[step][0]] if step in records else []
        decision = connection.execute(
            "SELECT key, run_id, step, status, args_hash, decision, created_at, expires_at "
            "FROM idempotency WHERE key = ?",
            (idempotency_key(RUN_ID, step),),
        ).fetchone()
        if len(receipts) != 1 or decision is None:
            raise LookupError(f"step {step} of {RUN_ID} has no single step record")
        written = list(decision)
        if written[5] is None:  # dropped by the commit: what `begin` wrote is the record's call
            written[5] = stored.sealed_text(
                json.dumps(
                    payload_of(decision_from(records[step][1]["call"])),
                    sort_keys=True,
                    separators=(",", ":"),
                ),
                codec,
                part="decision",
                run_id=RUN_ID,
            )
        return StepBytes(step, receipts[0], _row_bytes(written))

    def close(self) -> None:
        self.clock.close()
        self.runtime.close()


def _row_bytes(row: Iterable[object]) -> int:
    return sum(
        INTEGER_BYTES if isinstance(value, int) else len(str(value).encode("utf-8"))
        for value in row
        if value is not None
    )


# --- the baseline: one durable SQLite commit -------------------------------------------------


class DurableCommitProbe:
    """Commits a ~1.5 KB row to its own SQLite file (WAL, synchronous=FULL) and times it."""

    def __init__(self, path: Path, *, warm_up: int = 5) -> None:
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE probe (id INTEGER PRIMARY KEY, body TEXT)")
        # A long-lived database rewrites its WAL in place; a new one grows it on every commit,
        # and syncing a growing file costs more. Grow it past one auto-checkpoint first, so the
        # unit is the steady-state commit the store makes by step 1,000.
        self._db.execute("INSERT INTO probe (body) VALUES (zeroblob(4500 * 1024))")
        self._db.execute("DELETE FROM probe")
        self._db.execute("PRAGMA wal_checkpoint(RESTART)")
        for _ in range(warm_up):
            self.commit_ms()

    def commit_ms(self) -> float:
        body = os.urandom(BASELINE_ROW_BYTES // 2).hex()
        started = time.perf_counter()
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute("INSERT INTO probe (body) VALUES (?)", (body,))
        self._db.execute("COMMIT")
        return (time.perf_counter() - started) * 1000

    def close(self) -> None:
        self._db.close()


# --- resume in a fresh process ---------------------------------------------------------------


@dataclass(frozen=True)
class ResumeSample:
    from_step: int
    total_ms: float
    cpu_ms: float
    tool_ms: float


def resume_in_fresh_process(url: str) -> ResumeSample:
    """Resume the run in a new Python process, timed there from after its imports until the
    next step is durable: open the store, load the head, take and commit one step."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.step_cost", "--resume-one", url],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"the resume process failed:\n{completed.stderr}")
    return ResumeSample(**json.loads(completed.stdout.splitlines()[-1]))


def _open(url: str) -> LocalRuntime:
    """The local runtime on `url`: a SQLite file, or (`--compare-postgres`) a Postgres store."""
    if url.startswith("postgresql://"):
        from ratchet.runtime.postgres import PostgresRuntime

        return PostgresRuntime.open(_settings(url))
    return LocalRuntime.open(_settings(url))


def _settings(url: str) -> LocalSettings:
    """The store's settings, with the payload codec `--payload-key` names (the resume
    processes inherit it as `RATCHET_PAYLOAD_KEY`)."""
    return LocalSettings(store=url, payload_key=os.environ.get("RATCHET_PAYLOAD_KEY") or None)


def _resume_one(url: str) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    runtime = LocalRuntime.open(_settings(url), create=False)
    clock = ToolClock()
    outcome = bench_engine(runtime, clock).advance(RUN_ID)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    clock.close()
    runtime.close()
    if outcome.outcome is not Outcome.CONTINUE:
        raise RuntimeError(f"the resumed step did not complete: {outcome}")
    sample = ResumeSample(outcome.step - 1, wall * 1000, cpu * 1000, clock.spent.wall_ms)
    print(json.dumps(asdict(sample)))


# --- the bench -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    bytes_at: list[StepBytes]
    timings: list[StepTiming]
    baseline: dict[int, float]
    """One durable commit, timed right after each step of the two windows, by step."""
    start_resumes: list[ResumeSample]
    end_resumes: list[ResumeSample]
    seconds: float


def measure(directory: Path, *, steps: int = STEPS) -> Figures:
    started = time.perf_counter()
    probe = DurableCommitProbe(directory / "baseline.db")
    baseline: dict[int, float] = {}
    wal: dict[int, float] = {}

    def commit_baseline(step: int) -> None:
        baseline[step] = probe.commit_ms()

    def wal_from(step: int) -> None:
        """The WAL bytes a step of the `WAL_STEPS` steps from `step` on (or from the next
        step, if the run is past it)."""
        run.advance_to(step - 1)
        first = run.step + 1
        wal[first] = run.wal_bytes_per_step()

    try:
        with BenchRun(directory / "store", steps=steps, max_steps=MAX_STEPS) as run:
            timings = run.advance_to(START_RESUMES_FROM, between=commit_baseline)
            start_resumes = [resume_in_fresh_process(run.url) for _ in range(RESUME_SAMPLES)]
            timings += run.advance_to(START_WINDOW[1], between=commit_baseline)
            wal_from(START_WINDOW[1] + 1)
            wal_from(BYTES_AT_STEPS[1])
            timings += run.advance_to(END_WINDOW[0] - 1)
            timings += run.advance_to(END_RESUMES_FROM, between=commit_baseline)
            end_resumes = [resume_in_fresh_process(run.url) for _ in range(RESUME_SAMPLES)]
            wal_from(BYTES_AT_STEPS[2])  # the resume processes took step 1,000: the next ones
            last = [s for s in BYTES_AT_STEPS[3:] if s <= steps]
            for step in last:
                wal_from(step - WAL_STEPS + 1)
            bytes_at = [
                replace(run.step_bytes(step), wal=wal[at], wal_step=at)
                for step, at in zip((*BYTES_AT_STEPS[:3], *last), sorted(wal), strict=True)
            ]
    finally:
        probe.close()
    return Figures(
        bytes_at=bytes_at,
        timings=timings,
        baseline=baseline,
        start_resumes=start_resumes,
        end_resumes=end_resumes,
        seconds=time.perf_counter() - started,
    )


def _median(values: Iterable[float]) -> float:
    return statistics.median(values)


def _p90(values: Iterable[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _table(rows: Sequence[Sequence[str]], align: str) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(align))]
    return [
        "  ".join(
            cell.ljust(width) if how == "<" else cell.rjust(width)
            for cell, width, how in zip(cells, widths, align, strict=True)
        ).rstrip()
        for cells in rows
    ]


Row = tuple[str, str, str, str]


def _bytes_rows(written: list[StepBytes]) -> list[Row]:
    rows: list[Row] = []
    for b in written:
        rows.append(
            (
                f"rows written by step {b.step:,}",
                f"{b.total:,} B ({b.total / NEW_DATA_BYTES:.2f}x the new data)",
                f"<= {MAX_STEP_BYTES:,} B",
                _verdict(b.total <= MAX_STEP_BYTES),
            )
        )
        if b.wal is not None:
            rows.append(
                (
                    f"  WAL bytes a step, steps {b.wal_step or 0:,}-"
                    f"{(b.wal_step or 0) + WAL_STEPS - 1:,}",
                    f"{b.wal:,.0f} B ({b.wal / (PAGE_SIZE + 24):.1f} pages of {PAGE_SIZE:,} B)",
                    f"<= {MAX_WAL_BYTES // 1024} KiB",
                    _verdict(b.wal <= MAX_WAL_BYTES),
                )
            )
    first, last = written[1], written[-1]
    rows.append(
        (
            f"growth, step {last.step:,} - step {first.step:,}",
            f"{last.total - first.total:+,} B",
            f"flat: <= {MAX_GROWTH_BYTES} B",
            _verdict(abs(last.total - first.total) <= MAX_GROWTH_BYTES),
        )
    )
    return rows


def _window_rows(figures: Figures, window: tuple[int, int], *, target: bool) -> list[Row]:
    low, high = window
    timed = [t for t in figures.timings if low <= t.step <= high]
    commit = _median(ms for step, ms in figures.baseline.items() if low <= step <= high)
    engine = _median(t.engine.wall_ms for t in timed)
    engine_cpu = _median(t.engine.cpu_ms for t in timed)
    engine_waiting = _median(t.engine.wall_ms - t.engine.cpu_ms for t in timed)
    rows: list[Row] = [
        (
            f"step wall time, steps {timed[0].step:,}-{timed[-1].step:,} (n={len(timed)})",
            f"{_median(t.whole.wall_ms for t in timed):.2f} ms "
            f"(p90 {_p90(t.whole.wall_ms for t in timed):.2f})",
            "",
            "",
        ),
        ("  the app's tool handler", f"{_median(t.tool.wall_ms for t in timed):.2f} ms", "", ""),
        (
            "  engine overhead (step - tool)",
            f"{engine:.2f} ms (p90 {_p90(t.engine.wall_ms for t in timed):.2f})",
            f"<= {MAX_ENGINE_MS:g} ms" if target else "",
            _verdict(engine <= MAX_ENGINE_MS) if target else "",
        ),
        (
            "    CPU / waiting (disk, scheduler)",
            f"{engine_cpu:.2f} / {engine_waiting:.2f} ms",
            "",
            "",
        ),
        (
            "    in durable commits (baseline)",
            f"{engine / commit:.1f} x {commit:.3f} ms",
            "",
            "",
        ),
    ]
    if WRITES_KNOWN:
        rows.append(
            (
                "    SQLite's physical writes",
                f"{statistics.mean(t.engine.written for t in timed):,.0f} B (mean)",
                "",
                "",
            )
        )
    return rows


def _resume_rows(samples: list[ResumeSample]) -> list[Row]:
    total = _median(s.total_ms for s in samples)
    cpu = _median(s.cpu_ms for s in samples)
    waiting = _median(s.total_ms - s.cpu_ms for s in samples)
    return [
        (
            f"resume in a fresh process, run at step {samples[0].from_step:,}-"
            f"{samples[-1].from_step:,}",
            f"{total:.1f} ms (median)",
            f"<= {MAX_RESUME_MS:g} ms",
            _verdict(total <= MAX_RESUME_MS),
        ),
        ("  samples", " / ".join(f"{s.total_ms:.1f}" for s in samples) + " ms", "", ""),
        (
            "  CPU / waiting; the app's tool handler",
            f"{cpu:.1f} / {waiting:.1f} ms; {_median(s.tool_ms for s in samples):.1f} ms",
            "",
            "",
        ),
    ]


def report(figures: Figures) -> str:
    written = figures.bytes_at
    lines = [
        f"Ratchet step cost: the scripted agent ({ARGUMENT_BYTES} B of arguments and a "
        f"{RESULT_BYTES:,} B result a step, {NEW_DATA_BYTES:,} B of new data), "
        f"{written[-1].step:,} steps, scripted model",
        f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=FULL) in {tempfile.gettempdir()}, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, payload codec "
        f"{os.environ.get('RATCHET_PAYLOAD_KEY') or 'off'}",
        "",
        *_table(
            [
                ("what a step writes (logical bytes)", *(f"step {b.step:,}" for b in written)),
                ("commit receipt (checkpoints.bytes)", *(f"{b.receipt:,}" for b in written)),
                ("ledger decision row", *(f"{b.ledger_decision:,}" for b in written)),
                ("attempt bump", *(f"{b.attempt_bump:,}" for b in written)),
                ("total", *(f"{b.total:,}" for b in written)),
            ],
            "<" + ">" * len(written),
        ),
        "",
    ]

    start_engine = _median(
        t.engine.wall_ms for t in figures.timings if START_WINDOW[0] <= t.step <= START_WINDOW[1]
    )
    end_engine = _median(
        t.engine.wall_ms for t in figures.timings if END_WINDOW[0] <= t.step <= END_WINDOW[1]
    )
    start_resume = _median(s.total_ms for s in figures.start_resumes)
    end_resume = _median(s.total_ms for s in figures.end_resumes)
    resume_ratio = end_resume / start_resume
    baseline = list(figures.baseline.values())
    rows: list[Row] = [
        ("figure", "measured", "target", "result"),
        *_bytes_rows(written),
        *_window_rows(figures, START_WINDOW, target=False),
        *_window_rows(figures, END_WINDOW, target=True),
        ("engine overhead, end / start", f"{end_engine / start_engine:.2f}x", "", ""),
        *_resume_rows(figures.start_resumes),
        *_resume_rows(figures.end_resumes),
        (
            "resume, end / start",
            f"{resume_ratio:.2f}x",
            f"<= {MAX_RESUME_RATIO:g}x",
            _verdict(resume_ratio <= MAX_RESUME_RATIO),
        ),
        (
            f"baseline: one durable commit, {BASELINE_ROW_BYTES:,} B row",
            f"{_median(baseline):.3f} ms (p90 {_p90(baseline):.3f}, n={len(baseline)})",
            "",
            "",
        ),
    ]
    lines += _table(rows, "<<<<")
    lines += [
        "",
        "Receipt: the new head (run state JSON), the step record and the ledger result, as the "
        "store counts them.",
        "Ledger decision row: written before the tool runs, all columns but the result. Attempt "
        "bump: 2 integers, as the step begins.",
        f"The engine makes {ENGINE_COMMITS_PER_STEP} commits a step (attempt, decision, step), "
        "the attempt's not synced; the tool makes the app's own.",
        "Baseline: timed right after each windowed step, on the same disk, WAL at steady size. "
        "Physical writes: /proc/self/io, tool's out.",
        "Resume: timed in the new process from after its imports until the next step is "
        f"durable; {RESUME_SAMPLES} processes in a row.",
        f"Steps {START_RESUMES_FROM + 1}-{START_RESUMES_FROM + RESUME_SAMPLES} and "
        f"{END_RESUMES_FROM + 1:,}-{END_RESUMES_FROM + RESUME_SAMPLES:,} were taken by the "
        "resume processes, so the windows leave them out.",
        f"bench took {figures.seconds:.1f} s",
    ]
    return "\n".join(lines)


def codec_comparison(off: Figures, on: Figures, setting: str) -> str:
    """What a step costs with the payload codec off and on, side by side, from two runs of the
    bench in one process (`--compare-codec`)."""

    def window(figures: Figures, low: int, high: int, part: str) -> float:
        timed = [t for t in figures.timings if low <= t.step <= high]
        return _median(getattr(t.engine, part) for t in timed)

    rows: list[Row] = [("figure (medians)", "codec off", f"codec on ({setting})", "on / off")]
    for a, b in zip(off.bytes_at, on.bytes_at, strict=True):
        rows.append(
            (
                f"rows written by step {a.step:,}",
                f"{a.total:,} B",
                f"{b.total:,} B",
                f"{b.total / a.total:.2f}x",
            )
        )
    for a, b in zip(off.bytes_at, on.bytes_at, strict=True):
        assert a.wal is not None
        assert b.wal is not None
        rows.append(
            (
                f"WAL bytes a step from step {a.wal_step:,}",
                f"{a.wal:,.0f} B",
                f"{b.wal:,.0f} B",
                f"{b.wal / a.wal:.2f}x",
            )
        )
    for low, high in (START_WINDOW, (END_WINDOW[0], END_RESUMES_FROM - 1)):
        for part, what in (("wall_ms", "engine overhead"), ("cpu_ms", "  of it CPU")):
            a_ms, b_ms = window(off, low, high, part), window(on, low, high, part)
            rows.append(
                (
                    f"{what}, steps {low:,}-{high:,}",
                    f"{a_ms:.2f} ms",
                    f"{b_ms:.2f} ms",
                    f"{b_ms / a_ms:.2f}x",
                )
            )
    for what, a_samples, b_samples in (
        ("resume in a fresh process, from step 10", off.start_resumes, on.start_resumes),
        ("resume in a fresh process, from step 996", off.end_resumes, on.end_resumes),
    ):
        a_ms = _median(r.total_ms for r in a_samples)
        b_ms = _median(r.total_ms for r in b_samples)
        rows.append((what, f"{a_ms:.1f} ms", f"{b_ms:.1f} ms", f"{b_ms / a_ms:.2f}x"))
    return "\n".join(
        [
            f"Ratchet step cost with the payload codec off and on: {off.bytes_at[-1].step:,} "
            f"steps each, SQLite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPUs",
            "",
            *_table(rows, "<>>>"),
            "",
            f"bench took {off.seconds + on.seconds:.1f} s",
        ]
    )


# --- what a budget costs a step ------------------------------------------------------------

BUDGET_STEPS = 300
BUDGET_DYNAMODB_STEPS = 50
NO_BOUND = Budget(usd=10_000.0)
"""A budget the scripted agent never reaches (its calls cost nothing): every step still
reserves and settles, which is what is measured."""


def budget_comparison(directory: Path, steps: int = BUDGET_STEPS) -> str:
    """A step's engine time, records and bytes without a budget and with one, from two runs
    stepped in turn in this process (so both see the same noise), and on DynamoDB (moto)
    its requests and write units."""
    started = time.perf_counter()
    timed: dict[str, list[StepTiming]] = {"without": [], "with": []}
    records: dict[str, int] = {}
    with (
        BenchRun(directory / "without", steps=steps + 10, max_steps=MAX_STEPS) as plain,
        BenchRun(
            directory / "with", steps=steps + 10, max_steps=MAX_STEPS, budget=NO_BOUND
        ) as budgeted,
    ):
        for step in range(1, steps + 1):
            timed["without"] += plain.advance_to(step)
            timed["with"] += budgeted.advance_to(step)
        for name, run in (("without", plain), ("with", budgeted)):
            records[name] = len(run.runtime.store.list_checkpoints(RUN_ID))
            written = run.runtime.db.connection.execute(
                "SELECT SUM(bytes) FROM checkpoints WHERE run_id = ?", (RUN_ID,)
            ).fetchone()[0]
            records[f"{name} bytes"] = int(written)
    dynamodb = {
        name: _dynamodb_step_cost(budget)
        for name, budget in (("without", None), ("with", NO_BOUND))
    }
    rows: list[Row] = [("figure (medians over the steps)", "no budget", "a budget", "difference")]
    for part, what in (("wall_ms", "engine time a step"), ("cpu_ms", "  of it CPU")):
        a = _median(getattr(t.engine, part) for t in timed["without"])
        b = _median(getattr(t.engine, part) for t in timed["with"])
        rows.append((what, f"{a:.3f} ms", f"{b:.3f} ms", f"{b - a:+.3f} ms"))
    a_records, b_records = records["without"] / steps, records["with"] / steps
    rows.append(
        (
            "checkpoint records a step",
            f"{a_records:.2f}",
            f"{b_records:.2f}",
            f"{b_records - a_records:+.2f}",
        )
    )
    a_bytes, b_bytes = records["without bytes"] / steps, records["with bytes"] / steps
    rows.append(
        (
            "bytes committed a step",
            f"{a_bytes:,.0f} B",
            f"{b_bytes:,.0f} B",
            f"{b_bytes - a_bytes:+,.0f} B",
        )
    )
    for what, counts in (
        ("DynamoDB requests a step", {k: v[0] for k, v in dynamodb.items()}),
        ("DynamoDB write units a step", {k: v[1] for k, v in dynamodb.items()}),
    ):
        rows.append(
            (
                what,
                str(counts["without"]),
                str(counts["with"]),
                f"{counts['with'] - counts['without']:+d}",
            )
        )
    a_ops, b_ops = dynamodb["without"][2], dynamodb["with"][2]
    return "\n".join(
        [
            f"What a run's budget costs a step: the scripted agent, {steps} steps of a run "
            "without a budget and of one with, in turn, in one process (SQLite "
            f"{sqlite3.sqlite_version}, Python {sys.version.split()[0]}, {os.cpu_count()} "
            f"CPUs); DynamoDB: AwsRuntime on moto, step {BUDGET_DYNAMODB_STEPS}",
            "",
            *_table(rows, "<>>>"),
            "",
            f"DynamoDB requests at step {BUDGET_DYNAMODB_STEPS} without a budget: {a_ops}",
            f"                                   with one: {b_ops}",
            f"bench took {time.perf_counter() - started:.1f} s",
        ]
    )


def _dynamodb_step_cost(budget: Budget | None) -> tuple[int, int, str]:
    """Requests, write units and requests by operation of step `BUDGET_DYNAMODB_STEPS` of a
    scripted run on moto, as `bench.dynamodb_cost` counts them."""
    import boto3
    from moto import mock_aws

    from bench.dynamodb_cost import (
        LOG,
        REGION,
        SETTINGS,
        RequestMeter,
        StepCost,
        item_size,
        updated_keys,
    )
    from ratchet.runtime.aws import AwsRuntime
    from tests.dynamodb_support import create_tables

    with mock_aws():
        client = boto3.client("dynamodb", region_name=REGION)
        create_tables(
            client,
            checkpoints=SETTINGS.checkpoints_table,
            idempotency=SETTINGS.idempotency_table,
            app=SETTINGS.app_table,
        )
        runtime = AwsRuntime(SETTINGS, client)
        engine = runtime.engine(worker_id="bench", logger=LOG)
        state = new_scripted_run(RUN_ID, steps=BUDGET_DYNAMODB_STEPS + 5, max_steps=MAX_STEPS)
        engine.start(state.model_copy(update={"budget": budget}))
        meter = RequestMeter(client)
        for _ in range(BUDGET_DYNAMODB_STEPS - 1):
            engine.advance(RUN_ID)
        meter.take()
        engine.advance(RUN_ID)
        requests = meter.take()
        sizes = {}
        for table, key in updated_keys(requests):
            found = client.get_item(TableName=table, Key=json.loads(key), ConsistentRead=True)
            sizes[(table, key)] = item_size(found.get("Item", {}))
        cost = StepCost(BUDGET_DYNAMODB_STEPS, requests, sizes)
        ops = ", ".join(f"{op} {n}" for op, n in sorted(cost.by_operation().items()))
        return sum(cost.by_operation().values()), cost.write_units(), ops


POSTGRES_STEPS = 1_000
POSTGRES_WAL_AT = (10, 100, 500, 1_000)
POSTGRES_WAL_WINDOW = 10
"""What the last 10 steps up to each of `POSTGRES_WAL_AT` wrote to Postgres's WAL, a step: it
must not grow with the run."""


def postgres_comparison(
    directory: Path, steps: int = POSTGRES_STEPS, *, verbose: bool = False
) -> str:
    """`--compare-postgres`: the engine's time and the bytes a step writes, on a SQLite store
    and on a Postgres store (the tests' throwaway cluster, `fsync` off), the same run of the
    scripted agent on each, in this process. WAL bytes a step: the `WAL_STEPS` steps after the
    timed ones, SQLite's WAL emptied first and its size read after (`wal_bytes_per_step`),
    Postgres's insert position read before and after (the cluster serves nothing else).
    Round trips a step: what this process's psycopg connections sent over the first and the
    last `POSTGRES_WAL_WINDOW` of the timed steps (`bench.postgres_requests`); `verbose`
    lists them by statement."""
    from tests.postgres_support import cluster

    postgres = cluster()
    stores = {
        "sqlite": f"sqlite:///{directory / 'ratchet.db'}",
        "postgres": postgres.url(postgres.fresh_database()),
    }
    lines = [f"{steps:,} steps of the scripted agent, in this process", ""]
    lines.append(
        f"{'store':>9} {'engine ms p50':>13} {'p90':>6} {'step ms p50':>11} {'bytes':>6} "
        f"{'WAL bytes':>9}"
    )
    growth = ""
    round_trips: list[str] = []
    for label, url in stores.items():
        with BenchRun(directory, steps=steps + WAL_STEPS + 1, max_steps=MAX_STEPS, url=url) as run:
            if label == "postgres":
                timings, windows, sent = _postgres_steps(run, url, steps)
                round_trips = [
                    line for at, s in sent.items() for line in _round_trips(at, s, verbose=verbose)
                ]
                before = wal_position(url)
                run.advance_to(steps + WAL_STEPS)
                wal = (wal_position(url) - before) / WAL_STEPS
                growth = "Postgres WAL bytes a step as the run grows: " + ", ".join(
                    f"steps {at - POSTGRES_WAL_WINDOW + 1:,}-{at:,} {b:,.0f} B"
                    for at, b in windows.items()
                )
            else:
                timings = run.advance_to(steps)
                wal = run.wal_bytes_per_step()
            written = [
                c.size
                for c in run.runtime.store.list_checkpoints(RUN_ID)
                if c.event.kind == "step" and c.step <= steps
            ]
        engine = [t.engine.wall_ms for t in timings]
        whole = [t.whole.wall_ms for t in timings]
        lines.append(
            f"{label:>9} {_median(engine):>13.2f} {_p90(engine):>6.2f} "
            f"{_median(whole):>11.2f} {statistics.median(written):>6.0f} {wal:>9,.0f}"
        )
    lines += [
        "",
        "engine ms: a step's wall time less the tool's own; bytes: the commit's receipt (head, "
        "step record, ledger result), as the store's `bytes` column keeps it",
        f"WAL bytes: a step's, over steps {steps + 1:,}-{steps + WAL_STEPS:,} (SQLite: its WAL "
        "file, whole pages; Postgres: pg_current_wal_insert_lsn(), the cluster's records)",
        growth,
        *round_trips,
        "round trips: every request this process's psycopg connections sent the server, each "
        "answered before the next: the statements, each transaction's BEGIN and COMMIT (sent as "
        "statements of their own), and psycopg's prepare of a statement it has sent often on "
        "the connection; "
        "transactions: BEGINs, and statements sent outside a transaction (autocommit)",
    ]
    return "\n".join(lines)


def _postgres_steps(
    run: BenchRun, url: str, steps: int
) -> tuple[list[StepTiming], dict[int, float], dict[int, Requests]]:
    """`steps` steps, timed; what the last `POSTGRES_WAL_WINDOW` steps up to each of
    `POSTGRES_WAL_AT` wrote to the WAL, a step (the positions read between steps, outside
    their times); and what the first and the last `POSTGRES_WAL_WINDOW` steps sent to the
    server (`bench.postgres_requests`), by the step that ends each."""
    marks = {at - POSTGRES_WAL_WINDOW for at in POSTGRES_WAL_AT} | set(POSTGRES_WAL_AT)
    first, last = POSTGRES_WAL_WINDOW, steps
    counted = {first, last - POSTGRES_WAL_WINDOW, last}
    at = run.step
    with PostgresRequests() as meter:
        with meter.paused():
            positions = {at: wal_position(url)}
        taken = {at: meter.take()}

        def between(step: int) -> None:
            if step in counted:
                taken[step] = meter.take()
            if step in marks:
                with meter.paused():
                    positions[step] = wal_position(url)

        timings = run.advance_to(steps, between=between, start=at)
    windows = {
        at: (positions[at] - positions[at - POSTGRES_WAL_WINDOW]) / POSTGRES_WAL_WINDOW
        for at in POSTGRES_WAL_AT
        if at <= steps
    }
    requests = {at: taken[at] - taken[at - POSTGRES_WAL_WINDOW] for at in (first, last)}
    return timings, windows, requests


def _round_trips(at: int, sent: Requests, *, verbose: bool) -> list[str]:
    """What the `POSTGRES_WAL_WINDOW` steps ending at step `at` sent, a step."""
    n = POSTGRES_WAL_WINDOW
    lines = [
        f"Postgres round trips a step, steps {at - n + 1:,}-{at:,}: {sent.round_trips / n:g} "
        f"({sent.transactions / n:g} transactions, {sent.prepares / n:g} prepares)"
    ]
    if verbose:
        lines += [
            f"  {count / n:>5g}  {kind}"
            for kind, count in sorted(sent.by_kind.items(), key=lambda item: (-item[1], item[0]))
        ]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="What one Ratchet step costs.")
    parser.add_argument(
        "--resume-one",
        metavar="STORE_URL",
        help="used by the bench: take one step of its run in this fresh process",
    )
    parser.add_argument(
        "--payload-key",
        metavar="SETTING",
        help="seal what the run stores, as RATCHET_PAYLOAD_KEY does (local, file:PATH, kms:...)",
    )
    parser.add_argument(
        "--compare-codec",
        metavar="SETTING",
        help="run the bench twice, the codec off then on (a RATCHET_PAYLOAD_KEY value), and "
        "print the two side by side",
    )
    parser.add_argument(
        "--compare-budget",
        action="store_true",
        help="what a run's budget costs a step: engine time, records and bytes without a "
        "budget and with one, side by side, and DynamoDB requests and write units (moto)",
    )
    parser.add_argument(
        "--compare-postgres",
        action="store_true",
        help="engine ms and bytes per step on a SQLite store and on a Postgres store (the "
        "tests' throwaway cluster), side by side",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="with --compare-postgres: the round trips a Postgres step sends, by statement",
    )
    args = parser.parse_args(argv)
    if args.compare_postgres:
        with tempfile.TemporaryDirectory(prefix="ratchet-bench-") as directory:
            print(postgres_comparison(Path(directory), verbose=args.verbose))
        return
    if args.compare_budget:
        with tempfile.TemporaryDirectory(prefix="ratchet-bench-") as directory:
            (Path(directory) / "without").mkdir()
            (Path(directory) / "with").mkdir()
            print(budget_comparison(Path(directory)))
        return
    if args.compare_codec:
        with tempfile.TemporaryDirectory(prefix="ratchet-bench-") as directory:
            (Path(directory) / "off").mkdir()
            (Path(directory) / "on").mkdir()
            os.environ.pop("RATCHET_PAYLOAD_KEY", None)
            off = measure(Path(directory) / "off")
            os.environ["RATCHET_PAYLOAD_KEY"] = args.compare_codec
            on = measure(Path(directory) / "on")
        print(codec_comparison(off, on, args.compare_codec))
        return
    if args.payload_key:
        os.environ["RATCHET_PAYLOAD_KEY"] = args.payload_key
    if args.resume_one:
        _resume_one(args.resume_one)
        return
    with tempfile.TemporaryDirectory(prefix="ratchet-bench-") as directory:
        figures = measure(Path(directory))
    print(report(figures))


if __name__ == "__main__":
    main()
