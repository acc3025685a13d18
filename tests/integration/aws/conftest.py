from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.aws.harness import Stack, deployed


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    with deployed(monkeypatch) as running:
        yield running
