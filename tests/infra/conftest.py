"""The stack, synthesized once per test session (per xdist worker) for the infra tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.infra.synth import (
    CONFIGURED,
    EXAMPLE_PROJECT,
    Synthesized,
    UserApp,
    synthesize,
    synthesize_user_app,
)

VARIANTS: dict[str, Callable[[], Synthesized]] = {
    "default": lambda: synthesize(),
    "configured": lambda: synthesize(context=CONFIGURED),
    "project": lambda: synthesize(context={"ratchet:project": str(EXAMPLE_PROJECT)}),
}
"""The templates the session fixtures hold, by name (`tests/infra/fingerprints/<name>.json`)."""


@pytest.fixture(scope="session")
def synthesized() -> Synthesized:
    """With none of the optional context: what a new user deploys first."""
    return VARIANTS["default"]()


@pytest.fixture(scope="session")
def configured() -> Synthesized:
    """With every optional context key: Claude, Slack, SES, defaults, agents, a custom URL."""
    return VARIANTS["configured"]()


@pytest.fixture(scope="session")
def with_project() -> Synthesized:
    """With the billing example's project: its agent, secret, environment and permission."""
    return VARIANTS["project"]()


@pytest.fixture(scope="session")
def user_app(tmp_path_factory: pytest.TempPathFactory) -> UserApp:
    """A user's own project and CDK app, outside this repository, synthesized with the
    construct alone (`ratchet.cdk`)."""
    return synthesize_user_app(tmp_path_factory.mktemp("user-app"))
