"""A stand-in for the Anthropic Messages API that bills: it answers every request with a call
of the budget agent's tool, reports usage sized by what it was sent, and counts every request
it received as billed, answered or not (the provider bills a call whose client died waiting).
It can hold each answer until the test releases it, so a test kills a worker in the middle of
a model call by a condition (the request arrived), not by a guess of the time."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from ratchet.pricing import prices_for
from ratchet.tools import ModelReply, ModelRequest, ToolCall, Usage
from tests.integration.fake_messages_api import (
    FakeMessagesApi,
    RecordedRequest,
    ScriptedResponse,
    tool_use_response,
)

MODEL = "claude-haiku-4-5"
OUTPUT_TOKENS = 200
"""What each answer reports as output: a short tool call."""


def usage_of(body: dict[str, Any] | None) -> dict[str, int]:
    """The usage the stand-in reports: a token per 4 bytes of what it was sent (as the real
    API counts English text, roughly), and `OUTPUT_TOKENS` out."""
    sent = len(json.dumps(body or {}, ensure_ascii=False).encode("utf-8"))
    return {
        "input_tokens": sent // 4,
        "output_tokens": OUTPUT_TOKENS,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def cost_of(usage: dict[str, int]) -> float:
    prices = prices_for(MODEL)
    assert prices is not None
    return prices.cost(
        {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}
    )


class BillingMessagesApi(FakeMessagesApi):
    """Every request answered with `write_note`; `billed` is what each request cost."""

    def __init__(
        self, *, hold: bool = False, on_request: Callable[[RecordedRequest], None] | None = None
    ) -> None:
        super().__init__()
        self.hold = hold
        self.on_request = on_request
        self.billed: list[float] = []
        self._held: list[threading.Event] = []

    def start(self) -> BillingMessagesApi:
        super().start()
        return self

    def __enter__(self) -> BillingMessagesApi:
        return self.start()

    @property
    def billed_usd(self) -> float:
        with self._lock:
            return round(sum(self.billed), 6)

    def received(self) -> int:
        with self._lock:
            return len(self.billed)

    def wait_for_request(self, count: int, *, deadline_s: float = 60.0) -> None:
        """Wait until the `count`th request has arrived (a condition, with a generous bound)."""
        ends = time.monotonic() + deadline_s
        while self.received() < count:
            assert time.monotonic() < ends, f"request {count} never came"
            time.sleep(0.01)

    def release_all(self) -> None:
        with self._lock:
            for event in self._held:
                event.set()

    def stop(self) -> None:
        self.release_all()
        super().stop()

    def _next_response(self, request: RecordedRequest) -> tuple[ScriptedResponse, threading.Event]:
        if self.on_request is not None:
            self.on_request(request)
        usage = usage_of(request.body)
        answer = tool_use_response("write_note", {"text": "a note"}, usage=usage)
        release = threading.Event()
        with self._lock:
            self._requests.append(request)
            self.billed.append(cost_of(usage))
            if self.hold:
                self._held.append(release)
            else:
                release.set()
        return dataclasses.replace(answer, hang=self.hold), release


METERED = "tests.budget_support:metered"
"""A model of a deployment's own that reports usage, for runs where no HTTP stand-in fits (the
step Lambda on moto): priced by `METERED_PRICES` in `RATCHET_PRICES`."""
METERED_PRICES = {METERED: {"input": 1, "output": 5}}


class MeteredModel:
    """Always writes a note, and reports a token per 4 bytes of the prompt and instructions in,
    `OUTPUT_TOKENS` out; `billed` is what each call cost at `METERED_PRICES`."""

    def __init__(self) -> None:
        self.billed: list[float] = []
        self._lock = threading.Lock()

    def decide(self, request: ModelRequest) -> ModelReply:
        sent = len((request.prompt + request.instructions).encode("utf-8"))
        usage = Usage(input_tokens=sent // 4, output_tokens=OUTPUT_TOKENS, calls=1)
        with self._lock:
            self.billed.append((usage.input_tokens * 1 + usage.output_tokens * 5) / 1_000_000)
        return ModelReply(
            decision=ToolCall(name="write_note", arguments={"text": "a note"}), usage=usage
        )

    @property
    def billed_usd(self) -> float:
        with self._lock:
            return round(sum(self.billed), 6)


metered = MeteredModel()
