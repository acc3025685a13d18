"""Your own `Model`, named `module:attr`: imported and checked when the run starts, run to done
offline, its usage counted; refused where import paths are not allowed (a deployment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

import ratchet
from ratchet.agents import AgentRegistry
from ratchet.ports import ModelReply, ModelRequest
from ratchet.runs import RunRequest, RunRequestInvalid, new_run
from ratchet.state import Done, RunStatus, ToolCall, Usage
from ratchet.tools import Agent, ToolContext, tool


class Note(BaseModel):
    text: str


@tool(side_effect=True)
def write_note(args: Note, ctx: ToolContext) -> str:
    """Write one note in the notebook."""
    return f"noted: {args.text}"


agent = Agent(name="notes", goal="Write the note 'hello', then finish.", tools=[write_note])
"""No scripted policy: only a model can drive it."""


class NoteTaker:
    """A third-party model in a few lines: writes one note, then reports done."""

    def decide(self, request: ModelRequest) -> ModelReply:
        if not request.view.messages:
            decision: ToolCall | Done = ToolCall(name="write_note", arguments={"text": "hello"})
        else:
            decision = Done(summary=f"wrote it ({request.view.last_result})")
        usage = Usage(input_tokens=len(request.prompt) // 4, output_tokens=12, calls=1)
        return ModelReply(decision=decision, usage=usage)


model = NoteTaker()
make_model = NoteTaker
not_a_model = 3
AGENT = f"{__name__}:agent"


def test_a_module_attr_model_runs_a_run_to_done_offline(tmp_path: Path) -> None:
    client = ratchet.connect(f"sqlite:///{tmp_path}/ratchet.db", environ={})
    try:
        run = client.run(run_id="own-model", agent=AGENT, model=f"{__name__}:model")
        history = client.history("own-model")
    finally:
        client.close()

    assert run.status is RunStatus.DONE
    assert run.summary == "wrote it (noted: hello)"
    assert run.model == f"{__name__}:model"
    assert run.usage.calls == 2
    assert run.usage.output_tokens == 24
    assert run.cost_usd is None  # no price is known for it
    assert [c.event for c in history] == ["created", "step", "finished"]
    assert all(c.usage is not None for c in history[1:])


def test_a_price_for_your_own_model_comes_from_ratchet_prices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({f"{__name__}:*": {"input": 1.0, "output": 2.0}}))
    monkeypatch.setenv("RATCHET_PRICES", str(prices))
    client = ratchet.connect(f"sqlite:///{tmp_path}/ratchet.db", environ={})
    try:
        run = client.run(run_id="priced", agent=AGENT, model=f"{__name__}:make_model")
    finally:
        client.close()

    expected = (run.usage.input_tokens * 1.0 + run.usage.output_tokens * 2.0) / 1_000_000
    assert run.cost_usd == pytest.approx(expected)


@pytest.mark.parametrize(
    ("reference", "problem"),
    [
        (f"{__name__}:not_a_model", "is not a ratchet.ports.Model"),
        (f"{__name__}:missing", "has no 'missing'"),
        ("no_such_module_here:model", "cannot import 'no_such_module_here'"),
    ],
)
def test_a_model_that_does_not_load_is_refused_at_start_naming_the_model_field(
    reference: str, problem: str
) -> None:
    with pytest.raises(RunRequestInvalid) as refused:
        new_run(RunRequest(agent=AGENT, model=reference), has_anthropic_key=False)

    assert refused.value.fields == ("model",)
    assert problem in str(refused.value)
    assert refused.value.for_cli().startswith(f"--model {reference}: ")


def test_a_deployment_refuses_module_attr_models() -> None:
    deployment = AgentRegistry.deployment(json.dumps({"notes": AGENT}))

    with pytest.raises(RunRequestInvalid) as refused:
        new_run(
            RunRequest(agent="notes", model=f"{__name__}:model"),
            has_anthropic_key=False,
            agents=deployment,
        )

    assert refused.value.fields == ("model",)
    assert "takes no module:attr models" in str(refused.value)


@pytest.mark.parametrize("name", ["gpt-4o", "bedrock:", "bedrock: spaced"])
def test_a_name_that_is_no_model_is_refused(name: str) -> None:
    with pytest.raises((RunRequestInvalid, ValueError)) as refused:
        new_run(RunRequest(agent=AGENT, model=name), has_anthropic_key=True)

    assert "model" in str(refused.value)


def test_a_bedrock_model_needs_no_anthropic_key() -> None:
    model = "bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0"

    state = new_run(RunRequest(agent=AGENT, model=model), has_anthropic_key=False)

    assert state.options.model == model
