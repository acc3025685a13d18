"""OpenTelemetry traces of runs on the local runtime (docs/tracing.md), read from the SDK's
in-memory exporter: a span per step attempt with the run id, step and attempt, the model call's
span by the GenAI conventions (tokens, cached tokens), the tool call's (name, key, outcome); a
failed attempt and a crash recorded on their attempt's span; a run that parks for a person
linked across the park to the step that resumes it."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

from bench import trace_cost, trace_picture, traced_agent
from ratchet import tracing
from ratchet.client import Client
from ratchet.errors import InjectedFault, StepAttemptFailed
from ratchet.faults import FaultPlan
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus, StepCompleted
from tests import tracing_support
from tests.tracing_support import attrs, children, named, step_span

LOG = logging.getLogger("ratchet.tests.tracing")
spans = tracing_support.spans


def _runtime(root: Path) -> LocalRuntime:
    return LocalRuntime.open(LocalSettings(store=f"sqlite:///{root / 'ratchet.db'}"))


def _start_notes(client: Client, root: Path, *, flaky_step: int = 0) -> str:
    run = client.start(
        run_id="notes",
        agent=traced_agent.AGENT,
        model=traced_agent.MODEL,
        input={"notes": str(root / "notes.txt"), "flaky_step": flaky_step},
    )
    return run.run_id


def test_a_failed_attempt_is_its_own_span_and_the_retry_is_attempt_2(tmp_path, spans):
    runtime = _runtime(tmp_path)
    client = Client(runtime, worker_id="w1", logger=LOG)
    run_id = _start_notes(client, tmp_path, flaky_step=2)
    engine = runtime.engine(worker_id="w1", logger=LOG)

    # Given step 2's tool fails once: the step's first attempt fails, the second succeeds.
    engine.advance(run_id)
    with pytest.raises(StepAttemptFailed):
        engine.advance(run_id)
    engine.advance(run_id)
    finished = spans.get_finished_spans()

    failed, retried = step_span(finished, 2, attempt=1), step_span(finished, 2, attempt=2)
    assert failed.status.status_code is StatusCode.ERROR
    assert attrs(failed)[tracing.ERROR_TYPE] == "ToolFailed"
    assert [e.name for e in failed.events] == ["exception"]
    assert "ConnectionError" in str(failed.events[0].attributes)
    assert attrs(failed)[tracing.RUN_ID] == run_id
    assert attrs(failed)[tracing.AGENT] == traced_agent.AGENT
    assert retried.status.status_code is StatusCode.UNSET
    assert attrs(retried)[tracing.OUTCOME] == "continue"
    # The model is asked once: the retry reuses the decision recorded before the tool failed.
    assert attrs(failed)[tracing.DECISION] == "model"
    assert attrs(retried)[tracing.DECISION] == "reused"
    (chat,) = [s for s in children(finished, failed) if s.name.startswith("chat ")]
    assert chat.kind is trace.SpanKind.CLIENT
    assert attrs(chat) == {
        tracing.RUN_ID: run_id,
        tracing.STEP: 2,
        tracing.ATTEMPT: 1,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": traced_agent.MODEL,
        "ratchet.model.task": "decide",
        "gen_ai.usage.input_tokens": 1200 + 3000 + 400,
        "gen_ai.usage.output_tokens": 80,
        "gen_ai.usage.cache_read.input_tokens": 3000,
        "gen_ai.usage.cache_creation.input_tokens": 400,
    }
    assert not [s for s in children(finished, retried) if s.name.startswith("chat ")]
    (tool_failed,) = named(children(finished, failed), "execute_tool note")
    (tool_ok,) = named(children(finished, retried), "execute_tool note")
    assert attrs(tool_failed)[tracing.TOOL_OUTCOME] == "error"
    assert tool_failed.status.status_code is StatusCode.ERROR
    assert attrs(tool_ok) == {
        tracing.RUN_ID: run_id,
        tracing.STEP: 2,
        tracing.ATTEMPT: 2,
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "note",
        "gen_ai.tool.call.id": f"{run_id}/step-2",
        tracing.IDEMPOTENCY_KEY: f"{run_id}/step-2",
        tracing.TOOL_OUTCOME: "ok",
    }
    assert [s.name for s in children(finished, tool_ok)] == ["notes.write"]
    runtime.close()


def test_a_crash_after_the_tool_is_recorded_on_its_attempt_and_the_next_attempt_resumes(
    tmp_path, spans
):
    runtime = _runtime(tmp_path)
    client = Client(runtime, worker_id="w1", logger=LOG)
    run_id = _start_notes(client, tmp_path)
    crashy = runtime.engine(
        worker_id="crashy", logger=LOG, faults=FaultPlan.parse("raise:after_tool@2")
    )

    # Given the process "dies" after step 2's tool ran, before the step committed.
    crashy.advance(run_id)
    with pytest.raises(InjectedFault):
        crashy.advance(run_id)
    runtime.close()
    # When a fresh runtime takes the run on.
    fresh = _runtime(tmp_path)
    fresh.engine(worker_id="clean", logger=LOG).advance(run_id)
    finished = spans.get_finished_spans()

    crashed, resumed = step_span(finished, 2, attempt=1), step_span(finished, 2, attempt=2)
    assert crashed.status.status_code is StatusCode.ERROR
    assert attrs(crashed)[tracing.ERROR_TYPE] == "InjectedFault"
    assert tracing.OUTCOME not in attrs(crashed)
    # The tool's own span ended well: the crash came after it, and the next attempt calls it
    # again with the same key (which is what makes that safe).
    (first_call,) = named(children(finished, crashed), "execute_tool note")
    (second_call,) = named(children(finished, resumed), "execute_tool note")
    assert attrs(first_call)[tracing.TOOL_OUTCOME] == "ok"
    assert attrs(first_call)[tracing.IDEMPOTENCY_KEY] == attrs(second_call)[tracing.IDEMPOTENCY_KEY]
    assert attrs(resumed)[tracing.DECISION] == "reused"
    assert attrs(resumed)[tracing.OUTCOME] == "continue"
    fresh.close()


def test_the_step_that_resumes_after_an_approval_links_to_the_step_that_parked(tmp_path, spans):
    runtime = _runtime(tmp_path)
    client = Client(runtime, worker_id="w1", logger=LOG)
    run_id = _start_notes(client, tmp_path)

    # Given a run that parks for a person at step 3, approved through the client.
    assert client.work(run_id).status is RunStatus.WAITING
    waiting = runtime.store.load_head(run_id)
    assert waiting is not None
    assert waiting.parked_span is not None
    client.approve(run_id, by="dana")
    assert client.work(run_id).status is RunStatus.DONE
    finished = spans.get_finished_spans()

    parked, resuming = step_span(finished, 3), step_span(finished, 4)
    assert parked.context is not None
    assert resuming.context is not None
    assert attrs(parked)[tracing.OUTCOME] == "waiting"
    assert attrs(parked)[tracing.WAITS_FOR] == "person"
    (asked,) = named(children(finished, parked), "execute_tool ask")
    assert attrs(asked)[tracing.TOOL_OUTCOME] == "waits:person"
    # The head kept the parking step's span, and the resuming step links to it.
    assert waiting.parked_span.trace_id == f"{parked.context.trace_id:032x}"
    assert waiting.parked_span.span_id == f"{parked.context.span_id:016x}"
    (link,) = resuming.links
    assert (link.context.trace_id, link.context.span_id) == (
        parked.context.trace_id,
        parked.context.span_id,
    )
    assert dict(link.attributes or {}) == {"ratchet.link": "resumes", tracing.STEP: 3}
    # So does the settling of the wait: the person's decision.
    (settled,) = named(finished, "ratchet.settle")
    assert attrs(settled) == {
        tracing.RUN_ID: run_id,
        tracing.STEP: 3,
        "ratchet.settled.how": "decided",
    }
    assert [lk.context.span_id for lk in settled.links] == [parked.context.span_id]
    # The link is the resuming step's only: the step after it links to nothing.
    assert not step_span(finished, 5).links
    done = runtime.store.load_head(run_id)
    assert done is not None
    assert done.parked_span is None
    runtime.close()


def test_with_no_tracer_provider_a_run_makes_no_span_and_keeps_no_span(tmp_path):
    runtime = _runtime(tmp_path)
    client = Client(runtime, worker_id="w1", logger=LOG)
    run_id = _start_notes(client, tmp_path)

    assert tracing.tracer() is None
    assert client.work(run_id).status is RunStatus.WAITING
    head = runtime.store.load_head(run_id)
    assert head is not None
    assert head.parked_span is None
    events = [c.event for c in runtime.store.list_checkpoints(run_id)]
    steps = [e for e in events if isinstance(e, StepCompleted)]
    assert len(steps) == 3
    assert all(s.span is None for s in steps)
    runtime.close()


def test_a_run_in_a_process_without_opentelemetry_imports_none_of_it(tmp_path):
    # Given a fresh interpreter that runs the migration scenario to its approval.
    script = (
        "import sys\n"
        "from ratchet.client import Client\n"
        "from ratchet.runtime.local import LocalRuntime, LocalSettings\n"
        f"runtime = LocalRuntime.open(LocalSettings(store='sqlite:///{tmp_path}/r.db'))\n"
        "run = Client(runtime).run(run_id='m', scenario='migration', input={'batches': 1})\n"
        "assert run.status == 'waiting', run.status\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )

    # Then its steps imported nothing of OpenTelemetry: tracing off costs a dictionary lookup.
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_cost_bench_compares_each_mode_with_tracing_off(capsys):
    # Each mode in a process of its own; the bench itself checks off imports no OpenTelemetry
    # and on exports three spans a step.
    figures = trace_cost.run(steps=20, warmup=2, rounds=1)

    assert set(figures) == {"off", "api", "on"}
    printed = capsys.readouterr().out
    assert "off: wall" in printed
    assert "(x1.00)" in printed
    assert all(f["wall_us"] > 0 and f["cpu_us"] > 0 for f in figures.values())


def test_the_picture_draws_the_retry_the_approval_and_the_link(tmp_path, capsys):
    picture = tmp_path / "trace.svg"

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trace, "_TRACER_PROVIDER", None)
        patch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
        trace_picture.main(["--svg", str(picture)])

    waterfall = capsys.readouterr().out
    assert "ratchet.step 2 (attempt 1)" in waterfall
    assert "error ToolFailed" in waterfall
    assert "ratchet.step 2 (attempt 2)" in waterfall
    assert "link -> ratchet.step 3 (attempt 1)" in waterfall
    drawn = picture.read_text()
    assert drawn.startswith("<svg")
    assert drawn.count("marker-end") == 2  # the settling's link and the resuming step's
