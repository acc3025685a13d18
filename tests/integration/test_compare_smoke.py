"""`make compare`'s measuring code at a small scale, so that it cannot rot between runs: the
Ratchet part always, LangGraph and DBOS only where the `compare` extra is installed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from bench.compare import (
    MODULES,
    RUN_ID,
    compare,
    counting_sqlite_writes,
    measure_resume,
    measure_run,
    report,
    run_ratchet,
)
from bench.scripted_agent import ARGUMENT_BYTES, RESULT_BYTES, arguments_for, result_for
from ratchet.runtime.local import LocalRuntime, LocalSettings

STEPS = 5


def test_each_step_of_the_script_calls_with_200_bytes_and_gets_1_kb() -> None:
    for step in (1, 999, 10_000):
        arguments = arguments_for(step)

        assert len(json.dumps(arguments, separators=(",", ":"))) == ARGUMENT_BYTES
        assert len(result_for(arguments).encode("utf-8")) == RESULT_BYTES
    assert arguments_for(7) == arguments_for(7) != arguments_for(8)


def test_only_transactions_that_wrote_count_as_commits(tmp_path: Path) -> None:
    with counting_sqlite_writes() as tally:
        connection = sqlite3.connect(tmp_path / "probe.db", isolation_level=None)
        connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
        before = (tally.row_bytes, tally.commits)
        connection.execute("BEGIN")
        connection.execute("SELECT * FROM t").fetchall()
        connection.execute("COMMIT")
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("INSERT INTO t (id, body) VALUES (?, ?)", (1, "héllo"))
        connection.execute("COMMIT")
        connection.close()

    assert (tally.row_bytes - before[0], tally.commits - before[1]) == (8 + 6, 1)
    assert sqlite3.connect(":memory:").__class__ is sqlite3.Connection  # restored


def test_a_ratchet_run_is_measured_through_the_engine(tmp_path: Path) -> None:
    with counting_sqlite_writes():
        figures = run_ratchet(tmp_path, STEPS)

    assert figures.steps == STEPS
    assert figures.wall_ms > 0
    # The decision is durable before the tool runs, then the step: two commits a step at least.
    assert figures.commits >= 2 * STEPS
    # Every step hands SQLite its arguments and its result at least once.
    assert figures.row_bytes >= STEPS * (ARGUMENT_BYTES + RESULT_BYTES)
    assert (figures.journal_mode, figures.synchronous) == ("wal", 2)


def test_a_fresh_process_resumes_the_ratchet_run_by_one_step(tmp_path: Path) -> None:
    measure_run("ratchet", STEPS, tmp_path)

    sample = measure_resume("ratchet", tmp_path, STEPS)

    assert sample["ms"] > 0
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path / 'compare.sqlite'}"))
    try:
        head = runtime.store.load_head(RUN_ID)
        assert head is not None
        assert head.step == STEPS + 1
    finally:
        runtime.close()


def test_the_report_counts_against_ratchet(tmp_path: Path) -> None:
    result = compare(tmp_path, [3], frameworks=["ratchet"])

    text = report(result)

    assert "ms per step, 3 steps" in text
    assert "(1.00x)" in text
    assert "resume after 3 steps" in text
    assert [s["ms"] > 0 for s in result.resumes["ratchet"]] == [True, True, True]


@pytest.mark.parametrize("framework", ["langgraph", "dbos"])
def test_the_other_frameworks_run_and_resume(framework: str, tmp_path: Path) -> None:
    for module in MODULES[framework]:
        pytest.importorskip(module, reason="the compare extra is not installed")

    figures = measure_run(framework, 3, tmp_path)
    sample = measure_resume(framework, tmp_path, 3)

    assert figures.commits >= 3
    assert figures.row_bytes >= 3 * (ARGUMENT_BYTES + RESULT_BYTES)
    assert figures.synchronous == 2
    assert sample["ms"] > 0
