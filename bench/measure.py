"""What the benches measure with: a sink for the checkpoint log, this process's bytes handed
to write(2), a Postgres cluster's WAL position, and the median time of an action repeated."""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path


class _Discard(io.StringIO):
    """The checkpoint log is formatted as a worker formats it, then dropped."""

    def write(self, text: str, /) -> int:
        return len(text)


DISCARD = _Discard()


def bytes_written_by_process() -> int:
    """Bytes this process has handed to write(2) so far (Linux), or 0 where unknown."""
    try:
        with open("/proc/self/io", "rb") as counters:
            for line in counters:
                if line.startswith(b"wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


WRITES_KNOWN = Path("/proc/self/io").exists()


def wal_position(url: str) -> int:
    """The WAL insert position of the Postgres cluster `url` is in, in bytes: what every
    database of the cluster has written to its WAL so far. The insert position, not
    `pg_current_wal_lsn()`, the write position: with `synchronous_commit` off (the tests'
    cluster) a commit returns before its WAL is written out, and the write position lags it.
    Reading it writes no WAL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        ).fetchone()
    assert row is not None
    return int(row[0])


def median_seconds(action: Callable[[], object], *, times: int) -> float:
    """The median wall time of `action`, done `times` times in a row."""
    taken = []
    for _ in range(times):
        started = time.perf_counter()
        action()
        taken.append(time.perf_counter() - started)
    return statistics.median(taken)
