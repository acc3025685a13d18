from __future__ import annotations

import importlib
import io
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet.handlers import (
    _wiring,
    api,
    approvals,
    decide,
    mark_failed,
    notify,
    open_wait,
    record_wait,
    step,
)
from tests.fake_slack import FakeSlack
from tests.integration.aws.harness import Stack, assert_no_token_in, deployed


class _Stdout(io.TextIOBase):
    """Whatever `sys.stdout` is at the moment of writing (pytest swaps it at every phase)."""

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> Iterator[Stack]:
    """The stack on moto. When the test is over, no task token the state machine handed out
    may appear in anything the test made the stack produce: log lines, pages and their URLs
    and headers, emails, Slack messages."""
    handler = _wiring.logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    # Powertools' handler keeps the stream it found when the handlers were imported (pytest's
    # capture of collection); point it at the test's stdout, which capfd reads.
    previous = handler.setStream(_Stdout())
    try:
        with deployed(monkeypatch) as running:
            yield running
        tokens = running.tokens()
        if tokens:
            logged = capfd.readouterr()
            assert '"level":"INFO"' in logged.out, "the handlers' log lines were not captured"
            assert_no_token_in([logged.out, logged.err, *running.everything_produced()], tokens)
    finally:
        handler.setStream(previous)


@pytest.fixture
def slack(stack: Stack, tmp_path: Path) -> Iterator[FakeSlack]:
    """Slack, wired into the stack: runs that park are posted to its #approvals channel."""
    with FakeSlack(tmp_path) as fake:
        stack.use_slack(fake)
        yield fake


LOG_EVENT = "POWERTOOLS_LOGGER_LOG_EVENT"


def _import_handlers_anew() -> None:
    for module in (step, notify, decide, mark_failed, api, approvals, open_wait, record_wait):
        importlib.reload(module)


@pytest.fixture
def events_logged(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every handler logs each event it is invoked with, as a user debugging a deployment
    turns on (`POWERTOOLS_LOGGER_LOG_EVENT=true`). Powertools reads the variable when it
    decorates a handler, so the handlers are imported anew under it (and again without it
    afterwards). Ask for it before `stack`, which deploys the handlers it finds."""
    monkeypatch.setenv(LOG_EVENT, "true")
    _import_handlers_anew()
    try:
        yield
    finally:
        monkeypatch.delenv(LOG_EVENT)
        _import_handlers_anew()
