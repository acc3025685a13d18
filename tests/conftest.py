"""What every test shares: no test may leave a fault plan in this process's environment."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.postgres_support import Cluster, cluster


@pytest.fixture(autouse=True)
def _no_fault_plan_outlives_its_test() -> Iterator[None]:
    """A `RATCHET_FAULT` put in `os.environ` by hand (not through monkeypatch) would crash the
    steps of every later test in the same worker process, far from the test that set it."""
    before = os.environ.get("RATCHET_FAULT")
    yield
    after = os.environ.get("RATCHET_FAULT")
    assert after == before, f"the test left RATCHET_FAULT={after!r} in the environment"


@pytest.fixture(scope="session")
def postgres() -> Cluster:
    """This test process's throwaway Postgres cluster (tests/postgres_support.py), started on
    first use and stopped when the process ends; skipped only where no server is installed."""
    return cluster()
