"""The `Model` port on the Anthropic Messages API.

One step is one `messages.create` call: the prompt as a single user message and the agent's
tools. The answer is either a tool call or a text reply starting with DONE; anything else is a
failed attempt, and so is every API failure. The SDK's own retries are kept low on purpose
(see `anthropic_client`): the engine owns retries, so every attempt is counted and recorded.
"""

from __future__ import annotations

import json
import re

import anthropic
from anthropic.types import Message, MessageParam, TextBlock, ToolParam, ToolUseBlock

from ratchet.errors import ModelOutputInvalid, ModelUnavailable
from ratchet.ports import ModelRequest
from ratchet.state import Decision, Done, ToolCall

DEFAULT_BASE_URL = "https://api.anthropic.com"
QUOTE_CHARS = 200
"""How much of an unusable reply an error quotes: enough to see what went wrong, no more."""

# Case-sensitive and a whole word on purpose: the step prompt asks for "DONE", and reading
# "Done with the first batch, now..." as completion would end a run early.
_DONE = re.compile(r"^DONE\b")
_SUMMARY_LEAD = ":-\u2013\u2014.,;!" + " \t\r\n"


def anthropic_client(
    api_key: str,
    *,
    base_url: str | None = None,
    timeout_s: float = 60.0,
    max_retries: int = 1,
) -> anthropic.Anthropic:
    """Build the client `AnthropicModel` expects.

    `max_retries` stays low because the engine retries failed attempts itself; SDK retries
    would hide attempts from the run's history. The base URL is always passed explicitly so
    the SDK does not fall back to `ANTHROPIC_BASE_URL` or a profile on disk: where requests go
    is decided by the caller's settings only.
    """
    return anthropic.Anthropic(
        api_key=api_key,
        base_url=base_url or DEFAULT_BASE_URL,
        timeout=timeout_s,
        max_retries=max_retries,
    )


class AnthropicModel:
    """Decides a step with one Messages API call.

    Raises `ModelUnavailable` when the API cannot give an answer (rate limit, server error,
    timeout, connection failure, a rejected request, a body that is not a message) and
    `ModelOutputInvalid` when it answers with neither a known tool call nor DONE. Tool
    arguments are returned as the model sent them; validating them is the engine's job.
    """

    def __init__(self, client: anthropic.Anthropic, model: str, *, max_tokens: int = 1024) -> None:
        self._client = client
        self._model = model
        self._max_tokens = max_tokens

    def decide(self, request: ModelRequest) -> Decision:
        message = self._create(request)
        return self._interpret(message, request)

    def _create(self, request: ModelRequest) -> Message:
        messages: list[MessageParam] = [{"role": "user", "content": request.prompt}]
        tools: list[ToolParam] = [
            {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
            for tool in request.tools
        ]
        try:
            message = self._client.messages.create(
                model=self._model,
                max_tokens=self._max_tokens,
                messages=messages,
                tools=tools,
            )
        except anthropic.APITimeoutError as exc:
            raise ModelUnavailable(
                f"the Anthropic API did not answer in time (model {self._model})"
            ) from exc
        except anthropic.APIConnectionError as exc:
            raise ModelUnavailable(
                self._redact(
                    f"could not reach the Anthropic API at {self._client.base_url}: {_cause(exc)}"
                )
            ) from exc
        except anthropic.APIStatusError as exc:
            raise ModelUnavailable(self._describe_status(exc)) from exc
        # A 200 whose body is not a message means the API (or a proxy in front of it) failed
        # to deliver an answer: the model never spoke, so this is ModelUnavailable, not
        # ModelOutputInvalid, which blames the model's reply. Both are retried by the engine;
        # keeping them apart keeps the run's history honest about what went wrong.
        except anthropic.APIResponseValidationError as exc:
            raise ModelUnavailable(
                f"the Anthropic API returned a body that is not a message (HTTP {exc.status_code})"
            ) from exc
        except json.JSONDecodeError as exc:
            raise ModelUnavailable(
                f"the Anthropic API returned a body that is not valid JSON: {exc}"
            ) from exc
        # Without strict validation the SDK builds a `Message` from any JSON object, and
        # returns plain text for a non-JSON content type; check the shape before trusting it.
        if (
            not isinstance(message, Message)
            or message.type != "message"
            or not isinstance(message.content, list)
        ):
            shown = (
                message.model_dump(exclude_none=True) if isinstance(message, Message) else message
            )
            raise ModelUnavailable(
                "the Anthropic API returned a body that is not a message: "
                f"{_quote(self._redact(str(shown)))}"
            )
        return message

    def _interpret(self, message: Message, request: ModelRequest) -> Decision:
        known = [tool.name for tool in request.tools]
        for block in message.content:
            if not isinstance(block, ToolUseBlock):
                continue
            if block.name not in known:
                raise ModelOutputInvalid(
                    f"the model called unknown tool {block.name!r}; known tools: "
                    f"{', '.join(known) or '(none)'}"
                )
            if not isinstance(block.input, dict):
                raise ModelUnavailable(
                    f"the Anthropic API returned a tool_use block for {block.name!r} whose "
                    "input is not a JSON object"
                )
            return ToolCall(name=block.name, arguments=dict(block.input))

        text = "".join(block.text for block in message.content if isinstance(block, TextBlock))
        text = text.strip()
        if _DONE.match(text):
            summary = text[len("DONE") :].lstrip(_SUMMARY_LEAD)
            return Done(summary=summary or text)
        if not text:
            raise ModelOutputInvalid(
                f"the model called no tool and wrote no text (stop reason {message.stop_reason!r})"
            )
        raise ModelOutputInvalid(
            f"the model called no tool and did not reply DONE; it wrote: {_quote(text)}"
        )

    def _describe_status(self, exc: anthropic.APIStatusError) -> str:
        status = exc.status_code
        detail = self._status_detail(exc)
        if status == 429:
            retry_after = exc.response.headers.get("retry-after")
            wait = f"; the API asks to retry after {retry_after}s" if retry_after else ""
            return f"the Anthropic API is rate limiting requests (HTTP 429{detail}){wait}"
        if status >= 500:
            return f"the Anthropic API failed with a server error (HTTP {status}{detail})"
        return (
            f"the Anthropic API rejected the request as a client error (HTTP {status}{detail}): "
            "check the API key, the model name and the request; retrying will not help until "
            "that is fixed"
        )

    def _status_detail(self, exc: anthropic.APIStatusError) -> str:
        # Redact before quoting: truncation could cut a credential and leave half of it.
        api_message = self._redact(exc.api_message) if exc.api_message else None
        parts = [
            part
            for part in (
                f"{exc.type}: {_quote(api_message)}" if api_message else exc.type,
                f"request id {exc.request_id}" if exc.request_id else None,
            )
            if part
        ]
        return "".join(f", {part}" for part in parts)

    def _redact(self, text: str) -> str:
        # Error text partly comes from the server (or a proxy in front of it); make sure no
        # credential the client holds can travel into a recorded error.
        for secret in (self._client.api_key, self._client.auth_token):
            if secret:
                text = text.replace(secret, "[redacted]")
        return text


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__
    if cause is None:
        return type(exc).__name__
    return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__


def _quote(text: str) -> str:
    if len(text) <= QUOTE_CHARS:
        return repr(text)
    return f"{text[:QUOTE_CHARS]!r}... ({len(text):,} chars)"
