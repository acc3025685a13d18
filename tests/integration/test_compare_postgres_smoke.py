"""`python -m bench.compare --postgres` and `bench.step_cost --compare-postgres` at a small
scale, on the tests' throwaway cluster, so that they cannot rot between runs: the Ratchet side
always, DBOS's only where the `compare` extra is installed. Who is faster is not asserted; that
both sides ran and were measured is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.compare import MODULES, compare_on_postgres, main, postgres_report
from bench.scripted_agent import ARGUMENT_BYTES, RESULT_BYTES
from bench.step_cost import postgres_comparison
from tests.postgres_support import cluster

SHORT, LONG = 10, 60
MAX_WAL_GROWTH = 1.5
"""What a step writes to the WAL at step 60 over what it wrote at step 10: the same rows a
step, so about 1.0x (measured 1.01x to 1.15x on a shared machine); a step that rewrote what
the run holds would be several times this."""


def _needs_dbos() -> None:
    for module in MODULES["dbos"]:
        pytest.importorskip(module, reason="the compare extra is not installed")


def test_a_ratchet_step_on_postgres_is_measured_and_its_wal_does_not_grow_with_the_run() -> None:
    result = compare_on_postgres(cluster(), [SHORT, LONG], ["ratchet"])

    short, long = result.runs["ratchet"][SHORT], result.runs["ratchet"][LONG]
    assert [len(short.step_ms), len(long.step_ms)] == [SHORT, LONG]
    assert min(short.step_ms + long.step_ms) > 0
    for run in (short, long):
        # The step's call and its result are in what it wrote, once at least.
        assert run.wal_per_step() >= ARGUMENT_BYTES + RESULT_BYTES
        # The last steps' WAL leaves out the run's creation; the whole run's has it.
        assert 0 < run.window_wal_bytes < run.wal_bytes
        assert run.table_bytes["public.checkpoints"] > 0
    print(
        f"Ratchet on Postgres: WAL a step, steps 1-{SHORT} {short.window_wal_per_step():,.0f} B, "
        f"steps {LONG - 9}-{LONG} {long.window_wal_per_step():,.0f} B; median ms "
        f"{sorted(short.step_ms)[SHORT // 2]:.2f} and {sorted(long.step_ms)[LONG // 2]:.2f}"
    )
    assert long.window_wal_per_step() <= MAX_WAL_GROWTH * short.window_wal_per_step()
    text = postgres_report(result)
    assert f"WAL bytes a step, steps {LONG - 9}-{LONG}" in text
    assert "table bytes a step, steps 10-60" in text
    assert "What a Ratchet step writes to the WAL as its run grows" in text


def test_dbos_runs_beside_ratchet_with_its_system_database_on_the_same_cluster() -> None:
    _needs_dbos()

    result = compare_on_postgres(cluster(), [3], ["ratchet", "dbos"])

    assert result.missing == []
    for framework in ("ratchet", "dbos"):
        run = result.runs[framework][3]
        assert len(run.step_ms) == 3
        assert run.wal_per_step() >= ARGUMENT_BYTES + RESULT_BYTES
        print(f"{framework}: {run.wal_per_step():,.0f} WAL bytes a step, {run.step_ms} ms")
    # DBOS kept its steps in its system database on the cluster, where they were counted.
    assert result.runs["dbos"][3].table_bytes["dbos.operation_outputs"] > 0
    header, median = postgres_report(result).splitlines()[5:7]
    assert header.split()[1:] == ["Ratchet", "DBOS"]
    assert median.startswith("ms a step, median, 3 steps")
    assert median.count("ms (") == 2


def test_a_server_given_by_its_url_takes_the_runs_databases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--postgres", cluster().url(), "--steps", "3"])

    printed = capsys.readouterr().out
    assert "ms a step, median, 3 steps" in printed
    assert "WAL bytes a step, steps 1-3" in printed
    assert "Ratchet" in printed.splitlines()[5]


def test_step_cost_prints_wal_bytes_a_step_on_both_stores(tmp_path: Path) -> None:
    text = postgres_comparison(tmp_path, steps=10)

    print(text)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[3:5]}
    assert set(rows) == {"sqlite", "postgres"}
    for cells in rows.values():
        assert int(cells[-1].replace(",", "")) >= ARGUMENT_BYTES + RESULT_BYTES
    assert "Postgres WAL bytes a step as the run grows: steps 1-10 " in text


ROUND_TRIP_STEPS = 30
ROUND_TRIPS = re.compile(
    r"Postgres round trips a step, steps (\d+)-(\d+): ([\d.]+) \(([\d.]+) transactions, "
    r"([\d.]+) prepares\)"
)


def test_step_cost_counts_a_postgres_steps_round_trips_and_they_do_not_grow(
    tmp_path: Path,
) -> None:
    text = postgres_comparison(tmp_path, steps=ROUND_TRIP_STEPS, verbose=True)

    print(text)
    figures = {
        (int(first), int(last)): (float(trips), float(transactions), float(prepares))
        for first, last, trips, transactions, prepares in ROUND_TRIPS.findall(text)
    }
    assert list(figures) == [(1, 10), (ROUND_TRIP_STEPS - 9, ROUND_TRIP_STEPS)]
    (start, _, start_prepares), (trips, transactions, prepares) = figures.values()
    # A transaction sends a statement at least, and one begun sends its BEGIN and COMMIT
    # besides, each a round trip: a transaction counts once, not once a statement.
    assert transactions >= 1
    assert trips > transactions
    # By the last steps every statement is prepared on the one connection, and each step
    # sends the same: no fraction of a round trip.
    assert prepares == 0
    assert trips == int(trips)
    # The first 10 steps send what the last 10 do, and psycopg's prepares besides, but for
    # step 1's read of its window's records (a run at step 0 has none to read): what a step
    # sends does not grow with its run.
    assert round(10 * (start - start_prepares)) == round(10 * trips) - 1
    # `verbose` lists them by statement.
    for kind in ("BEGIN", "COMMIT", "SELECT checkpoints"):
        assert f"  {kind}\n" in text
