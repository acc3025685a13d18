"""The step-cost bench's measuring code at a small scale, and the guarantee it reports: what a
step writes does not grow with the run's length."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.step_cost import (
    MAX_STEP_BYTES,
    MAX_WAL_BYTES,
    RUN_ID,
    BenchRun,
    StepTiming,
    resume_in_fresh_process,
)
from ratchet.stored import head_json

GROWTH_MARGIN_BYTES = 64
"""Step 50 writes wider numbers than step 10 (versions, steps and keys): a few bytes. A state
that kept every message would add about 7 KB by step 50."""


@pytest.fixture(scope="module")
def fifty_steps(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[BenchRun, list[StepTiming]]]:
    with BenchRun(tmp_path_factory.mktemp("bench"), steps=90, max_steps=90) as run:
        yield run, run.advance_to(50)


def test_what_a_step_writes_does_not_grow_with_the_run(
    fifty_steps: tuple[BenchRun, list[StepTiming]],
) -> None:
    run, _ = fifty_steps

    early, late = run.step_bytes(10), run.step_bytes(50)

    assert early.total <= MAX_STEP_BYTES
    assert late.total <= MAX_STEP_BYTES
    assert abs(late.total - early.total) <= GROWTH_MARGIN_BYTES, (early, late)
    # The figure counts the head that step 50 rewrote (the part that changes: see
    # ratchet.stored), not just its step record.
    head = run.engine.load(RUN_ID)
    assert head.step == 50
    assert late.receipt > len(head_json(head).encode("utf-8"))
    assert late.ledger_decision > 0


def test_a_step_appends_at_most_16_kib_to_the_wal(
    fifty_steps: tuple[BenchRun, list[StepTiming]],
) -> None:
    run, _ = fifty_steps

    assert run.wal_bytes_per_step() <= MAX_WAL_BYTES


def test_the_bench_times_the_tool_apart_from_the_engine(
    fifty_steps: tuple[BenchRun, list[StepTiming]],
) -> None:
    _, timings = fifty_steps

    assert [t.step for t in timings] == list(range(1, 51))
    for timing in timings:
        assert 0 < timing.tool.wall_ms < timing.whole.wall_ms
        assert timing.engine.wall_ms > 0


def test_a_fresh_process_resumes_the_run_and_takes_exactly_one_step(tmp_path: Path) -> None:
    with BenchRun(tmp_path, steps=5, max_steps=10) as run:
        run.advance_to(2)

        sample = resume_in_fresh_process(run.url)

        assert sample.from_step == 2
        assert run.step == 3
        assert sample.total_ms > sample.tool_ms > 0


def test_the_follow_bench_reads_only_what_was_written_since() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.follow_cost", "--steps", "5,20", "--reads", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )

    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    # created, a record a step, finished
    assert [(row[0], row[1]) for row in rows] == [("5", "7"), ("20", "22")]
    assert all(row[-1].endswith("x") for row in rows)


def test_the_waits_bench_prints_its_figures_and_the_sweep_reads_no_heads() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.waits", "--runs", "20"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = done.stdout
    assert "settled" in out
    assert "20 runs waiting for events" in out
    assert "send_event" in out
