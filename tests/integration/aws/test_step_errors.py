"""The step handler speaks the state machine's error vocabulary at its boundary."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from ratchet.aws.payloads import StepRequest
from ratchet.errors import StoreBusy
from ratchet.handlers import step


class _Refusing:
    def __init__(self, error: Exception) -> None:
        self._error = error

    def advance(self, run_id: str) -> Any:
        raise self._error


def _client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "no"}}, "TransactWriteItems")


def _take_step(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    monkeypatch.setattr(step, "engine", lambda context: _Refusing(error))
    step.take_step(StepRequest(run_id="r"), SimpleNamespace())  # type: ignore[arg-type]


def test_a_throttled_store_becomes_store_busy_which_the_state_machine_retries(monkeypatch):
    with pytest.raises(StoreBusy, match="ProvisionedThroughputExceededException"):
        _take_step(monkeypatch, _client_error("ProvisionedThroughputExceededException"))


def test_a_store_error_that_retrying_cannot_fix_is_left_as_it_is(monkeypatch):
    with pytest.raises(ClientError, match="AccessDeniedException"):
        _take_step(monkeypatch, _client_error("AccessDeniedException"))
