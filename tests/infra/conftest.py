"""The stack, synthesized once per test session (per xdist worker) for the infra tests."""

from __future__ import annotations

import pytest

from tests.infra.synth import CONFIGURED, Synthesized, synthesize


@pytest.fixture(scope="session")
def synthesized() -> Synthesized:
    """With none of the optional context: what a new user deploys first."""
    return synthesize()


@pytest.fixture(scope="session")
def configured() -> Synthesized:
    """With every optional context key: Claude, Slack, SES, defaults, agents, a custom URL."""
    return synthesize(context=CONFIGURED)
