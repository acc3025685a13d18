"""`AnthropicModel` driven through the real SDK against a local fake of the Messages API."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import pytest

from ratchet.adapters.anthropic_model import AnthropicModel, anthropic_client
from ratchet.errors import ModelOutputInvalid, ModelUnavailable, StepAttemptFailed
from ratchet.ports import ModelRequest, StepView, ToolSpec
from ratchet.state import Decision, Done, ToolCall
from tests.integration.fake_messages_api import (
    FakeMessagesApi,
    ScriptedResponse,
    error_response,
    hanging_response,
    malformed_json,
    rate_limited,
    server_error,
    text_response,
    tool_use_response,
    unexpected_shape,
)

API_KEY = "test-key"
MODEL_NAME = "claude-test-model"
MAX_TOKENS = 512
PROMPT = "<goal>Tidy the notes folder</goal>\nDecide the single next step."

LIST_FILES = ToolSpec(
    name="list_files",
    description="List the files under a directory.",
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
)
WRITE_FILE = ToolSpec(
    name="write_file",
    description="Write text to a file, replacing it.",
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
        "required": ["path", "text"],
        "additionalProperties": False,
    },
)
REQUEST = ModelRequest(
    prompt=PROMPT,
    tools=[LIST_FILES, WRITE_FILE],
    view=StepView(run_id="run-1", goal="Tidy the notes folder", step=3),
)


@dataclass(frozen=True)
class Harness:
    """One fake API and one real SDK client on it; `decide` runs `AnthropicModel` once."""

    api: FakeMessagesApi
    client: anthropic.Anthropic

    def decide(
        self, *responses: ScriptedResponse, max_retries: int = 0, timeout_s: float = 5.0
    ) -> Decision:
        self.api.enqueue(*responses)
        client = self.client.with_options(max_retries=max_retries, timeout=timeout_s)
        return AnthropicModel(client, MODEL_NAME, max_tokens=MAX_TOKENS).decide(REQUEST)

    def failure(self, *responses: ScriptedResponse, timeout_s: float = 5.0) -> StepAttemptFailed:
        with pytest.raises(StepAttemptFailed) as caught:
            self.decide(*responses, timeout_s=timeout_s)
        return caught.value


# One server and one client for the module: building a client costs ~60 ms, which across
# these tests would cost more than the tests themselves. `harness` resets the server between
# tests, and per-test retry and timeout settings come from `with_options`.
@pytest.fixture(scope="module")
def shared() -> Iterator[Harness]:
    with (
        FakeMessagesApi() as api,
        anthropic_client(API_KEY, base_url=api.url, max_retries=0) as client,
    ):
        yield Harness(api, client)


@pytest.fixture
def harness(shared: Harness) -> Iterator[Harness]:
    shared.api.reset()
    yield shared
    shared.api.reset()


def test_tool_use_becomes_a_tool_call_and_the_request_carries_exact_arguments(harness):
    arguments = {"path": "notes/todo.txt", "text": "buy milk"}

    decision = harness.decide(
        tool_use_response("write_file", arguments, preamble="I'll write the file.")
    )

    assert decision == ToolCall(name="write_file", arguments=arguments)
    [request] = harness.api.requests
    assert request.path == "/v1/messages"
    assert request.body == {
        "model": MODEL_NAME,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [
            {
                "name": spec.name,
                "description": spec.description,
                "input_schema": spec.input_schema,
            }
            for spec in (LIST_FILES, WRITE_FILE)
        ],
    }
    assert "anthropic-version" in request.headers
    assert any(API_KEY in value for value in request.headers.values())


def test_the_first_tool_use_block_wins(harness):
    first = tool_use_response("list_files", {"path": "notes"})
    assert first.payload is not None
    second_block = {"type": "tool_use", "id": "toolu_2", "name": "write_file", "input": {}}
    payload = {**first.payload, "content": [*first.payload["content"], second_block]}
    scripted = ScriptedResponse(payload=payload, echo_model=True)

    assert harness.decide(scripted) == ToolCall(name="list_files", arguments={"path": "notes"})


@pytest.mark.parametrize(
    ("texts", "summary"),
    [
        (["DONE: Moved 12 notes into dated folders."], "Moved 12 notes into dated folders."),
        (["DONE - all notes tidied"], "all notes tidied"),
        (["  DONE\n\nEvery note is filed.  "], "Every note is filed."),
        (["DONE.", " The folder is tidy."], "The folder is tidy."),
        (["DONE"], "DONE"),
        (["DONE:  "], "DONE:"),
    ],
)
def test_a_done_reply_becomes_done_with_its_summary(harness, texts, summary):
    assert harness.decide(text_response(*texts)) == Done(summary=summary)


@pytest.mark.parametrize(
    "text",
    [
        "I should list the files first.",
        "Done with the first folder, now the second.",
        "DONEZO",
    ],
)
def test_a_reply_that_is_neither_a_tool_call_nor_done_is_invalid(harness, text):
    error = harness.failure(text_response(text))

    assert isinstance(error, ModelOutputInvalid)
    assert f"did not reply DONE; it wrote: {text!r}" in str(error)


def test_an_empty_reply_is_invalid(harness):
    error = harness.failure(text_response("  "))

    assert isinstance(error, ModelOutputInvalid)
    assert "wrote no text (stop reason 'end_turn')" in str(error)


def test_an_invalid_reply_is_quoted_but_not_in_full(harness):
    text = "Let me think about this. " + "x" * 1000

    error = harness.failure(text_response(text))

    assert isinstance(error, ModelOutputInvalid)
    assert repr(text[:200]) in str(error)
    assert text not in str(error)


def test_an_unknown_tool_is_invalid_and_the_error_names_the_known_ones(harness):
    error = harness.failure(tool_use_response("delete_everything", {}))

    assert isinstance(error, ModelOutputInvalid)
    assert "'delete_everything'" in str(error)
    assert "list_files, write_file" in str(error)


def test_a_rate_limit_is_unavailable_and_not_retried_by_the_sdk(harness):
    error = harness.failure(rate_limited(retry_after_s=7))

    assert isinstance(error, ModelUnavailable)
    assert "HTTP 429" in str(error)
    assert "rate limit" in str(error)
    assert "retry after 7s" in str(error)
    assert len(harness.api.requests) == 1


def test_a_server_error_is_unavailable(harness):
    error = harness.failure(server_error())

    assert isinstance(error, ModelUnavailable)
    assert "server error (HTTP 500, api_error: 'Internal server error'" in str(error)
    assert len(harness.api.requests) == 1


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(400, "invalid_request_error"), (401, "authentication_error")],
)
def test_a_client_error_is_unavailable_and_says_it_is_a_client_error(harness, status, error_type):
    error = harness.failure(error_response(status, error_type, "the request was refused"))

    assert isinstance(error, ModelUnavailable)
    assert f"client error (HTTP {status}, {error_type}" in str(error)
    assert "API key" in str(error)


def test_a_body_that_is_not_json_is_unavailable(harness):
    error = harness.failure(malformed_json())

    assert isinstance(error, ModelUnavailable)
    assert "not valid JSON" in str(error)


def test_json_that_is_not_a_message_is_unavailable(harness):
    error = harness.failure(unexpected_shape())

    assert isinstance(error, ModelUnavailable)
    assert "not a message" in str(error)


def test_a_response_slower_than_the_client_timeout_is_unavailable(harness):
    error = harness.failure(hanging_response(), timeout_s=0.5)

    assert isinstance(error, ModelUnavailable)
    assert "did not answer in time" in str(error)
    assert API_KEY not in str(error)
    assert len(harness.api.requests) == 1


def test_an_unreachable_api_is_unavailable():
    with FakeMessagesApi() as stopped:
        pass
    unreachable = anthropic_client(API_KEY, base_url=stopped.url, max_retries=0)

    with unreachable as client, pytest.raises(StepAttemptFailed) as caught:
        AnthropicModel(client, MODEL_NAME).decide(REQUEST)

    assert isinstance(caught.value, ModelUnavailable)
    assert "could not reach the Anthropic API at http://127.0.0.1:" in str(caught.value)
    assert API_KEY not in str(caught.value)


def test_the_sdk_retries_a_server_error_exactly_once_when_allowed(harness):
    # The 500 names a 10 ms wait, which the SDK honours instead of its ~0.5 s backoff.
    decision = harness.decide(
        server_error(retry_after_ms=10),
        tool_use_response("list_files", {"path": "."}),
        max_retries=1,
    )

    assert decision == ToolCall(name="list_files", arguments={"path": "."})
    assert [r.headers["x-stainless-retry-count"] for r in harness.api.requests] == ["0", "1"]
    assert harness.api.requests[0].body == harness.api.requests[1].body


@pytest.mark.parametrize(
    "response",
    [
        pytest.param(rate_limited(), id="429"),
        pytest.param(server_error(), id="500"),
        pytest.param(
            error_response(401, "authentication_error", f"invalid x-api-key: {API_KEY}"),
            id="401-echoing-the-key",
        ),
        pytest.param(malformed_json(), id="malformed"),
        pytest.param(ScriptedResponse(payload={"echo": API_KEY}), id="not-a-message"),
        pytest.param(text_response("no idea"), id="no-decision"),
        pytest.param(tool_use_response("rm_rf", {}), id="unknown-tool"),
    ],
)
def test_the_api_key_never_appears_in_an_error(harness, response):
    error = harness.failure(response)

    assert API_KEY not in str(error)
    assert API_KEY not in repr(error)


def test_a_key_cut_by_the_quote_limit_leaks_no_prefix_either(harness):
    # The key straddles the 200-character quote limit: quoting before redacting would leave
    # its first half in the message.
    echoed = "x" * 195 + API_KEY

    error = harness.failure(error_response(400, "invalid_request_error", echoed))

    assert "xxxxx" in str(error)
    assert API_KEY[:5] not in str(error)


def test_the_client_factory_ignores_the_base_url_environment(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")

    with anthropic_client(API_KEY) as client:
        assert str(client.base_url).rstrip("/") == "https://api.anthropic.com"
        assert client.max_retries == 1
        assert client.timeout == 60.0
