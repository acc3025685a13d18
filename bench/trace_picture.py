"""The picture of a run's trace in docs/tracing.md: `python -m bench.trace_picture`.

Runs `bench.traced_agent` on a fresh local store with the SDK's in-memory exporter as the
global provider: step 2's tool fails its first attempt (a recorded failure, retried as attempt
2), step 3 asks a person, who approves through the client, and step 4 resumes. It writes the
exporter's spans as a waterfall, to docs/trace.svg (`--svg`) and as text on stdout: one row a
span, indented under its parent, its bar at its start and as long as it lasted (each step's
spans are drawn to the scale of the step; the gaps between steps are left out), and the links
the spans carry, drawn from the span that links to the span linked to.
"""

from __future__ import annotations

import argparse
import html
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from bench import traced_agent
from ratchet import tracing
from ratchet.client import Client
from ratchet.engine import Outcome
from ratchet.errors import StepAttemptFailed
from ratchet.runtime.local import LocalRuntime, LocalSettings

SVG = Path(__file__).resolve().parents[1] / "docs" / "trace.svg"
LOG = logging.getLogger("bench.trace_picture")
LOG.addHandler(logging.NullHandler())  # the failed attempt is the point: no warning for it
LOG.propagate = False


def traced_run() -> list[ReadableSpan]:
    """The spans of one run of the traced agent: a retry, an approval, done."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    with tempfile.TemporaryDirectory(prefix="ratchet-trace-") as root:
        runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{root}/ratchet.db"))
        client = Client(runtime, worker_id="worker-1", logger=LOG)
        run = client.start(
            run_id="notes-1",
            agent=traced_agent.AGENT,
            model=traced_agent.MODEL,
            input={"notes": f"{root}/notes.txt", "flaky_step": 2},
        )
        engine = runtime.engine(worker_id="worker-1", logger=LOG)
        for _ in range(20):
            try:
                outcome = engine.advance(run.run_id)
            except StepAttemptFailed:
                continue
            if outcome.outcome is Outcome.WAITING:
                client.approve(run.run_id, by="dana", comment="go ahead")
            elif outcome.outcome is not Outcome.CONTINUE:
                break
        runtime.close()
    provider.shutdown()
    return sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)


@dataclass(frozen=True)
class Row:
    span: ReadableSpan
    depth: int
    start: float
    """Where the bar starts, 0-1 across the drawing."""
    width: float
    label: str
    note: str


def rows(spans: Sequence[ReadableSpan]) -> list[Row]:
    """One row a span, children under their parent, in time order; each root span (a step,
    a settling) gets an equal share of the width, its children drawn to its scale."""
    ids = {s.context.span_id: s for s in spans if s.context is not None}
    children: dict[int, list[ReadableSpan]] = {}
    roots: list[ReadableSpan] = []
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        if parent is not None and parent in ids:
            children.setdefault(parent, []).append(span)
        else:
            roots.append(span)
    share = 1.0 / len(roots)
    out: list[Row] = []

    def add(span: ReadableSpan, depth: int, root: ReadableSpan, slot: int) -> None:
        begin, end = root.start_time or 0, root.end_time or 1
        scale = share / max(end - begin, 1)
        start = slot * share + ((span.start_time or 0) - begin) * scale
        width = max(((span.end_time or 0) - (span.start_time or 0)) * scale, 0.002)
        out.append(Row(span, depth, start, width, _label(span), _note(span, ids)))
        assert span.context is not None
        for child in children.get(span.context.span_id, []):
            add(child, depth + 1, root, slot)

    for slot, root in enumerate(roots):
        add(root, 0, root, slot)
    return out


def _label(span: ReadableSpan) -> str:
    attributes = dict(span.attributes or {})
    if span.name == "ratchet.step":
        return f"ratchet.step {attributes[tracing.STEP]} (attempt {attributes[tracing.ATTEMPT]})"
    return span.name


_NOTED = (
    (tracing.OUTCOME, "outcome"),
    (tracing.WAITS_FOR, "waits_for"),
    (tracing.DECISION, "decision"),
    (tracing.TOOL_OUTCOME, "outcome"),
    ("gen_ai.usage.input_tokens", "in"),
    ("gen_ai.usage.cache_read.input_tokens", "cache_read"),
    ("gen_ai.usage.output_tokens", "out"),
    ("ratchet.settled.how", "how"),
)


def _note(span: ReadableSpan, ids: dict[int, ReadableSpan]) -> str:
    attributes = dict(span.attributes or {})
    said: list[str] = []
    if span.status.status_code is StatusCode.ERROR:
        said.append(f"error {attributes.get(tracing.ERROR_TYPE)}")
    for key, short in _NOTED:
        if key in attributes:
            said.append(f"{short}={attributes[key]}")
    for link in span.links:
        linked = ids.get(link.context.span_id)
        if linked is not None:
            said.append(f"link -> {_label(linked)}")
    return ", ".join(said)


def text(drawn: Sequence[Row], *, width: int = 40) -> str:
    lines = []
    for row in drawn:
        start = round(row.start * width)
        bar = " " * start + "#" * max(1, round(row.width * width))
        name = "  " * row.depth + row.label
        lines.append(f"{name:<44} |{bar:<{width}}| {row.note}")
    return "\n".join(lines)


_COLOURS = {
    "ratchet.step": "#4c78a8",
    "chat": "#54a24b",
    "execute_tool": "#f58518",
    "ratchet.settle": "#b279a2",
}


def svg(drawn: Sequence[Row]) -> str:
    row_height, label_width, bar_width, note_width = 22, 270, 400, 500
    top = 34
    width = label_width + bar_width + note_width
    height = top + row_height * len(drawn) + 16
    index = {row.span.context.span_id: i for i, row in enumerate(drawn) if row.span.context}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, sans-serif" font-size="12">',
        '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="7" refY="4" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#b279a2"/></marker></defs>',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        '<text x="8" y="20" font-weight="bold">A run of bench.traced_agent: a failed attempt '
        "and its retry (step 2), a person's approval (step 3), the resume (step 4)</text>",
    ]
    for i, row in enumerate(drawn):
        y = top + i * row_height
        family = row.span.name.split(" ", 1)[0]
        colour = _COLOURS.get(family, "#9d9d9d")
        failed = row.span.status.status_code is StatusCode.ERROR
        x = label_width + row.start * bar_width
        parts.append(f'<text x="{8 + 14 * row.depth}" y="{y + 15}">{html.escape(row.label)}</text>')
        stroke = ' stroke="#d62728" stroke-width="2"' if failed else ""
        parts.append(
            f'<rect x="{x:.1f}" y="{y + 4}" width="{max(row.width * bar_width, 2):.1f}" '
            f'height="{row_height - 8}" rx="2" fill="{colour}"{stroke}/>'
        )
        parts.append(
            f'<text x="{label_width + bar_width + 10}" y="{y + 15}" '
            f'fill="{"#d62728" if failed else "#333"}">{html.escape(row.note)}</text>'
        )
        for link in row.span.links:
            target = index.get(link.context.span_id)
            if target is None:
                continue
            y_from, y_to = y + row_height / 2, top + target * row_height + row_height / 2
            x_from = x - 2
            x_to = label_width + drawn[target].start * bar_width + drawn[target].width * bar_width
            bend = (x_from + x_to) / 2
            parts.append(
                f'<path d="M{x_from:.1f},{y_from:.1f} C{bend:.1f},{y_from:.1f} '
                f'{bend:.1f},{y_to:.1f} {x_to + 4:.1f},{y_to:.1f}" fill="none" '
                'stroke="#b279a2" stroke-dasharray="4 3" marker-end="url(#arrow)"/>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--svg", type=Path, default=SVG, help="where to write the SVG")
    args = parser.parse_args(argv)
    drawn = rows(traced_run())
    args.svg.write_text(svg(drawn))
    print(text(drawn))


if __name__ == "__main__":
    main()
