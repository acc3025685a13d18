"""Claude on Amazon Bedrock (`bedrock:<model id>`): the SDK's `AnthropicBedrock` client, signed
with IAM credentials, against the local fake endpoint: the request it sends, the usage it
reports and the retries it makes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from ratchet.adapters.anthropic_model import AnthropicModel, bedrock_client
from ratchet.errors import ModelUnavailable, StepAttemptFailed, is_terminal
from ratchet.ports import ModelRequest, StepView, ToolSpec
from ratchet.runtime.models import build_model
from ratchet.state import ToolCall, Usage
from ratchet.tools import Agent, ToolContext, tool
from tests.integration.fake_messages_api import (
    FakeClock,
    FakeMessagesApi,
    error_response,
    tool_use_response,
)

MODEL_ID = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
ACCESS_KEY = "AKIDEXAMPLETEST"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
REGION = "eu-west-1"
INSTRUCTIONS = "You keep a tidy notebook."
PROMPT = "<goal>Write one note</goal>\nDecide the single next step."
WRITE_NOTE = ToolSpec(
    name="write_note",
    description="Write one note.",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
)
REQUEST = ModelRequest(
    prompt=PROMPT,
    tools=[WRITE_NOTE],
    view=StepView(run_id="r", goal="Write one note", step=1),
    instructions=INSTRUCTIONS,
    max_tokens=256,
    retry_seconds=30,
)


@pytest.fixture(autouse=True)
def aws_test_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")


@pytest.fixture
def api() -> Iterator[FakeMessagesApi]:
    with FakeMessagesApi() as fake:
        yield fake


def test_the_request_is_signed_with_sigv4_and_posted_to_invoke_without_a_model_field(api):
    api.enqueue(
        tool_use_response(
            "write_note",
            {"text": "hello"},
            usage={"input_tokens": 30, "cache_read_input_tokens": 700, "output_tokens": 9},
        )
    )
    clock = FakeClock()

    reply = AnthropicModel(
        bedrock_client(base_url=api.url), MODEL_ID, pacing=clock.pacing()
    ).decide(REQUEST)

    assert reply.decision == ToolCall(name="write_note", arguments={"text": "hello"})
    assert reply.usage == Usage(input_tokens=30, output_tokens=9, cache_read_tokens=700, calls=1)
    [sent] = api.requests
    assert sent.path == f"/model/{MODEL_ID}/invoke"
    authorization = sent.headers["authorization"]
    assert authorization.startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")
    assert f"/{REGION}/bedrock/aws4_request" in authorization
    assert "x-amz-date" in sent.headers
    assert SECRET_KEY not in str(sent.headers)
    body = sent.body
    assert body is not None
    assert "model" not in body
    assert body["anthropic_version"]
    assert body["max_tokens"] == 256
    assert body["messages"] == [{"role": "user", "content": PROMPT}]
    assert body["system"] == [
        {"type": "text", "text": INSTRUCTIONS, "cache_control": {"type": "ephemeral"}}
    ]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}


def test_a_throttled_request_is_retried_after_its_retry_after(api):
    api.enqueue(
        error_response(
            429, "ThrottlingException", "Too many requests", headers={"retry-after": "3"}
        ),
        tool_use_response("write_note", {"text": "hello"}),
    )
    clock = FakeClock()

    reply = AnthropicModel(
        bedrock_client(base_url=api.url), MODEL_ID, pacing=clock.pacing()
    ).decide(REQUEST)

    assert reply.decision == ToolCall(name="write_note", arguments={"text": "hello"})
    assert clock.slept == [3.0]
    assert len(api.requests) == 2


def test_access_denied_is_permanent_and_says_to_check_the_grant(api):
    api.enqueue(error_response(403, "AccessDeniedException", "not authorized to InvokeModel"))

    with pytest.raises(StepAttemptFailed) as caught:
        AnthropicModel(
            bedrock_client(base_url=api.url), MODEL_ID, pacing=FakeClock().pacing()
        ).decide(REQUEST)

    assert isinstance(caught.value, ModelUnavailable)
    assert is_terminal(caught.value)
    assert "Amazon Bedrock rejected the request as a client error (HTTP 403" in str(caught.value)
    assert "bedrock:InvokeModel" in str(caught.value)
    assert SECRET_KEY not in str(caught.value)
    assert len(api.requests) == 1


def test_the_endpoint_is_the_regions_and_never_taken_from_the_environment(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BEDROCK_BASE_URL", "http://127.0.0.1:9")

    client = bedrock_client()

    assert str(client.base_url).rstrip("/") == f"https://bedrock-runtime.{REGION}.amazonaws.com"
    assert client.max_retries == 0


class Note(BaseModel):
    text: str


@tool()
def write_note(args: Note, ctx: ToolContext) -> str:
    """Write one note."""
    return "ok"


def test_build_model_makes_a_bedrock_model_without_any_anthropic_key(api):
    agent = Agent(name="notes", tools=[write_note], instructions=INSTRUCTIONS)
    api.enqueue(tool_use_response("write_note", {"text": "hello"}))

    model = build_model(
        agent, f"bedrock:{MODEL_ID}", anthropic_api_key=None, bedrock_base_url=api.url
    )
    reply = model.decide(REQUEST)

    assert isinstance(model, AnthropicModel)
    assert not isinstance(reply, ToolCall)
    assert api.requests[0].path == f"/model/{MODEL_ID}/invoke"
