"""`AwsRuntime`, the wiring the step Lambda uses: blobs in S3 (or a clear error without a
bucket), what an agent is offered, and the model it is bound to."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from pydantic import BaseModel, SecretStr

from ratchet.adapters.anthropic_model import AnthropicModel
from ratchet.adapters.s3_blobs import S3BlobStore
from ratchet.engine import Outcome
from ratchet.errors import InvalidInput, StepAttemptFailed
from ratchet.runtime.aws import AwsRuntime
from ratchet.state import RunOptions, RunState, RunStatus
from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, tool
from tests.dynamodb_support import REGION, SETTINGS, moto_tables
from tests.support import LOG

BUCKET = "ratchet-blobs-test"
BIG_OUTPUT = "row\n" * 5_000


class NoArgs(BaseModel):
    pass


@tool()
def dump(args: NoArgs, ctx: ToolContext) -> str:
    """Return a large report."""
    return BIG_OUTPUT


def _dump_once(view: StepView) -> ToolCall | Done:
    return Done(summary="dumped") if view.messages else ToolCall(name="dump")


big_output_agent = Agent(name="big-output", tools=[dump], policy=_dump_once)
AGENT_REF = f"{__name__}:big_output_agent"


@pytest.fixture
def client() -> Iterator[Any]:
    with moto_tables() as client:
        yield client


def started(runtime: AwsRuntime, run_id: str = "b1", model: str = "scripted") -> RunState:
    state = RunState(run_id=run_id, agent=AGENT_REF, goal="g", options=RunOptions(model=model))
    assert runtime.engine(worker_id="api", logger=LOG).start(state)
    return state


def test_a_large_output_goes_to_the_blob_bucket_and_the_state_keeps_a_reference(client):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    runtime = AwsRuntime(SETTINGS.model_copy(update={"blob_bucket": BUCKET}), client, s3=s3)
    started(runtime)
    engine = runtime.engine(worker_id="step", logger=LOG)

    assert engine.advance("b1").outcome is Outcome.CONTINUE

    (output,) = engine.load("b1").tool_results
    assert output.blob is not None
    assert isinstance(runtime.blobs, S3BlobStore)
    assert runtime.blobs.get(output.blob) == BIG_OUTPUT.encode()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == [f"blobs/{output.blob.sha256}"]


def test_without_a_bucket_a_large_output_fails_the_attempt_saying_what_to_configure(client):
    runtime = AwsRuntime(SETTINGS, client)
    started(runtime)
    engine = runtime.engine(worker_id="step", logger=LOG)

    for _attempt in (1, 2):
        with pytest.raises(StepAttemptFailed, match="RATCHET_BLOB_BUCKET"):
            engine.advance("b1")
    final = engine.advance("b1")  # the third failed attempt fails the run

    assert final.outcome is Outcome.FAILED
    state = engine.load("b1")
    assert state.status is RunStatus.FAILED
    assert "RATCHET_BLOB_BUCKET" in (state.error or "")


def test_the_agent_is_offered_the_app_table_and_only_scratch_space_on_disk(client):
    runtime = AwsRuntime(SETTINGS, client)

    context = runtime.context("b1", RunOptions())

    assert context.services == {"dynamodb": client, "app_table": SETTINGS.app_table}
    assert context.workdir.is_relative_to("/tmp")
    assert not context.workdir.exists()


def test_a_run_is_bound_once_per_container(client):
    runtime = AwsRuntime(SETTINGS, client)
    state = started(runtime)

    first, again = runtime.bind(state), runtime.bind(state)

    assert first is again
    assert first.agent is big_output_agent


def test_a_claude_run_needs_the_key_the_handler_supplies(client):
    without_key = AwsRuntime(SETTINGS, client)
    with_key = AwsRuntime(SETTINGS, client, anthropic_api_key=SecretStr("sk-test"))
    state = started(without_key, model="claude-sonnet-4-5")

    with pytest.raises(InvalidInput, match="ANTHROPIC_API_KEY"):
        without_key.bind(state)
    assert isinstance(with_key.bind(state).model, AnthropicModel)
