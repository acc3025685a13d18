"""The trace tests' provider and readers: the SDK's in-memory exporter as the process's global
tracer provider for one test (`spans`), and the finished spans picked by name, step, parent."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ratchet import tracing


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The process's global tracer provider, for this test only: an SDK provider exporting
    to memory (as `opentelemetry-instrument` would set one, exporting over OTLP)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exporter
    provider.shutdown()


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def attrs(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def step_span(spans: Sequence[ReadableSpan], step: int, attempt: int = 1) -> ReadableSpan:
    (found,) = [
        s
        for s in named(spans, "ratchet.step")
        if attrs(s)[tracing.STEP] == step and attrs(s)[tracing.ATTEMPT] == attempt
    ]
    return found


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]
