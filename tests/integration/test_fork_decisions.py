"""A fork decides for itself: a person's answer to a fork of a waiting run reaches the fork's
next step, its model is asked afresh at every step after the fork point (never the source's
recorded decisions), and `replay` renders, for every step of the source and of the fork, the
prompt its model was given (issue 22 item 1; issue 16, "a fork replaying the source's
decisions"). On SQLite, through the Python client, with the engine driven step by step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

import ratchet
from ratchet.client import Client
from ratchet.ports import ModelRequest
from ratchet.state import Done, RunStatus, ToolCall
from ratchet.tools import Agent, StepView, ToolContext, ToolResult, ask_person, tool

ASK_AT = 3
"""The step that asks a person whether to apply the risky change."""


class Change(BaseModel):
    n: int = Field(ge=1)


class Ask(BaseModel):
    what: str


@tool(side_effect=True)
def apply(args: Change, ctx: ToolContext) -> str:
    """Apply change n."""
    return f"change {args.n} applied"


@tool()
def ask(args: Ask, ctx: ToolContext) -> ToolResult:
    """Ask a person."""
    return ask_person(args.what)


@tool(side_effect=True)
def risky(args: Change, ctx: ToolContext) -> str:
    """The change a person must approve first."""
    return f"risky change {args.n} applied"


class Chooser:
    """A `Model` that keeps the prompt of every call by run and step, and chooses its change
    numbers from `offset`: a test raises it to have a fork's model choose otherwise than the
    source's did."""

    def __init__(self) -> None:
        self.prompts: dict[tuple[str, int], str] = {}
        self.calls: dict[str, int] = {}
        self.offset = 0

    def decide(self, request: ModelRequest) -> ToolCall | Done:
        view = request.view
        self.prompts[(view.run_id, view.step)] = request.prompt
        self.calls[view.run_id] = self.calls.get(view.run_id, 0) + 1
        return _choose(view, self.offset)


def _choose(view: StepView, offset: int) -> ToolCall | Done:
    if view.step < ASK_AT:
        return ToolCall(name="apply", arguments={"n": view.step + offset})
    if view.step == ASK_AT:
        return ToolCall(name="ask", arguments={"what": "apply the risky change?"})
    if view.step == ASK_AT + 1 and (view.last_result or "").startswith("Approved"):
        return ToolCall(name="risky", arguments={"n": view.step + offset})
    if view.step <= ASK_AT + 2:
        return ToolCall(name="apply", arguments={"n": view.step + offset})
    return Done(summary=f"finished after: {view.last_result}")


chooser = Chooser()
MODEL = f"{__name__}:chooser"
gated = Agent(
    name="gated", goal="Apply the changes; ask before the risky one.", tools=[apply, ask, risky]
)
AGENT = f"{__name__}:gated"


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    for name in ("ANTHROPIC_API_KEY", "RATCHET_STORE", "RATCHET_FAULT"):
        monkeypatch.delenv(name, raising=False)
    chooser.prompts.clear()
    chooser.calls.clear()
    chooser.offset = 0
    with ratchet.connect(f"sqlite:///{tmp_path}/runs.db") as connected:
        yield connected


def _waiting_source(client: Client) -> ratchet.Run:
    waiting = client.run(run_id="s", agent=AGENT, model=MODEL)
    assert (waiting.status, waiting.step) == (RunStatus.WAITING, ASK_AT)
    return waiting


def _tools(client: Client, run_id: str) -> list[str | None]:
    return [c.tool for c in client.history(run_id) if c.event == "step"]


def test_approving_a_fork_of_a_waiting_run_reaches_its_next_step(client):
    _waiting_source(client)
    fork = client.fork("s", from_step=ASK_AT, run_id="f")
    assert fork.status is RunStatus.WAITING

    client.approve("f", by="dana")
    done = client.work("f")

    assert done.status is RunStatus.DONE
    assert _tools(client, "f") == ["risky", "apply"]
    assert f"{ASK_AT}. ask" in chooser.prompts[("f", ASK_AT + 1)]
    assert "<last_result>Approved by dana.</last_result>" in chooser.prompts[("f", ASK_AT + 1)]
    # The source still waits; rejecting it takes the other branch.
    client.reject("s", by="lee", comment="not today")
    assert client.work("s").status is RunStatus.DONE
    assert _tools(client, "s") == ["apply", "apply", "ask", "apply", "apply"]


def test_replay_equals_the_prompt_each_model_call_was_given_in_the_source_and_its_forks(client):
    _waiting_source(client)
    client.fork("s", from_step=ASK_AT, run_id="waiting-fork")
    client.approve("waiting-fork", by="dana", comment="go")
    client.work("waiting-fork")
    client.reject("s", by="lee")
    client.work("s")
    client.fork("s", from_step=ASK_AT + 1, run_id="later-fork")  # after the decision
    client.work("later-fork")
    client.fork("s", from_step=1, run_id="early-fork")  # before anyone was asked
    client.approve(client.work("early-fork").run_id, by="kim")
    client.work("early-fork")

    compared = 0
    for run_id in ("s", "waiting-fork", "later-fork", "early-fork"):
        assert client.get(run_id).status is RunStatus.DONE, run_id
        first = client.history(run_id)[0].step + 1  # a fork's own steps start after its point
        for step in range(first, client.get(run_id).step + 1):
            assert client.replay(run_id, step=step) == chooser.prompts[(run_id, step)], (
                run_id,
                step,
            )
            compared += 1
    assert compared == 5 + 2 + 1 + 4


def test_a_fork_asks_its_own_model_at_every_step_after_the_fork_point(client):
    # Given a finished source, and a model that would now choose other changes
    _waiting_source(client)
    client.approve("s", by="dana")
    source = client.work("s")
    assert source.status is RunStatus.DONE
    chooser.offset = 100
    at = 1

    fork = client.fork("s", from_step=at, run_id="f")

    # Then the fork has no decision on record before its first step runs: neither the
    # source's nor any of its own
    ledger = client.runtime.ledger
    assert all(ledger.get(f"f/step-{n}") is None for n in range(1, source.max_steps + 1))
    assert fork.step == at
    client.approve(client.work("f").run_id, by="dana")
    done = client.work("f")
    assert done.status is RunStatus.DONE
    # One model call per step after the fork point, and one to say it is done
    assert chooser.calls["f"] == done.step - at + 1
    steps = [c for c in client.history("f") if c.event == "step"]
    assert [(c.tool, c.arguments) for c in steps] == [
        ("apply", {"n": 102}),
        ("ask", {"what": "apply the risky change?"}),
        ("risky", {"n": 104}),
        ("apply", {"n": 105}),
    ]
    assert all(ledger.get(f"f/step-{n}") is not None for n in range(at + 1, done.step + 1))
    assert ledger.get(f"f/step-{at}") is None
