"""`AnthropicModel` driven through the real SDK against a local fake of the Messages API: the
exact request (system prompt, tools, cache breakpoints), usage, and retries inside the attempt
on a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from email.utils import format_datetime

import anthropic
import pytest

from ratchet.adapters.anthropic_model import AnthropicModel, anthropic_client
from ratchet.errors import (
    ModelOutputInvalid,
    ModelUnavailable,
    PermanentError,
    StepAttemptFailed,
    is_terminal,
)
from ratchet.ports import ModelReply, ModelRequest, StepView, ToolSpec
from ratchet.state import Decision, Done, ToolCall, Usage
from tests.integration.fake_messages_api import (
    EPOCH,
    FakeClock,
    FakeMessagesApi,
    ScriptedResponse,
    error_response,
    hanging_response,
    malformed_json,
    overloaded,
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
INSTRUCTIONS = "You tidy notes. Never delete a file."

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
    instructions=INSTRUCTIONS,
    max_tokens=MAX_TOKENS,
    retry_seconds=0,
)
"""No retry budget: one try, so a single scripted failure is the attempt's answer."""


@dataclass
class Harness:
    """One fake API and one real SDK client on it; `decide` runs `AnthropicModel` once on a
    fake clock (`clock.slept` records every wait)."""

    api: FakeMessagesApi
    client: anthropic.Anthropic
    clock: FakeClock = field(default_factory=FakeClock)

    def reply(
        self, *responses: ScriptedResponse, request: ModelRequest = REQUEST, timeout_s: float = 5.0
    ) -> ModelReply:
        self.api.enqueue(*responses)
        client = self.client.with_options(timeout=timeout_s)
        return AnthropicModel(client, MODEL_NAME, pacing=self.clock.pacing()).decide(request)

    def decide(self, *responses: ScriptedResponse, **options: object) -> Decision:
        return self.reply(*responses, **options).decision  # type: ignore[arg-type]

    def failure(self, *responses: ScriptedResponse, **options: object) -> StepAttemptFailed:
        with pytest.raises(StepAttemptFailed) as caught:
            self.reply(*responses, **options)  # type: ignore[arg-type]
        return caught.value


# One server and one client for the module: building a client costs ~60 ms, which across
# these tests would cost more than the tests themselves. `harness` resets the server between
# tests, and per-test timeouts come from `with_options`.
@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[FakeMessagesApi, anthropic.Anthropic]]:
    with (
        FakeMessagesApi() as api,
        anthropic_client(API_KEY, base_url=api.url) as client,
    ):
        yield api, client


@pytest.fixture
def harness(shared: tuple[FakeMessagesApi, anthropic.Anthropic]) -> Iterator[Harness]:
    api, client = shared
    api.reset()
    yield Harness(api, client)
    api.reset()


def _tools_body(*specs: ToolSpec) -> list[dict[str, object]]:
    return [
        {"name": s.name, "description": s.description, "input_schema": s.input_schema}
        for s in specs
    ]


def test_the_request_is_the_system_prompt_the_tools_and_the_step_prompt_as_the_user_turn(
    harness,
):
    arguments = {"path": "notes/todo.txt", "text": "buy milk"}

    decision = harness.decide(
        tool_use_response("write_file", arguments, preamble="I'll write the file.")
    )

    assert decision == ToolCall(name="write_file", arguments=arguments)
    [request] = harness.api.requests
    assert request.path == "/v1/messages"
    first, last = _tools_body(LIST_FILES, WRITE_FILE)
    assert request.body == {
        "model": MODEL_NAME,
        "max_tokens": MAX_TOKENS,
        "system": [{"type": "text", "text": INSTRUCTIONS, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": PROMPT}],
        # The stable prefix is cached up to the last tool and up to the system prompt; the
        # user turn changes every step and carries no breakpoint.
        "tools": [first, {**last, "cache_control": {"type": "ephemeral"}}],
    }
    assert "anthropic-version" in request.headers
    assert any(API_KEY in value for value in request.headers.values())


def test_a_summary_request_sends_no_tools_and_reads_the_done_reply_as_the_summary(harness):
    # The engine's memory asks for a summary with no tools (ratchet.engine.memory)
    request = REQUEST.model_copy(update={"tools": []})

    decision = harness.decide(text_response("DONE: order A-100 was damaged."), request=request)

    assert decision == Done(summary="order A-100 was damaged.")
    [sent] = harness.api.requests
    assert "tools" not in sent.body


def test_without_instructions_there_is_no_system_prompt_and_temperature_is_sent_when_set(
    harness,
):
    request = REQUEST.model_copy(update={"instructions": "", "temperature": 0.2})

    harness.decide(tool_use_response("list_files", {"path": "."}), request=request)

    [sent] = harness.api.requests
    assert sent.body is not None
    assert "system" not in sent.body
    assert sent.body["temperature"] == 0.2
    assert sent.body["messages"] == [{"role": "user", "content": PROMPT}]


def test_the_reply_carries_the_calls_usage_with_its_cache_figures(harness):
    usage = {
        "input_tokens": 40,
        "output_tokens": 25,
        "cache_read_input_tokens": 1800,
        "cache_creation_input_tokens": 200,
    }

    reply = harness.reply(tool_use_response("list_files", {"path": "."}, usage=usage))

    assert reply.usage == Usage(
        input_tokens=40, output_tokens=25, cache_read_tokens=1800, cache_write_tokens=200, calls=1
    )
    assert reply.usage.cached_share == pytest.approx(1800 / 2040)


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


def test_a_body_that_is_not_json_is_unavailable(harness):
    error = harness.failure(malformed_json())

    assert isinstance(error, ModelUnavailable)
    assert "not valid JSON" in str(error)


def test_json_that_is_not_a_message_is_unavailable(harness):
    error = harness.failure(unexpected_shape())

    assert isinstance(error, ModelUnavailable)
    assert "not a message" in str(error)


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


# --- retries inside the attempt ------------------------------------------------------------

BUDGET = 60.0
RETRYING = REQUEST.model_copy(update={"retry_seconds": BUDGET})


def test_a_rate_limit_is_waited_out_for_at_least_its_retry_after(harness):
    decision = harness.decide(
        rate_limited(retry_after_s=7),
        tool_use_response("list_files", {"path": "."}),
        request=RETRYING,
    )

    assert decision == ToolCall(name="list_files", arguments={"path": "."})
    assert len(harness.api.requests) == 2
    [delay] = harness.clock.slept
    assert delay >= 7
    assert harness.api.requests[0].body == harness.api.requests[1].body
    # The SDK's own retries are off: every try is the adapter's.
    assert [r.headers["x-stainless-retry-count"] for r in harness.api.requests] == ["0", "0"]


def test_retry_after_ms_and_an_http_date_are_honoured(harness):
    in_12_s = format_datetime(EPOCH + timedelta(seconds=12), usegmt=True)
    harness.clock.jitter = 0.0  # no backoff of its own: the waits are the provider's

    harness.decide(
        server_error(retry_after_ms=2500),
        error_response(503, "api_error", "unavailable", headers={"retry-after": in_12_s}),
        tool_use_response("list_files", {"path": "."}),
        request=RETRYING,
    )

    assert harness.clock.slept == [2.5, pytest.approx(12 - 2.5)]


def test_without_retry_after_the_backoff_doubles_and_is_jittered(harness):
    harness.clock.jitter = 0.5

    harness.decide(
        *(overloaded() for _ in range(4)),
        tool_use_response("list_files", {"path": "."}),
        request=RETRYING,
    )

    # Full jitter: a uniform draw below 1, 2, 4, 8 s; the fake draws half of each bound.
    assert harness.clock.slept == [0.5, 1.0, 2.0, 4.0]


@pytest.mark.parametrize(
    "response",
    [
        pytest.param(overloaded(), id="529"),
        pytest.param(server_error(), id="500"),
        pytest.param(error_response(503, "api_error", "unavailable"), id="503"),
        pytest.param(error_response(408, "timeout_error", "timed out"), id="408"),
        pytest.param(error_response(409, "conflict_error", "conflict"), id="409"),
    ],
)
def test_transient_statuses_are_retried(harness, response):
    decision = harness.decide(
        response, tool_use_response("list_files", {"path": "."}), request=RETRYING
    )

    assert decision == ToolCall(name="list_files", arguments={"path": "."})
    assert len(harness.api.requests) == 2


def test_a_storm_past_the_budget_ends_the_attempt_with_the_last_status_and_the_tries(harness):
    error = harness.failure(*(overloaded() for _ in range(20)), request=RETRYING)

    assert isinstance(error, ModelUnavailable)
    assert error.transient
    tries = len(harness.api.requests)
    # 1 + 2 + 4 + 8 + 16 = 31 s of waits fit in 60 s; the next 30 s wait would not.
    assert harness.clock.slept == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert tries == 6
    assert "overloaded (HTTP 529, overloaded_error" in str(error)
    assert f"gave up after {tries} tries in 31.0 s" in str(error)
    assert "60 s retry budget" in str(error)


def test_a_retry_after_past_the_budget_gives_up_at_once(harness):
    error = harness.failure(rate_limited(retry_after_s=600), request=RETRYING)

    assert isinstance(error, ModelUnavailable)
    assert error.transient
    assert harness.clock.slept == []
    assert "rate limiting requests (HTTP 429" in str(error)
    assert "it asked to wait 600 s" in str(error)
    assert "gave up after 1 try" in str(error)


def test_with_no_budget_a_rate_limit_is_one_try(harness):
    error = harness.failure(rate_limited(retry_after_s=7))

    assert isinstance(error, ModelUnavailable)
    assert error.transient
    assert len(harness.api.requests) == 1


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
    ],
)
def test_a_client_error_is_permanent_and_never_retried(harness, status, error_type):
    error = harness.failure(
        error_response(status, error_type, "the request was refused"), request=RETRYING
    )

    assert isinstance(error, ModelUnavailable)
    assert not error.transient
    assert isinstance(error.__cause__, PermanentError)
    assert is_terminal(error)
    assert f"client error (HTTP {status}, {error_type}" in str(error)
    assert "API key" in str(error)
    assert len(harness.api.requests) == 1
    assert harness.clock.slept == []


def test_a_response_slower_than_the_client_timeout_is_retried(harness):
    decision = harness.decide(
        hanging_response(),
        tool_use_response("list_files", {"path": "."}),
        request=RETRYING,
        timeout_s=0.5,
    )

    assert decision == ToolCall(name="list_files", arguments={"path": "."})
    assert len(harness.api.requests) == 2


def test_a_timeout_with_no_budget_is_unavailable(harness):
    error = harness.failure(hanging_response(), timeout_s=0.5)

    assert isinstance(error, ModelUnavailable)
    assert error.transient
    assert "did not answer in time" in str(error)
    assert API_KEY not in str(error)
    assert len(harness.api.requests) == 1


def test_an_unreachable_api_is_retried_until_the_budget_is_spent():
    with FakeMessagesApi() as stopped:
        pass
    clock = FakeClock()
    unreachable = anthropic_client(API_KEY, base_url=stopped.url)

    with unreachable as client, pytest.raises(StepAttemptFailed) as caught:
        AnthropicModel(client, MODEL_NAME, pacing=clock.pacing()).decide(
            REQUEST.model_copy(update={"retry_seconds": 10})
        )

    assert isinstance(caught.value, ModelUnavailable)
    assert caught.value.transient
    assert "could not reach the Anthropic API at http://127.0.0.1:" in str(caught.value)
    assert "gave up after 4 tries" in str(caught.value)  # waits 1 + 2 + 4; 8 more pass 10
    assert clock.slept == [1.0, 2.0, 4.0]
    assert API_KEY not in str(caught.value)


def test_the_client_factory_ignores_the_base_url_environment_and_turns_sdk_retries_off(
    monkeypatch,
):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")

    with anthropic_client(API_KEY) as client:
        assert str(client.base_url).rstrip("/") == "https://api.anthropic.com"
        assert client.max_retries == 0
        assert client.timeout == 60.0
