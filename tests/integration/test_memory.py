"""A long run's memory: pinned facts and summarised steps reach the prompt at step 200, the
summary is written once (in the record of the step that pushed its steps out of the window),
and a retried step sees the same memory as its first attempt."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

import ratchet
from ratchet.client import Client
from ratchet.engine.memory import REMEMBER
from ratchet.errors import InjectedFault
from ratchet.faults import FaultPlan
from ratchet.ports import ModelRequest
from ratchet.runtime import open_runtime
from ratchet.state import Done, ToolCall
from ratchet.stored import head_json
from ratchet.tools import Agent, StepView, ToolContext, tool

FACT = "Order A-100 arrived damaged; refund it in full."
STEPS = 200


class Lookup(BaseModel):
    n: int = Field(ge=1)


@tool()
def lookup(args: Lookup, ctx: ToolContext) -> str:
    """Look up record n."""
    detail = "the damaged parcel was photographed" if args.n == 2 else "nothing unusual"
    return f"record {args.n}: {detail}"


def _policy(view: StepView) -> ToolCall | Done:
    if view.task == "summarise":
        # A scripted model's summary: keep what was said so far and the unusual findings.
        folded = [
            f"step {r.step}: {r.text}"
            for r in view.tool_results
            if r.step <= view.summarise_through and "unusual" not in r.text
        ]
        return Done(summary="\n".join([*(view.summary or "").splitlines(), *folded]))
    if view.step == 1:
        return ToolCall(name=REMEMBER, arguments={"fact": FACT})
    if view.step <= STEPS:
        return ToolCall(name="lookup", arguments={"n": view.step})
    return Done(summary="looked everything up")


class Recorder:
    """A `Model` that decides with the scripted policy and keeps every step prompt it saw."""

    def __init__(self) -> None:
        self.prompts: list[tuple[int, str]] = []

    def decide(self, request: ModelRequest) -> ToolCall | Done:
        if request.view.task == "step":
            self.prompts.append((request.view.step, request.prompt))
        return _policy(request.view)


recorder = Recorder()
digest_agent = Agent(name="digest-memory", goal="Look up every record.", tools=[lookup])
summary_agent = Agent(
    name="summary-memory",
    goal="Look up every record.",
    tools=[lookup],
    policy=_policy,
    model_summary=True,
    memory_window=5,
)


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    for name in ("ANTHROPIC_API_KEY", "RATCHET_STORE", "RATCHET_FAULT"):
        monkeypatch.delenv(name, raising=False)
    recorder.prompts.clear()
    with ratchet.connect(f"sqlite:///{tmp_path}/runs.db") as connected:
        yield connected


def _prompt_at(step: int) -> str:
    prompts = [prompt for at, prompt in recorder.prompts if at == step]
    assert prompts, f"no prompt was recorded at step {step}"
    return prompts[-1]


def _completed_steps(prompt: str) -> str:
    found = re.search(r"<completed_steps>\n(.*)\n</completed_steps>", prompt, re.DOTALL)
    assert found is not None
    return found.group(1)


MODEL = f"{__name__}:recorder"


def test_a_pinned_fact_and_a_summarised_step_are_in_the_prompt_at_step_200(client):
    run = client.run(
        run_id="long", agent=f"{__name__}:summary_agent", model=MODEL, max_steps=STEPS + 5
    )

    assert run.status == "done"
    assert run.step == STEPS
    prompt = _completed_steps(_prompt_at(STEPS))
    # The fact pinned at step 1, in its own section
    assert f"Facts to keep (pinned with remember):\n- {FACT}" in prompt
    # Step 2's finding, summarised ~200 steps ago and carried forward in every summary since
    assert "step 2: record 2: the damaged parcel was photographed" in prompt
    # The window: the last steps in full, between memory_window and twice that
    window = [int(n) for n in re.findall(r"^(\d+)\. lookup", prompt, re.MULTILINE)]
    assert window == list(range(window[0], STEPS))
    assert 5 <= len(window) < 10


def test_the_summary_is_recorded_once_in_the_step_that_evicted_its_steps(client):
    client.run(run_id="long", agent=f"{__name__}:summary_agent", model=MODEL, max_steps=STEPS + 5)

    records = [c for c in client.runtime.store.list_checkpoints("long") if c.event.kind == "step"]
    summarised = [c.event for c in records if getattr(c.event, "memory", None) is not None]
    # Every 5 steps, from the step whose window reached 10, the oldest 5 are folded once
    assert [e.memory_through for e in summarised] == list(range(5, STEPS - 4, 5))
    head = client.head("long")
    assert head.memory_through == summarised[-1].memory_through
    # The stored head keeps the summary, never the window's steps
    stored = head_json(head)
    assert "damaged parcel" in stored
    assert '"messages"' not in stored


def test_with_the_default_digest_the_fact_is_kept_and_the_window_is_the_last_steps(client):
    client.run(run_id="digest", agent=f"{__name__}:digest_agent", model=MODEL, max_steps=STEPS + 5)

    prompt = _completed_steps(_prompt_at(STEPS))
    assert f"- {FACT}" in prompt
    assert "- remember: 1 call (step 1)" in prompt
    assert f"- lookup: {STEPS - 7} calls (steps 2-{STEPS - 6})" in prompt
    window = [int(n) for n in re.findall(r"^(\d+)\. lookup", prompt, re.MULTILINE)]
    assert window == list(range(STEPS - 5, STEPS))


def test_a_retried_step_sees_the_same_memory_as_its_first_attempt(tmp_path, monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "RATCHET_STORE", "RATCHET_FAULT"):
        monkeypatch.delenv(name, raising=False)
    recorder.prompts.clear()
    runtime = open_runtime(f"sqlite:///{tmp_path}/runs.db")
    try:
        client = Client(runtime)
        client.start(
            run_id="r", agent=f"{__name__}:summary_agent", model=MODEL, max_steps=STEPS + 5
        )
        # The first attempt at step 150 dies after the model answered, before its decision
        # was recorded: the next attempt asks the model again.
        crashing = runtime.engine(
            worker_id="w", logger=client.logger, faults=FaultPlan.parse("raise:after_model@150")
        )
        while client.get("r").step < 149:
            crashing.advance("r")
        with pytest.raises(InjectedFault):
            crashing.advance("r")
        client.work("r")
        prompts = [prompt for at, prompt in recorder.prompts if at == 150]
    finally:
        runtime.close()

    assert len(prompts) == 2
    assert prompts[1] == prompts[0]
    assert FACT in prompts[0]
    assert "step 2: record 2: the damaged parcel was photographed" in prompts[0]
