"""The stack, synthesized once per test session (per xdist worker) for the infra tests."""

from __future__ import annotations

import pytest

from tests.infra.synth import Synthesized, synthesize


@pytest.fixture(scope="session")
def synthesized() -> Synthesized:
    return synthesize()
