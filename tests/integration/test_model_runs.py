"""Runs on a SQLite store driven by Claude through the real SDK, against the local fake of the
Messages API: rate limits are waited out inside the attempt, a storm past the budget counts one
failed attempt, usage lands in the step records, the run's totals, `ratchet status --json` and
the runs API, and the request carries the agent's instructions and the step prompt as it is."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from pydantic import BaseModel, SecretStr

import ratchet
from ratchet.cli.inspection import status_payload
from ratchet.client import Runtime
from ratchet.engine import Binding, Engine, Outcome
from ratchet.engine.fold import replay
from ratchet.engine.prompt import render_step_prompt, view_of
from ratchet.errors import StepAttemptFailed
from ratchet.runs import RunRequest, new_run
from ratchet.runtime import open_runtime
from ratchet.runtime.models import build_model
from ratchet.state import AttemptFailed, RunState, RunStatus, StepCompleted, Usage
from ratchet.tools import Agent, ToolContext, tool
from ratchet.web.runs import RunView
from tests.integration.fake_messages_api import (
    FakeClock,
    FakeMessagesApi,
    overloaded,
    rate_limited,
    text_response,
    tool_use_response,
)

MODEL = "claude-haiku-4-5"
INSTRUCTIONS = "You keep a tidy notebook. Write each note once."


class Note(BaseModel):
    text: str


@tool(side_effect=True)
def write_note(args: Note, ctx: ToolContext) -> str:
    """Write one note in the notebook."""
    return f"noted: {args.text}"


agent = Agent(
    name="notes",
    goal="Write the note 'hello', then finish.",
    tools=[write_note],
    instructions=INSTRUCTIONS,
    max_tokens=300,
    model_retry_seconds=10.0,
    step_timeout_seconds=None,
)
REFERENCE = f"{__name__}:agent"


@dataclass
class Setup:
    api: FakeMessagesApi
    runtime: Runtime
    clock: FakeClock = field(default_factory=FakeClock)
    agent: Agent = agent
    steps_rendered: list[RunState] = field(default_factory=list)

    def engine(self) -> Engine:
        def bind(state: RunState) -> Binding:
            model = build_model(
                self.agent,
                state.options.model,
                anthropic_api_key=SecretStr("test-key"),
                anthropic_base_url=self.api.url,
                pacing=self.clock.pacing(),
            )
            return Binding(self.agent, model)

        return Engine(
            store=self.runtime.store,
            ledger=self.runtime.ledger,
            blobs=self.runtime.blobs,
            bind=bind,
            worker_id="test-worker",
            logger=logging.getLogger("test_model_runs"),
            sleep=lambda _: None,
        )

    def start(self, run_id: str) -> str:
        state = new_run(
            RunRequest(run_id=run_id, agent=REFERENCE, model=MODEL), has_anthropic_key=True
        )
        assert self.engine().start(state)
        return run_id

    def work(self, run_id: str) -> tuple[RunState, list[StepAttemptFailed]]:
        """Advance the run until it stops, as a worker would (without its backoff wait)."""
        engine = self.engine()
        failures: list[StepAttemptFailed] = []
        for _ in range(10):
            self.steps_rendered.append(engine.load(run_id))
            try:
                outcome = engine.advance(run_id)
            except StepAttemptFailed as failure:
                failures.append(failure)
                continue
            if outcome.outcome is not Outcome.CONTINUE:
                return engine.load(run_id), failures
        raise AssertionError("the run did not stop")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    runtime = open_runtime(f"sqlite:///{tmp_path}/ratchet.db", environ={})
    with FakeMessagesApi() as api:
        yield Setup(api, runtime)
    runtime.close()


STEP_USAGE = {
    "input_tokens": 50,
    "output_tokens": 20,
    "cache_read_input_tokens": 900,
    "cache_creation_input_tokens": 0,
}
FIRST_USAGE = {**STEP_USAGE, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 900}


def test_a_rate_limit_is_waited_out_inside_the_attempt_and_counts_no_strike(setup):
    run_id = setup.start("rate-limited")
    setup.api.enqueue(
        rate_limited(retry_after_s=1),
        tool_use_response("write_note", {"text": "hello"}),
        text_response("DONE: wrote the note."),
    )

    state, failures = setup.work(run_id)

    assert state.status is RunStatus.DONE
    assert failures == []
    [delay] = setup.clock.slept
    assert delay >= 1
    assert len(setup.api.requests) == 3
    events = [c.event for c in setup.runtime.store.list_checkpoints(run_id)]
    assert [e.kind for e in events] == ["created", "step", "finished"]
    assert not any(isinstance(e, AttemptFailed) for e in events)
    [step] = [e for e in events if isinstance(e, StepCompleted)]
    assert step.attempt == 1


def test_a_529_storm_past_the_budget_counts_exactly_one_failed_attempt(setup):
    run_id = setup.start("storm")
    # A 10 s budget: waits of 1, 2 and 4 s fit, the next 8 s would not: 4 tries, then the
    # attempt fails. The next attempt gets through.
    setup.api.enqueue(
        *(overloaded() for _ in range(4)),
        tool_use_response("write_note", {"text": "hello"}),
        text_response("DONE: wrote the note."),
    )

    state, failures = setup.work(run_id)

    assert state.status is RunStatus.DONE
    assert len(failures) == 1
    assert failures[0].transient
    events = [c.event for c in setup.runtime.store.list_checkpoints(run_id)]
    assert [e.kind for e in events] == ["created", "attempt_failed", "step", "finished"]
    failed = events[1]
    assert isinstance(failed, AttemptFailed)
    assert "overloaded (HTTP 529" in failed.error
    assert "gave up after 4 tries in 7.0 s" in failed.error
    assert "10 s retry budget" in failed.error
    assert isinstance(events[2], StepCompleted)
    assert events[2].attempt == 2
    assert setup.clock.slept == [1.0, 2.0, 4.0]
    history = [c.event for c in ratchet.Client(setup.runtime).history(run_id)]
    assert history.count("attempt_failed") == 1


def test_usage_lands_in_each_step_record_the_runs_totals_the_status_and_the_api(setup):
    run_id = setup.start("usage")
    setup.api.enqueue(
        tool_use_response("write_note", {"text": "hello"}, usage=FIRST_USAGE),
        text_response("DONE: wrote the note.", usage=STEP_USAGE),
    )

    state, _ = setup.work(run_id)

    step_usage = Usage(
        input_tokens=50, output_tokens=20, cache_read_tokens=0, cache_write_tokens=900, calls=1
    )
    done_usage = Usage(
        input_tokens=50, output_tokens=20, cache_read_tokens=900, cache_write_tokens=0, calls=1
    )
    events = [c.event for c in setup.runtime.store.list_checkpoints(run_id)]
    assert [getattr(e, "usage", None) for e in events] == [None, step_usage, done_usage]
    assert state.usage == step_usage + done_usage
    assert state.usage.calls == 2

    status = status_payload(state)
    assert status["usage"] == {
        "input_tokens": 100,
        "output_tokens": 40,
        "cache_read_tokens": 900,
        "cache_write_tokens": 900,
        "calls": 2,
        "cached_share": round(900 / 1900, 4),
    }
    # claude-haiku-4-5: $1 in, $5 out, $1.25 cache write, $0.10 cache read per million.
    expected_cost = (100 * 1 + 40 * 5 + 900 * 1.25 + 900 * 0.10) / 1_000_000
    assert status["cost_usd"] == pytest.approx(expected_cost)

    view = RunView.of(state)
    assert view.usage.model_dump() == status["usage"]
    assert view.cost_usd == status["cost_usd"]

    client = ratchet.Client(setup.runtime)
    history = client.history(run_id)
    shares = [c.usage.cached_share if c.usage else None for c in history]
    assert shares == [None, 0.0, round(900 / 950, 4)]
    assert client.get(run_id).usage.model_dump() == status["usage"]
    # The totals are a fold of the records: replaying them gives the same head usage.
    replayed = replay(setup.runtime.store.list_checkpoints(run_id))
    assert replayed is not None
    assert replayed.usage == state.usage


def test_the_request_caches_the_prefix_and_sends_the_step_prompt_byte_for_byte(setup):
    run_id = setup.start("prompt")
    setup.api.enqueue(
        tool_use_response("write_note", {"text": "hello"}),
        text_response("DONE: wrote the note."),
    )

    setup.work(run_id)

    assert len(setup.api.requests) == 2
    for request, before in zip(setup.api.requests, setup.steps_rendered, strict=True):
        body = request.body
        assert body is not None
        assert body["model"] == MODEL
        assert body["max_tokens"] == 300
        assert body["system"] == [
            {"type": "text", "text": INSTRUCTIONS, "cache_control": {"type": "ephemeral"}}
        ]
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        # The agent's tools, then the runtime's `remember`; the last one closes the cached prefix
        assert [t["name"] for t in body["tools"]] == ["write_note", "remember", "sleep"]
        [turn] = body["messages"]
        assert turn == {"role": "user", "content": render_step_prompt(view_of(before))}
    # The second step's prompt differs (it lists the first step), the cached prefix does not.
    first, second = (r.body for r in setup.api.requests)
    assert first is not None
    assert second is not None
    assert first["messages"] != second["messages"]
    assert (first["system"], first["tools"]) == (second["system"], second["tools"])


def test_a_client_run_uses_the_key_and_base_url_from_the_environment(tmp_path, monkeypatch):
    # The whole path a user takes: connect, run; the runtime's binder builds the model.
    with FakeMessagesApi() as api:
        api.enqueue(
            tool_use_response("write_note", {"text": "hello"}, usage=FIRST_USAGE),
            text_response("DONE: wrote the note.", usage=STEP_USAGE),
        )
        client = ratchet.connect(
            f"sqlite:///{tmp_path}/ratchet.db",
            environ={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url},
        )
        try:
            run = client.run(run_id="via-client", agent=REFERENCE, model=MODEL)
        finally:
            client.close()

    assert run.status is RunStatus.DONE
    assert run.usage.calls == 2
    assert run.usage.cache_write_tokens == 900
    assert run.cost_usd is not None
    assert run.cost_usd > 0
    assert api.requests[0].body is not None
    assert api.requests[0].body["system"][0]["text"] == INSTRUCTIONS


def test_an_agent_can_shorten_its_retry_budget(setup):
    # The budget is the agent's: with none, one 429 is one failed attempt.
    setup.agent = replace(agent, model_retry_seconds=0)
    run_id = setup.start("impatient")
    setup.api.enqueue(
        rate_limited(retry_after_s=1),
        tool_use_response("write_note", {"text": "hello"}),
        text_response("DONE: wrote the note."),
    )

    state, failures = setup.work(run_id)

    assert state.status is RunStatus.DONE
    assert len(failures) == 1
    assert setup.clock.slept == []
