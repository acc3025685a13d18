"""Steering a run (issue 10): a failed run retried, a run forked from a step, and the prompt a
step's model saw replayed from the records; on SQLite, through the Python client."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

import ratchet
from ratchet.client import Client, NoCheckpointAtStep
from ratchet.errors import (
    ForkRefused,
    InvalidInput,
    NotRetryable,
    RunNotFound,
    StepAttemptFailed,
)
from ratchet.ports import ModelRequest
from ratchet.state import Done, RunStatus, ToolCall
from ratchet.tools import Agent, RunContext, StepView, ToolContext, tool

STEPS = 6
APPLIED: list[str] = []
"""Every key the `apply` tool applied, in order, across attempts."""
BROKEN: set[int] = set()
"""Steps whose `apply` raises (a full disk) until the test mends them."""


class Apply(BaseModel):
    n: int = Field(ge=1)


@tool()
def apply(args: Apply, ctx: ToolContext) -> str:
    """Apply change n."""
    if ctx.step in BROKEN:
        raise RuntimeError("disk full")
    APPLIED.append(ctx.idempotency_key)
    return f"change {args.n} applied"


def _policy(view: StepView) -> ToolCall | Done:
    if view.step <= STEPS:
        return ToolCall(name="apply", arguments={"n": view.step})
    return Done(summary="every change applied")


class Recorder:
    """A `Model` that decides with the policy and keeps the prompt of every answered call. At
    the steps in `fail_once` its first call raises, so the next attempt's prompt carries the
    failure."""

    def __init__(self) -> None:
        self.prompts: dict[int, str] = {}
        self.fail_once: set[int] = set()

    def decide(self, request: ModelRequest) -> ToolCall | Done:
        step = request.view.step
        if step in self.fail_once:
            self.fail_once.discard(step)
            raise RuntimeError("the model is overloaded")
        self.prompts[step] = request.prompt
        return _policy(request.view)


recorder = Recorder()
MODEL = f"{__name__}:recorder"
changes = Agent(
    name="changes", goal="Apply every change once.", tools=[apply], policy=_policy, memory_window=3
)
AGENT = f"{__name__}:changes"


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    for name in ("ANTHROPIC_API_KEY", "RATCHET_STORE", "RATCHET_FAULT"):
        monkeypatch.delenv(name, raising=False)
    APPLIED.clear()
    BROKEN.clear()
    recorder.prompts.clear()
    recorder.fail_once.clear()
    with ratchet.connect(f"sqlite:///{tmp_path}/runs.db") as connected:
        yield connected


def _drive(client: Client, run_id: str) -> ratchet.Run:
    """Advance the run until it stops, taking each failed attempt at once (a worker would
    back off first, for seconds)."""
    engine = client.runtime.engine(worker_id="test", logger=client.logger)
    for _ in range(50):
        with contextlib.suppress(StepAttemptFailed):
            if engine.advance(run_id).outcome.value != "continue":
                return client.get(run_id)
    raise AssertionError("the run did not stop")


# --- retry ------------------------------------------------------------------------------------


def test_retry_after_three_strikes_finishes_without_applying_an_applied_key_again(client):
    client.start(run_id="r", agent=AGENT, max_steps=STEPS + 2)
    BROKEN.add(3)
    failed = _drive(client, "r")
    assert failed.status is RunStatus.FAILED
    assert "step 3 failed 3 times" in (failed.error or "")
    assert APPLIED == ["r/step-1", "r/step-2"]

    BROKEN.clear()
    retried = client.retry("r", by="dana")

    assert (retried.status, retried.attempts, retried.error) == (RunStatus.RUNNING, 0, None)
    assert [c.event for c in client.history("r")][-1] == "retried"
    done = client.work("r")
    assert done.status is RunStatus.DONE
    assert [f"r/step-{n}" for n in range(1, STEPS + 1)] == APPLIED
    with pytest.raises(NotRetryable):
        client.retry("r")


# --- cancel -----------------------------------------------------------------------------------


def test_a_cancelled_run_keeps_its_checkpoints_and_no_worker_takes_it(client):
    client.start(run_id="c", agent=AGENT, max_steps=STEPS + 2)
    engine = client.runtime.engine(worker_id="test", logger=client.logger)
    engine.advance("c")
    before = client.history("c")

    cancelled = client.cancel("c", reason="wrong table", by="dana")

    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.summary == "Cancelled by dana: wrong table"
    assert client.work("c").step == 1
    assert client.history("c")[: len(before)] == before
    assert APPLIED == ["c/step-1"]


# --- fork -------------------------------------------------------------------------------------


def _finished_migration(client: Client, run_id: str) -> ratchet.Run:
    waiting = client.run(run_id=run_id, scenario="migration", input={"batches": 3})
    assert waiting.status is RunStatus.WAITING
    client.approve(run_id, by="dana")
    done = client.work(run_id)
    assert done.status is RunStatus.DONE
    return done


def test_a_fork_of_a_finished_migration_copies_nothing_twice_and_leaves_the_source(client):
    source = _finished_migration(client, "m")
    verified = client.verify("m")
    assert verified["ok"], verified
    records = client.history("m")
    at = 2  # inspected the table, copied the first batch

    fork = client.fork("m", from_step=at, run_id="m-2")

    assert (fork.run_id, fork.status, fork.step, fork.version) == ("m-2", "running", at, 1)
    assert client.head("m-2").messages == client.state_at("m", step=at).messages
    waiting = client.work("m-2")
    assert waiting.status is RunStatus.WAITING
    client.approve("m-2", by="dana")
    forked = client.work("m-2")
    assert forked.status is RunStatus.DONE
    assert forked.step == source.step
    checks = client.verify("m-2")
    # The fork's own data holds what the source's held after step 2 (the first batch, under
    # the source's key: the agent's fork hook carried it), then the batches it copied itself,
    # each once (issue 22: it used to start from fresh data, and ended "done" with the
    # first batch never copied).
    assert checks["ok"], checks
    assert (checks["duplicate_rows"], checks["missing_rows"]) == (0, 0)
    assert checks["target_rows"] == 3_000
    assert checks["keys_applied"] == 5  # step 2 carried; the fork's own 3, 4 (copies), 6, 7
    # Keys under the fork's id, from the step after the fork point only.
    ledger = client.runtime.ledger
    assert ledger.get("m-2/step-2") is None
    assert ledger.get("m-2/step-3") is not None
    # The source is untouched.
    assert client.verify("m") == verified
    assert client.history("m") == records


def test_a_fork_is_refused_past_the_source_step_for_an_unknown_run_or_a_taken_id(client):
    client.start(run_id="s", agent=AGENT, max_steps=STEPS + 2)
    _drive(client, "s")
    with pytest.raises(InvalidInput, match="cannot be forked from step 99"):
        client.fork("s", from_step=99)
    with pytest.raises(RunNotFound):
        client.fork("nope", from_step=1)
    client.start(run_id="taken", agent=AGENT)
    with pytest.raises(InvalidInput, match="'taken' already exists"):
        client.fork("s", from_step=1, run_id="taken")
    default = client.fork("s", from_step=3)
    assert default.run_id.startswith("s-fork-")
    assert client.get("s").status is RunStatus.DONE
    # A fork has no record of the steps before its fork point: a fork of it from one of those
    # is refused, naming the step, and writes nothing.
    with pytest.raises(NoCheckpointAtStep, match="no record of step 1 \\(its first is step 3\\)"):
        client.fork(default.run_id, from_step=1, run_id="again")
    assert client.runtime.store.load_head("again") is None


@pytest.mark.parametrize("at", [0, 1, 4, 5, 6])
def test_a_fork_of_a_migration_from_any_step_ends_with_every_row_copied_once(client, at):
    # Given a migration that copied its 3 batches at steps 2-4, asked at 5, dropped at 6
    _finished_migration(client, "m")

    # When it is forked from a step, and the fork is worked (and approved) to the end
    client.fork("m", from_step=at, run_id="m-f")
    for _ in range(2):
        if client.work("m-f").status is RunStatus.WAITING:
            client.approve("m-f", by="dana")

    # Then the fork's data matches what its state says was done: no row missing or doubled,
    # the legacy table dropped by the fork itself (or, forked after the drop, by the source)
    assert client.get("m-f").status is RunStatus.DONE
    checks = client.verify("m-f")
    assert checks["ok"], checks
    assert (checks["missing_rows"], checks["duplicate_rows"]) == (0, 0)
    assert (checks["legacy_dropped"], checks["emails_sent"]) == (True, 1)


def test_a_fork_of_a_migration_whose_data_does_not_say_what_a_key_did_is_refused(client):
    # Given a migration whose data records what its copies did only for some keys (written
    # by an older Ratchet, which kept no arguments)
    _finished_migration(client, "m")
    state = client.head("m")
    app = sqlite3.connect(client.runtime.context("m", state.options).workdir / "app.db")
    with app:
        app.execute("DELETE FROM effects WHERE key = 'm/step-3'")
    app.close()
    records = client.history("m")

    with pytest.raises(ForkRefused, match="does not record what m/step-3 did"):
        client.fork("m", from_step=4, run_id="m-f")

    assert client.runtime.store.load_head("m-f") is None
    assert not client.runtime.context("m-f", state.options).workdir.exists()
    assert client.history("m") == records
    # A fork from before that key needs nothing it lacks
    assert client.fork("m", from_step=2, run_id="m-early").step == 2


class NoteTaker:
    """A `Model` for the notebook: a note at each of steps 1-3 (in a fork, at step 3 a note
    of its own), the notes read back at step 4, then done."""

    def decide(self, request: ModelRequest) -> ToolCall | Done:
        view = request.view
        if view.step <= 3:
            title = f"{view.run_id} note {view.step}"
            return ToolCall(name="write_note", arguments={"title": title, "body": "x"})
        if view.step == 4:
            return ToolCall(name="read_notes", arguments={})
        return Done(summary="read")


note_taker = NoteTaker()


def test_a_fork_of_a_notebook_reads_the_notes_written_up_to_its_fork_point(client):
    client.run(run_id="n", scenario="notebook", goal="take notes", model=f"{__name__}:note_taker")

    client.fork("n", from_step=2, run_id="n-f")
    client.work("n-f")

    reads = [c for c in client.history("n-f") if c.tool == "read_notes"]
    assert [c.result for c in reads] == [
        "# n note 1\nx\n# n note 2\nx\n# n-f note 3\nx",
    ]
    assert client.verify("n")["notes"] == 3
    assert client.verify("n-f")["notes"] == 3


FORKS: list[tuple[str, str, int]] = []
"""(source, fork, step) for every call of `unforkable`'s fork hook."""
PREPARED: list[str] = []


def _refuse(source: RunContext, fork: RunContext, step: int) -> None:
    FORKS.append((source.run_id, fork.run_id, step))
    raise ForkRefused("its ledger of record lives in a bank's system, which cannot be copied")


unforkable = Agent(
    name="unforkable",
    goal="Apply every change once.",
    tools=[apply],
    policy=_policy,
    prepare=lambda ctx: PREPARED.append(ctx.run_id),
    fork=_refuse,
)


def test_an_agent_refusing_a_fork_refuses_it_with_its_reason_and_nothing_is_written(client):
    FORKS.clear()
    PREPARED.clear()
    client.start(run_id="s", agent=f"{__name__}:unforkable", max_steps=STEPS + 2)
    _drive(client, "s")
    records = client.history("s")

    with pytest.raises(ForkRefused, match="lives in a bank's system"):
        client.fork("s", from_step=2, run_id="f")

    assert FORKS == [("s", "f", 2)]
    assert PREPARED == ["s"]  # the fork's data was never prepared
    assert client.runtime.store.load_head("f") is None
    assert [r.run_id for r in client.runs()] == ["s"]
    assert client.history("s") == records


# --- replay -----------------------------------------------------------------------------------


def test_replay_renders_each_step_prompt_byte_for_byte(client):
    recorder.fail_once.add(4)  # step 4's second attempt is told why the first failed
    client.start(run_id="p", agent=AGENT, model=MODEL, max_steps=STEPS + 2)
    assert _drive(client, "p").status is RunStatus.DONE

    assert sorted(recorder.prompts) == list(range(1, STEPS + 2))
    assert "The previous attempt at step 4 failed" in recorder.prompts[4]
    for step in range(1, STEPS + 1):
        assert client.replay("p", step=step) == recorder.prompts[step], step
    with pytest.raises(NoCheckpointAtStep):
        client.replay("p", step=STEPS + 1)
