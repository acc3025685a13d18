"""What SQLite syncs as it commits: every write but an attempt's count, and the count never
leaves its setting behind. A count committed without a sync is in the WAL, which no process's
death loses (tests/e2e/test_sigkill.py kills workers right after it); the step's next commit,
the decision's, syncs it with everything else before the tool runs."""

from __future__ import annotations

import pytest

from ratchet.errors import StaleVersion
from ratchet.runtime.local import LocalRuntime, LocalSettings
from tests.conformance.test_store_contract import new_run

FULL = 2


@pytest.fixture
def runtime(tmp_path):
    opened = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/s.db"))
    yield opened
    opened.close()


def _synchronous(runtime: LocalRuntime) -> int:
    (level,) = runtime.db.connection.execute("PRAGMA synchronous").fetchone()
    return int(level)


def test_counting_an_attempt_leaves_every_later_write_synced(runtime):
    state, checkpoint = new_run()
    runtime.store.create_run(state, checkpoint)
    assert _synchronous(runtime) == FULL

    runtime.store.begin_attempt("r1", 1)
    assert _synchronous(runtime) == FULL
    runtime.store.release_attempt("r1", 2)
    assert _synchronous(runtime) == FULL


def test_a_count_refused_as_stale_leaves_every_later_write_synced(runtime):
    state, checkpoint = new_run()
    runtime.store.create_run(state, checkpoint)
    runtime.store.begin_attempt("r1", 1)

    with pytest.raises(StaleVersion):
        runtime.store.begin_attempt("r1", 1)
    with pytest.raises(StaleVersion):
        runtime.store.release_attempt("r1", 1)

    assert _synchronous(runtime) == FULL
