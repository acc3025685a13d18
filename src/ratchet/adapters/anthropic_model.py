"""The `Model` port on Claude: the Anthropic Messages API, or Amazon Bedrock's.

One step is one `messages.create` call: the agent's instructions as the system prompt, its
tools, and the step prompt as the single user turn, byte for byte. The stable prefix (the
tool definitions, then the system prompt) carries `cache_control`, so from the second step on
the provider reads it from its prompt cache. The answer is either a tool call or a text reply
starting with DONE; anything else is a failed attempt. The reply carries the call's token
usage, which the engine keeps in the step record.

Transient provider errors (429, 529 and other 5xx, 408, 409, timeouts, dropped connections)
are retried here, inside the attempt, with exponential backoff and full jitter, honouring the
provider's `retry-after`, for at most the agent's `model_retry_seconds` from the first call.
When the next wait would pass that budget the attempt ends at once with `ModelUnavailable`
(transient): only then does the engine count a failed attempt. Any other client error is
permanent (`ModelUnavailable`, not transient, caused by a `PermanentError`): the run fails at
once, since sending the same refused request again cannot help.
The SDK's own retries are off (`max_retries=0`), so every try is this module's and is counted
in the error it raises.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import anthropic
from anthropic.types import (
    CacheControlEphemeralParam,
    Message,
    MessageParam,
    TextBlock,
    TextBlockParam,
    ToolUseBlock,
)

from ratchet.backoff import Backoff
from ratchet.errors import ModelOutputInvalid, ModelUnavailable, PermanentError
from ratchet.ports import ModelReply, ModelRequest
from ratchet.state import Decision, Done, ToolCall, Usage

RETRIES = logging.getLogger("ratchet.model")
"""Each retry of a model call is a warning here, its `notice` a sentence for a person (the CLI
prints it among the step lines): a call that retries for a minute is never silent."""

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_TIMEOUT_S = 60.0
QUOTE_CHARS = 200
"""How much of an unusable reply an error quotes: enough to see what went wrong, no more."""

RETRY_BACKOFF = Backoff(first_seconds=1.0, factor=2.0, max_seconds=30.0)
"""Exponential backoff between tries: up to 1 s, 2 s, 4 s ... 30 s, each drawn uniformly
from zero to that bound (full jitter), and never shorter than the provider's `retry-after`."""
RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""Client errors that pass by themselves (timeout, conflict, rate limit); 5xx always does."""
EPHEMERAL: CacheControlEphemeralParam = {"type": "ephemeral"}

# Case-sensitive and a whole word on purpose: the step prompt asks for "DONE", and reading
# "Done with the first batch, now..." as completion would end a run early.
_DONE = re.compile(r"^DONE\b")
_SUMMARY_LEAD = ":-\u2013\u2014.,;!" + " \t\r\n"

Client = anthropic.Anthropic | anthropic.AnthropicBedrock


def anthropic_client(
    api_key: str,
    *,
    base_url: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_retries: int = 0,
) -> anthropic.Anthropic:
    """Build the client `AnthropicModel` expects on the Anthropic API.

    `max_retries` stays 0: `AnthropicModel` retries transient errors itself, within the
    agent's budget, and SDK retries would hide tries from it. The base URL is always passed
    explicitly so the SDK does not fall back to `ANTHROPIC_BASE_URL` or a profile on disk:
    where requests go is decided by the caller's settings only.
    """
    return anthropic.Anthropic(
        api_key=api_key,
        base_url=base_url or DEFAULT_BASE_URL,
        timeout=timeout_s,
        max_retries=max_retries,
    )


def bedrock_client(
    *,
    region: str | None = None,
    base_url: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> anthropic.AnthropicBedrock:
    """Build the client `AnthropicModel` expects on Amazon Bedrock: IAM credentials from the
    usual chain (the function's role on AWS), SigV4-signed, no API key. The region defaults
    to `AWS_REGION` / `AWS_DEFAULT_REGION` (Lambda sets it) or the profile's; the endpoint to
    that region's `bedrock-runtime`, never to `ANTHROPIC_BEDROCK_BASE_URL`."""
    client = anthropic.AnthropicBedrock(
        aws_region=region, base_url=base_url, timeout=timeout_s, max_retries=0
    )
    if base_url is None:
        client = client.with_options(
            base_url=f"https://bedrock-runtime.{client.aws_region}.amazonaws.com"
        )
    return client


@dataclass(frozen=True)
class Pacing:
    """How the adapter waits between tries; tests inject a fake clock and sleep."""

    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    """Seconds, monotonic: measures the retry budget."""
    jitter: Callable[[], float] = random.random
    """A number in [0, 1): the share of the backoff bound to wait."""
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    """Wall-clock time, for a `retry-after` given as an HTTP date."""


SYSTEM_PACING = Pacing()


@dataclass(frozen=True)
class _Transient:
    """A try that failed in a way that may pass: what to say, and how long the provider
    asked us to wait (None: it did not say)."""

    message: str
    retry_after: float | None


class AnthropicModel:
    """Decides a step with one Messages API call (plus retries of transient failures).

    Raises `ModelUnavailable` when the provider cannot give an answer within the retry budget
    (transient), or rejects the request as a client error (permanent: not transient, and
    caused by a `PermanentError`, so the run fails at once), or
    returns a body that is not a message; `ModelOutputInvalid` when the model answers with
    neither a known tool call nor DONE. Tool arguments are returned as the model sent them;
    validating them is the engine's job.
    """

    def __init__(self, client: Client, model: str, *, pacing: Pacing = SYSTEM_PACING) -> None:
        self._client = client
        self._model = model
        self._pacing = pacing
        self._service = (
            "Amazon Bedrock"
            if isinstance(client, anthropic.AnthropicBedrock)
            else "the Anthropic API"
        )

    def decide(self, request: ModelRequest) -> ModelReply:
        message = self._create(request)
        decision = self._interpret(message, request)
        return ModelReply(decision=decision, usage=_usage(message))

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `messages.create` for `request`."""
        messages: list[MessageParam] = [{"role": "user", "content": request.prompt}]
        tools: list[dict[str, Any]] = [
            {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
            for tool in request.tools
        ]
        # Two cache breakpoints: the provider caches the prefix up to each one. Tools come
        # first in that prefix, then the system prompt; both stay the same step after step,
        # while the user turn (the step prompt) changes every step and is never cached.
        if tools:
            tools[-1]["cache_control"] = EPHEMERAL
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": request.max_tokens,
            "messages": messages,
        }
        if tools:  # none when the model is asked for a summary (`ratchet.engine.memory`)
            body["tools"] = tools
        if request.instructions:
            system: list[TextBlockParam] = [
                {"type": "text", "text": request.instructions, "cache_control": EPHEMERAL}
            ]
            body["system"] = system
        if request.temperature is not None:
            # Not every SDK version has a `temperature` argument; the API takes the field.
            body["extra_body"] = {"temperature": request.temperature}
        return body

    def _create(self, request: ModelRequest) -> Message:
        body = self.body(request)
        budget = request.retry_seconds
        started = self._pacing.clock()
        tries = 0
        while True:
            tries += 1
            failure = self._try(body)
            if isinstance(failure, Message):
                return failure
            elapsed = self._pacing.clock() - started
            backoff = self._pacing.jitter() * RETRY_BACKOFF.ceiling(tries)
            delay = max(backoff, failure.retry_after or 0.0)
            if elapsed + delay > budget:
                asked = (
                    f" (it asked to wait {failure.retry_after:g} s)"
                    if failure.retry_after is not None
                    else ""
                )
                raise ModelUnavailable(
                    f"{failure.message}{asked}; gave up after {tries} "
                    f"{'try' if tries == 1 else 'tries'} in {elapsed:.1f} s: waiting "
                    f"{delay:.1f} s more would pass the agent's {budget:g} s retry budget "
                    "(model_retry_seconds)"
                )
            RETRIES.warning(
                "model call retrying",
                extra={
                    "notice": f"model call failed ({failure.message}); still retrying, try "
                    f"{tries + 1} in {delay:.0f} s (gives up after {budget:g} s)"
                },
            )
            self._pacing.sleep(delay)

    def _try(self, body: dict[str, Any]) -> Message | _Transient:
        """One call: the message, or a transient failure worth another try. Anything else
        raises."""
        try:
            message = self._client.messages.create(**body)
        except anthropic.APITimeoutError:
            return _Transient(f"{self._service} did not answer in time (model {self._model})", None)
        except anthropic.APIConnectionError as exc:
            where = self._redact(f"could not reach {self._service} at {self._client.base_url}")
            return _Transient(f"{where}: {self._redact(_cause(exc))}", None)
        except anthropic.APIStatusError as exc:
            message_text = self._describe_status(exc)
            if exc.status_code in RETRYABLE_STATUSES or exc.status_code >= 500:
                return _Transient(message_text, self._retry_after(exc))
            # Marked permanent (a terminal cause): the engine fails the run at once rather
            # than send the same refused request twice more.
            permanent = PermanentError(message_text)
            permanent.__cause__ = exc
            raise ModelUnavailable(message_text, transient=False) from permanent
        # A 200 whose body is not a message means the API (or a proxy in front of it) failed
        # to deliver an answer: the model never spoke, so this is ModelUnavailable, not
        # ModelOutputInvalid, which blames the model's reply. Both are retried by the engine;
        # keeping them apart keeps the run's history honest about what went wrong.
        except anthropic.APIResponseValidationError as exc:
            raise ModelUnavailable(
                f"{self._service} returned a body that is not a message (HTTP {exc.status_code})"
            ) from exc
        except json.JSONDecodeError as exc:
            raise ModelUnavailable(
                f"{self._service} returned a body that is not valid JSON: {exc}"
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
                f"{self._service} returned a body that is not a message: "
                f"{_quote(self._redact(str(shown)))}"
            )
        return message

    def _retry_after(self, exc: anthropic.APIStatusError) -> float | None:
        """The wait the provider asked for, in seconds: `retry-after-ms`, or `retry-after` as
        seconds or an HTTP date. None if it named none (or nonsense)."""
        headers = exc.response.headers
        millis = headers.get("retry-after-ms")
        if millis is not None:
            try:
                return max(0.0, float(millis) / 1000)
            except ValueError:
                pass
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, (when - self._pacing.now()).total_seconds())

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
                    f"{self._service} returned a tool_use block for {block.name!r} whose "
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
            return f"{self._service} is rate limiting requests (HTTP 429{detail})"
        if status == 529:
            return f"{self._service} is overloaded (HTTP 529{detail})"
        if status >= 500:
            return f"{self._service} failed with a server error (HTTP {status}{detail})"
        if status in RETRYABLE_STATUSES:
            return f"{self._service} could not take the request for now (HTTP {status}{detail})"
        check = (
            "the model id, the role's bedrock:InvokeModel grant"
            if isinstance(self._client, anthropic.AnthropicBedrock)
            else "the API key, the model name"
        )
        return (
            f"{self._service} rejected the request as a client error (HTTP {status}{detail}): "
            f"check {check} and the request; retrying will not help until that is fixed"
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
        for name in ("api_key", "auth_token", "aws_secret_key", "aws_session_token"):
            secret = getattr(self._client, name, None)
            if isinstance(secret, str) and secret:
                text = text.replace(secret, "[redacted]")
        return text


def _usage(message: Message) -> Usage:
    """The call's usage as Ratchet counts it. The API's `input_tokens` already excludes the
    tokens read from or written to the prompt cache."""
    usage = getattr(message, "usage", None)
    if usage is None:
        return Usage(calls=1)
    return Usage(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=usage.cache_read_input_tokens or 0,
        cache_write_tokens=usage.cache_creation_input_tokens or 0,
        calls=1,
    )


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__
    if cause is None:
        return type(exc).__name__
    return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__


def _quote(text: str) -> str:
    if len(text) <= QUOTE_CHARS:
        return repr(text)
    return f"{text[:QUOTE_CHARS]!r}... ({len(text):,} chars)"
