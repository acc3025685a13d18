"""OpenTelemetry spans of a run's steps: one span a step attempt, a child span for the model
call and one for the tool call (docs/tracing.md).

Off unless the process has a tracer provider (the global one, configured as OTel usually is:
`opentelemetry-instrument`, the SDK, the ADOT Lambda layer). Off costs a dictionary lookup a
span: nothing of OpenTelemetry is imported here, and a process where nobody imported
`opentelemetry.trace` cannot have configured it. Only the API (`opentelemetry.trace`) is used;
the exporters are the user's.

A step that parks keeps its span's context (`SpanLink`, hex) in its record, and the fold keeps
it on the head until the next step commits, so the step that resumes, however long after and on
whichever machine, links to the step that parked, and the settling of the wait links to it too.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from ratchet.model_names import BEDROCK_PREFIX, ModelKind, model_kind
from ratchet.state import SpanLink, Usage

if TYPE_CHECKING:
    from opentelemetry.trace import Span as OtelSpan
    from opentelemetry.trace import Tracer

TRACER_NAME = "ratchet"
RUN_ID = "ratchet.run_id"
STEP = "ratchet.step"
ATTEMPT = "ratchet.attempt"
AGENT = "ratchet.agent"
OUTCOME = "ratchet.outcome"
IDEMPOTENCY_KEY = "ratchet.idempotency_key"
TOOL_OUTCOME = "ratchet.tool.outcome"
DECISION = "ratchet.decision"
"""How the step got its decision: `model` (called now), `reused` (recorded by an earlier
attempt), `redo` (a person said an at-most-once call did not run)."""
WAITS_FOR = "ratchet.waits_for"
ERROR_TYPE = "error.type"

Attributes = Mapping[str, str | int | float | bool]

_PROVIDERS = {ModelKind.ANTHROPIC: "anthropic", ModelKind.BEDROCK: "aws.bedrock"}


class Span:
    """One of Ratchet's spans, or nothing when tracing is off (`OFF`): the engine sets what it
    learns on it either way."""

    def __init__(self, span: OtelSpan | None = None) -> None:
        self._span = span

    def set(self, attributes: Attributes) -> None:
        if self._span is not None:
            self._span.set_attributes(attributes)

    def failed(self, error: BaseException | str) -> None:
        """Mark the span failed: with the exception recorded, or a reason (a run failed by an
        error the engine kept rather than raised)."""
        if self._span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        if isinstance(error, BaseException):
            self._span.record_exception(error)
            self._span.set_attribute(ERROR_TYPE, type(error).__name__)
            self._span.set_status(Status(StatusCode.ERROR, str(error)))
        else:
            self._span.set_attribute(ERROR_TYPE, "RunFailed")
            self._span.set_status(Status(StatusCode.ERROR, error))

    def link(self) -> SpanLink | None:
        """This span's context, to keep in a record (None when off)."""
        if self._span is None:
            return None
        context = self._span.get_span_context()
        return SpanLink(trace_id=f"{context.trace_id:032x}", span_id=f"{context.span_id:016x}")


OFF = Span()


def tracer() -> Tracer | None:
    """The tracer of the global provider, or None when no provider is configured."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    # A provider hands out a new tracer each call: keep one per provider.
    cached = _tracers.get(id(provider))
    if cached is None or cached[0] is not provider:
        cached = _tracers[id(provider)] = (provider, provider.get_tracer(TRACER_NAME))
    return cached[1]


_tracers: dict[int, tuple[Any, Tracer]] = {}


@contextmanager
def _span(
    name: str,
    attributes: Attributes,
    *,
    client: bool = False,
    links_to: SpanLink | None = None,
    link_attributes: Attributes | None = None,
) -> Iterator[Span]:
    active = tracer()
    if active is None:
        yield OFF
        return
    from opentelemetry import trace

    links = []
    if links_to is not None:
        parked = trace.SpanContext(
            int(links_to.trace_id, 16),
            int(links_to.span_id, 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
        links.append(trace.Link(parked, link_attributes))
    kind = trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL
    with active.start_as_current_span(
        name,
        kind=kind,
        attributes=attributes,
        links=links,
        # `Span.failed` records what fails, with its type; an exception passing through
        # (a crash, a failed attempt raised) is recorded there too.
        record_exception=False,
        set_status_on_exception=False,
    ) as otel_span:
        span = Span(otel_span)
        try:
            yield span
        except BaseException as error:
            span.failed(error)
            raise


def _where(run_id: str, step: int, attempt: int) -> dict[str, str | int | float | bool]:
    return {RUN_ID: run_id, STEP: step, ATTEMPT: attempt}


def step_span(
    run_id: str, step: int, attempt: int, *, agent: str, resumes: SpanLink | None
) -> AbstractContextManager[Span]:
    """The span of one attempt at a step (`ratchet.step`); `resumes`: the span of the step
    that parked the run, which this one resumes (a Link to it)."""
    return _span(
        "ratchet.step",
        {**_where(run_id, step, attempt), AGENT: agent},
        links_to=resumes,
        link_attributes={"ratchet.link": "resumes", STEP: step - 1},
    )


def model_span(
    run_id: str, step: int, attempt: int, *, model: str, task: str
) -> AbstractContextManager[Span]:
    """The span of one model call, by the GenAI semantic conventions (`chat <model>`)."""
    kind = model_kind(model)
    requested = model[len(BEDROCK_PREFIX) :] if kind is ModelKind.BEDROCK else model
    attributes = {
        **_where(run_id, step, attempt),
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": requested,
        "ratchet.model.task": task,
    }
    provider = _PROVIDERS.get(kind) if kind is not None else None
    if provider is not None:
        attributes["gen_ai.provider.name"] = provider
    return _span(f"chat {requested}", attributes, client=True)


def usage_attributes(usage: Usage) -> dict[str, str | int | float | bool]:
    """A model call's usage as the GenAI conventions name it: `input_tokens` counts every
    input token, cached ones included; the cache's reads and writes are counted apart too."""
    return {
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
    }


def tool_span(
    run_id: str, step: int, attempt: int, *, tool: str, key: str
) -> AbstractContextManager[Span]:
    """The span of one tool call (`execute_tool <tool>`), with the step's idempotency key."""
    return _span(
        f"execute_tool {tool}",
        {
            **_where(run_id, step, attempt),
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": key,
            IDEMPOTENCY_KEY: key,
        },
    )


def settle_span(
    run_id: str, step: int, *, how: str, parked: SpanLink | None
) -> AbstractContextManager[Span]:
    """The span of settling a waiting run's wait (a person's decision, an event, a time),
    linked to the span of the step that parked it."""
    return _span(
        "ratchet.settle",
        {RUN_ID: run_id, STEP: step, "ratchet.settled.how": how},
        links_to=parked,
        link_attributes={"ratchet.link": "settles", STEP: step},
    )
