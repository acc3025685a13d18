"""The step handler speaks the state machine's error vocabulary at its boundary, and leaves
naming the store's failures to the adapters."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ratchet.errors import AbandonedCallRunning, StaleVersion, StoreBusy, ToolFailed
from ratchet.handlers import step
from ratchet.handlers.payloads import StepRequest
from ratchet.runtime.aws_settings import AwsSettings

PACKAGE = Path(step.__file__).resolve().parents[1]
ABOVE_THE_ADAPTERS = sorted([*PACKAGE.glob("handlers/*.py"), *PACKAGE.glob("engine/*.py")])


class _Refusing:
    def __init__(self, error: Exception) -> None:
        self._error = error

    def advance(self, run_id: str, **_: Any) -> Any:
        raise self._error

    def release(self, run_id: str) -> None:
        pass


def _take_step(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    monkeypatch.setattr(step, "engine", lambda context: _Refusing(error))
    settings = AwsSettings(checkpoints_table="ckp", idempotency_table="idm", app_table="app")
    monkeypatch.setattr(step, "settings", lambda: settings)
    step.take_step(StepRequest(run_id="r"), SimpleNamespace())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error",
    [
        StoreBusy("DynamoDB table t is busy (ThrottlingException); try again"),
        StaleVersion("r", 3),
        ToolFailed("write_row raised RuntimeError: the disk is full"),
        RuntimeError("a bug"),
    ],
    ids=lambda error: type(error).__name__,
)
@pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")
def test_an_error_leaves_the_handler_under_its_own_name_for_the_state_machine(
    monkeypatch: pytest.MonkeyPatch, error: Exception
):
    with pytest.raises(type(error)) as raised:
        _take_step(monkeypatch, error)

    assert raised.value is error


class _Ended(Exception):
    pass


@pytest.mark.filterwarnings("ignore:No application metrics:UserWarning")
def test_a_run_that_strikes_out_beside_its_abandoned_call_ends_the_sandbox(
    monkeypatch: pytest.MonkeyPatch,
):
    # A frozen sandbox would thaw the abandoned call at its next invocation, after the run
    # was failed: ending the process ends the call, and a new sandbox fails the run.
    def end_sandbox() -> None:
        raise _Ended

    monkeypatch.setattr(step, "end_sandbox", end_sandbox)

    with pytest.raises(_Ended):
        _take_step(monkeypatch, AbandonedCallRunning("r", 1, 30))


@pytest.mark.parametrize("source", ABOVE_THE_ADAPTERS, ids=lambda path: path.name)
def test_nothing_above_the_adapters_inspects_botocore_errors(source: Path):
    tree = ast.parse(source.read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}

    assert "botocore.exceptions" not in imported
    assert not names & {"ClientError", "BotoCoreError"}
