"""What OpenTelemetry tracing costs a step (docs/tracing.md), as a ratio to a step untraced.

`python -m bench.trace_cost` runs the scripted agent of `bench.scripted_agent` (one tool call a
step, 200 B of arguments, 1 KB out) through the real local runtime and engine, on the store's
durable settings, in three modes, each in a process of its own (a process's tracer provider,
once set, stays; and `off` must be a process that never imported OpenTelemetry):

- `off`: no OpenTelemetry in the process, as a bare install runs;
- `api`: `opentelemetry.trace` imported, no provider configured (the API's proxy);
- `on`: the SDK's provider with a batch span processor and an exporter that drops what it is
  given: what exporting over OTLP costs the step's thread, less the network, which is the
  processor's thread's.

Modes alternate, `--rounds` times, so the shared machine's noise falls on each alike. Each
process takes `--warmup` steps, then times `--steps` steps: the wall time of `advance` (most of
it the durable SQLite commit) and this process's CPU time for them (where a span's cost is).
It prints the median per step of each, by mode, and each mode's ratio to `off`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODES = ("off", "api", "on")
RUN_ID = "trace-bench"
SPANS_PER_STEP = 3
"""The step's span, the model call's and the tool call's."""


def _configure(mode: str) -> Any:
    """Set the process up for `mode`; for `on`, the exporter (it counts what it was given)."""
    if mode == "off":
        return None
    from opentelemetry import trace

    if mode == "api":
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        exported = 0

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            Dropping.exported += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    exporter = Dropping()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider, exporter


def measure(mode: str, *, steps: int, warmup: int) -> dict[str, Any]:
    """Time `steps` steps after `warmup` in this process, set up for `mode`."""
    configured = _configure(mode)
    # Imported after the mode is set, as a worker under `opentelemetry-instrument` would be.
    import logging

    from bench.scripted_agent import new_scripted_run
    from ratchet.engine import Outcome
    from ratchet.runtime.local import LocalRuntime, LocalSettings

    logger = logging.getLogger("bench.trace_cost")
    with tempfile.TemporaryDirectory(prefix="ratchet-trace-bench-") as root:
        runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{Path(root) / 'r.db'}"))
        engine = runtime.engine(worker_id="bench", logger=logger)
        total = warmup + steps
        engine.start(new_scripted_run(RUN_ID, steps=total + 1, max_steps=total + 2))
        for _ in range(warmup):
            engine.advance(RUN_ID)
        wall: list[float] = []
        cpu: list[float] = []
        for _ in range(steps):
            wall_0, cpu_0 = time.perf_counter(), time.process_time()
            outcome = engine.advance(RUN_ID)
            cpu.append(time.process_time() - cpu_0)
            wall.append(time.perf_counter() - wall_0)
            assert outcome.outcome is Outcome.CONTINUE, outcome
        runtime.close()
    exported = None
    if configured is not None:
        provider, exporter = configured
        provider.force_flush()
        exported = exporter.exported
    return {
        "mode": mode,
        "wall_us": statistics.median(wall) * 1e6,
        "cpu_us": statistics.mean(cpu) * 1e6,
        "exported": exported,
        "opentelemetry_imported": any(m.startswith("opentelemetry") for m in sys.modules),
    }


def _child(mode: str, *, steps: int, warmup: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.trace_cost", "--child", mode]
    done = subprocess.run(
        [*command, "--steps", str(steps), "--warmup", str(warmup)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(*, steps: int, warmup: int, rounds: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            sample = _child(mode, steps=steps, warmup=warmup)
            if mode == "off" and sample["opentelemetry_imported"]:
                raise AssertionError("tracing off imported OpenTelemetry")
            if mode == "on" and sample["exported"] != (warmup + steps) * SPANS_PER_STEP:
                raise AssertionError(f"expected {SPANS_PER_STEP} spans a step: {sample}")
            samples[mode].append(sample)
    figures = {
        mode: {
            "wall_us": statistics.median(s["wall_us"] for s in samples[mode]),
            "cpu_us": statistics.median(s["cpu_us"] for s in samples[mode]),
        }
        for mode in MODES
    }
    off = figures["off"]
    print(f"tracing cost per step ({steps} steps x {rounds} rounds, scripted agent, SQLite):")
    for mode in MODES:
        fig = figures[mode]
        print(
            f"  {mode:>3}: wall {fig['wall_us']:8.0f} us (x{fig['wall_us'] / off['wall_us']:.2f})"
            f"   cpu {fig['cpu_us']:7.0f} us (x{fig['cpu_us'] / off['cpu_us']:.2f})"
        )
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, steps=args.steps, warmup=args.warmup)))
        return
    run(steps=args.steps, warmup=args.warmup, rounds=args.rounds)


if __name__ == "__main__":
    main()
