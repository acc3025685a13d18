"""What a step sends the model: Ratchet's step prompt against a loop that resends the transcript.

`python -m bench.tokens` runs the scripted agent of `bench.scripted_agent` (one tool call a
step, 200 B of arguments and a 1,024 B result) for 60 steps, Ratchet's default step cap,
through the real local runtime and engine in a scratch store. It is the agent every other bench
and `make compare` (on LangGraph and DBOS) run, so its steps weigh the same here as there; the
`migration` scenario's steps are of several kinds (copying batches, asking a person before the
drop, reporting), which would blur what grows with the step and what does not. Its scripted
policy decides each step; on its way to the policy, every request the engine asks the model is
rendered by the Anthropic adapter's own `AnthropicModel.body` into the keyword arguments of
`messages.create`, which is exactly what Claude would be sent: the tools, the agent's
instructions as the system prompt, and the step prompt with its bounded window (the last
`memory_window` steps in full) and the digest of the steps before it.

Beside it, the same run as a plain tool-use loop sends it (and LangGraph's `create_react_agent`,
whose state is the message list): the same tools and system prompt, the goal as the first user
turn, then for every earlier step the assistant's `tool_use` block and the user's `tool_result`
block, in the Messages API's shape, built from the calls and results the Ratchet run recorded.

For each step's request it prints:

- bytes: the request body as JSON (compact, UTF-8), as it goes over the wire;
- tokens: an estimate, bytes / 4. Claude's tokenizer is not published and the API's token
  counting needs the network. The estimate is the same for both, so the ratio holds; the
  scripted agent's data is hex, which tokenizers split finer than prose, so real counts are
  likely higher for both;
- cacheable: the share of the request a prompt cache could serve, the longest prefix of its
  content (tools, system prompt, messages, in the order the cache reads them, the
  `cache_control` markers left out) identical to the previous step's request. The API serves
  a prefix only up to a `cache_control` breakpoint: Ratchet's are after the tools and the
  system prompt; the transcript loop needs one on its last message to get its figure.

and over the whole run (steps 1 to 60, not only those shown): the total bytes and tokens, the
share of them a cache could serve and the ratio transcript / Ratchet; then the tokens a cache
could not serve, and the input tokens weighted by price with every cacheable prefix read from
the cache (`CACHE_READ_PRICE`). `--window` sets Ratchet's window, `--dump DIR` writes the six
request bodies shown as JSON. No network, no model:
every figure is the same on every run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.measure import DISCARD
from bench.scripted_agent import MAX_STEPS, new_scripted_run
from ratchet.adapters.anthropic_model import AnthropicModel, anthropic_client
from ratchet.engine import Binder, Binding, Engine, Outcome
from ratchet.model_names import DEFAULT_CLAUDE_MODEL
from ratchet.observability import json_logger
from ratchet.ports import Model, ModelReply, ModelRequest
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import MAX_MEMORY_WINDOW, RECENT_STEPS, Decision, RunState
from ratchet.tools import Handler, ToolContext, ToolResult

RUN_ID = "bench-tokens"
STEPS = 60
"""Ratchet's default step cap (`RunOptions.max_steps`)."""
SHOWN_STEPS = (10, 30, 60)
BYTES_PER_TOKEN = 4
CACHE_READ_PRICE = 0.1
"""A token read from the prompt cache costs a tenth of an input token on Anthropic's price
list; the premium on a cache write (1.25x) is left out of the weighted figure."""
OFFLINE_KEY = "not-used"
"""`AnthropicModel.body` only renders; nothing is ever sent with this client."""

COLUMNS = (
    "step",
    "Ratchet bytes",
    "Ratchet ~tokens",
    "Ratchet cacheable",
    "transcript bytes",
    "transcript ~tokens",
    "transcript cacheable",
    "transcript/Ratchet",
)


# --- Ratchet's requests, from the real engine and the real adapter ---------------------------


class RecordingModel:
    """Keeps every request the engine asks the model, then lets the agent's own model (its
    scripted policy) decide, so the run goes on exactly as it would without the recording."""

    def __init__(self, model: Model, requests: list[ModelRequest]) -> None:
        self._model = model
        self._requests = requests

    def decide(self, request: ModelRequest) -> Decision | ModelReply:
        self._requests.append(request)
        return self._model.decide(request)


@dataclass
class Recorded:
    """A run's model requests, in order (request i decides step i + 1), and each step's tool
    output whole, as the tool returned it (the window shows only a preview of each)."""

    requests: list[ModelRequest] = field(default_factory=list)
    outputs: dict[int, str] = field(default_factory=dict)

    def binder(self, bind: Binder) -> Binder:
        def bind_recorded(state: RunState) -> Binding:
            binding = bind(state)
            tools = [replace(t, handler=self._recorded(t.handler)) for t in binding.agent.tools]
            return replace(
                binding,
                agent=replace(binding.agent, tools=tools),
                model=RecordingModel(binding.model, self.requests),
            )

        return bind_recorded

    def _recorded(self, handler: Handler[Any]) -> Handler[Any]:
        # The scripted agent's tool is sync: what the handler returns is its whole answer.
        def recorded(args: Any, ctx: ToolContext) -> ToolResult | str | Awaitable[ToolResult | str]:
            result = handler(args, ctx)
            if isinstance(result, ToolResult):
                self.outputs[ctx.step] = result.output
            elif isinstance(result, str):
                self.outputs[ctx.step] = result
            return result

        return recorded


def record_run(*, steps: int = STEPS, window: int = RECENT_STEPS) -> Recorded:
    """Steps 1 to `steps` of a run of the scripted agent whose window is `window` steps, taken
    by the real engine on a scratch local store, with what the model was asked recorded."""
    recorded = Recorded()
    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as scratch:
        runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{Path(scratch) / 'r.db'}"))
        try:
            engine = Engine(
                store=runtime.store,
                ledger=runtime.ledger,
                blobs=runtime.blobs,
                bind=recorded.binder(runtime.bind),
                worker_id="bench",
                logger=json_logger(DISCARD),
            )
            run = new_scripted_run(RUN_ID, steps=steps, max_steps=steps)
            # The window is a run option, taken from the agent at start (`Agent.memory_window`).
            run = run.model_copy(
                update={"options": run.options.model_copy(update={"memory_window": window})}
            )
            engine.start(run)
            for expected in range(1, steps + 1):
                outcome = engine.advance(RUN_ID)
                if outcome.outcome is not Outcome.CONTINUE or outcome.step != expected:
                    raise RuntimeError(f"expected step {expected} to complete, got {outcome}")
        finally:
            runtime.close()
    if len(recorded.requests) != steps or len(recorded.outputs) != steps:
        raise RuntimeError(
            f"expected {steps} model requests and tool outputs, recorded "
            f"{len(recorded.requests)} and {len(recorded.outputs)}"
        )
    return recorded


def ratchet_bodies(requests: Sequence[ModelRequest]) -> list[dict[str, Any]]:
    """What the Anthropic adapter sends for each request."""
    adapter = AnthropicModel(anthropic_client(OFFLINE_KEY), DEFAULT_CLAUDE_MODEL)
    return [adapter.body(request) for request in requests]


# --- the same run as a loop that sends the whole transcript ----------------------------------


def transcript_bodies(recorded: Recorded, bodies: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each of Ratchet's requests, what a plain tool-use loop sends at the same step: the
    same tools and system prompt, and every earlier call and its whole output as messages."""
    calls: dict[int, tuple[str, dict[str, Any]]] = {}
    transcripts = []
    for request, body in zip(recorded.requests, bodies, strict=True):
        # Each request's window holds the step just taken: collect the run's calls from there,
        # as the engine recorded them.
        for message in request.view.messages:
            calls[message.step] = (message.tool, message.arguments)
        messages: list[dict[str, Any]] = [{"role": "user", "content": request.view.goal}]
        for step in range(1, request.view.step):
            tool, arguments = calls[step]
            tool_use_id = f"toolu_{step:06d}"
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": tool_use_id, "name": tool, "input": arguments}
                    ],
                }
            )
            result = {"type": "tool_result", "tool_use_id": tool_use_id}
            messages.append(
                {"role": "user", "content": [{**result, "content": recorded.outputs[step]}]}
            )
        transcripts.append({**body, "messages": messages})
    return transcripts


# --- measuring a request ---------------------------------------------------------------------


def wire_bytes(body: dict[str, Any]) -> int:
    """The request as JSON over the wire: the SDK sends `extra_body`'s fields in the body."""
    sent = {key: value for key, value in body.items() if key != "extra_body"}
    sent.update(body.get("extra_body", {}))
    return len(_json(sent))


def tokens(size: int) -> int:
    return round(size / BYTES_PER_TOKEN)


def cache_order(body: dict[str, Any]) -> bytes:
    """The request's content in the order a prompt cache reads it, without the markers."""
    return _json(_unmarked([body.get("tools", []), body.get("system", []), body["messages"]]))


def cacheable_share(previous: dict[str, Any] | None, current: dict[str, Any]) -> float:
    """The share of `current` that is the longest prefix identical to `previous`."""
    if previous is None:
        return 0.0
    before, now = cache_order(previous), cache_order(current)
    shared = 0
    for a, b in zip(before, now, strict=False):
        if a != b:
            break
        shared += 1
    return shared / len(now)


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(item) for item in value]
    return value


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class StepInput:
    step: int
    bytes: int
    cacheable: float

    @property
    def tokens(self) -> int:
        return tokens(self.bytes)

    @property
    def uncached_tokens(self) -> float:
        return self.tokens * (1 - self.cacheable)


def step_inputs(bodies: Sequence[dict[str, Any]]) -> list[StepInput]:
    previous: dict[str, Any] | None = None
    inputs = []
    for step, body in enumerate(bodies, start=1):
        inputs.append(StepInput(step, wire_bytes(body), cacheable_share(previous, body)))
        previous = body
    return inputs


@dataclass(frozen=True)
class Comparison:
    window: int
    ratchet: list[StepInput]
    transcript: list[StepInput]


def compare(*, steps: int = STEPS, window: int = RECENT_STEPS) -> Comparison:
    comparison, _, _ = _compare(steps=steps, window=window)
    return comparison


def _compare(
    *, steps: int, window: int
) -> tuple[Comparison, list[dict[str, Any]], list[dict[str, Any]]]:
    recorded = record_run(steps=steps, window=window)
    ratchet = ratchet_bodies(recorded.requests)
    transcript = transcript_bodies(recorded, ratchet)
    comparison = Comparison(window, step_inputs(ratchet), step_inputs(transcript))
    return comparison, ratchet, transcript


# --- the report ------------------------------------------------------------------------------


def table(comparison: Comparison, shown: Sequence[int] = SHOWN_STEPS) -> str:
    rows: list[tuple[str, ...]] = [COLUMNS]
    for step in shown:
        ours, theirs = comparison.ratchet[step - 1], comparison.transcript[step - 1]
        rows.append(
            (
                str(step),
                f"{ours.bytes:,}",
                f"{ours.tokens:,}",
                f"{ours.cacheable:.1%}",
                f"{theirs.bytes:,}",
                f"{theirs.tokens:,}",
                f"{theirs.cacheable:.1%}",
                f"{theirs.bytes / ours.bytes:.2f}x",
            )
        )
    ours_bytes = sum(s.bytes for s in comparison.ratchet)
    theirs_bytes = sum(s.bytes for s in comparison.transcript)
    ours_cached = _cached_share(comparison.ratchet)
    theirs_cached = _cached_share(comparison.transcript)
    rows.append(
        (
            f"1-{len(comparison.ratchet)}",
            f"{ours_bytes:,}",
            f"{sum(s.tokens for s in comparison.ratchet):,}",
            f"{ours_cached:.1%}",
            f"{theirs_bytes:,}",
            f"{sum(s.tokens for s in comparison.transcript):,}",
            f"{theirs_cached:.1%}",
            f"{theirs_bytes / ours_bytes:.2f}x",
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    return "\n".join(lines)


def _cached_share(inputs: Sequence[StepInput]) -> float:
    """Over a run: the share of all its tokens a cache could serve."""
    return 1 - sum(s.uncached_tokens for s in inputs) / sum(s.tokens for s in inputs)


def _weighted(inputs: Sequence[StepInput]) -> float:
    """A run's input tokens if every cacheable prefix were read from the cache."""
    return sum(
        s.uncached_tokens + (s.tokens - s.uncached_tokens) * CACHE_READ_PRICE for s in inputs
    )


def report(comparison: Comparison, shown: Sequence[int] = SHOWN_STEPS) -> str:
    steps = len(comparison.ratchet)
    ours = sum(s.uncached_tokens for s in comparison.ratchet)
    theirs = sum(s.uncached_tokens for s in comparison.transcript)
    return "\n".join(
        [
            f"What the model is sent at each step of the scripted agent (bench.scripted_agent), "
            f"{steps} steps, Ratchet's window {comparison.window} steps",
            "Ratchet: the step prompt as AnthropicModel.body renders it; transcript: every "
            "earlier tool_use and tool_result as messages",
            f"~tokens = bytes / {BYTES_PER_TOKEN} (an estimate: no tokenizer offline); "
            "cacheable = longest prefix identical to the previous step's request",
            "",
            table(comparison, shown),
            "",
            f"tokens a cache could not serve, steps 1-{steps}: Ratchet {ours:,.0f}, transcript "
            f"{theirs:,.0f} ({theirs / ours:.2f}x)",
            f"input tokens weighted by price, a cache read at {CACHE_READ_PRICE:g}x: Ratchet "
            f"{_weighted(comparison.ratchet):,.0f}, transcript "
            f"{_weighted(comparison.transcript):,.0f} "
            f"({_weighted(comparison.transcript) / _weighted(comparison.ratchet):.2f}x)",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="steps in the run")
    parser.add_argument(
        "--window", type=int, default=RECENT_STEPS, help="Ratchet's window (memory_window)"
    )
    parser.add_argument(
        "--dump",
        type=Path,
        help="also write each shown step's two request bodies as JSON into this directory",
    )
    args = parser.parse_args(argv)
    shown = [step for step in SHOWN_STEPS if step <= args.steps]
    if not SHOWN_STEPS[0] <= args.steps <= MAX_STEPS:
        parser.error(f"--steps must be from {SHOWN_STEPS[0]} to {MAX_STEPS:,}")
    if not 1 <= args.window <= MAX_MEMORY_WINDOW:
        parser.error(f"--window must be from 1 to {MAX_MEMORY_WINDOW} (Agent.memory_window)")
    comparison, ratchet, transcript = _compare(steps=args.steps, window=args.window)
    print(report(comparison, shown))
    if args.dump is not None:
        args.dump.mkdir(parents=True, exist_ok=True)
        for step in shown:
            for name, bodies in (("ratchet", ratchet), ("transcript", transcript)):
                path = args.dump / f"{name}-step-{step}.json"
                path.write_text(json.dumps(bodies[step - 1], indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
