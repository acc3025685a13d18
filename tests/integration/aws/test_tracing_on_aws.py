"""Traces on AWS, with the state machine executing on moto: the step function's invocations
make the same spans as a local worker (the engine is shared), and the step that resumes after
a person's approval, in another invocation, links to the step that parked, through the head in
DynamoDB."""

from __future__ import annotations

from ratchet import tracing
from ratchet.state import RunStatus
from tests import tracing_support
from tests.integration.aws.harness import Stack
from tests.tracing_support import attrs, named, step_span

spans = tracing_support.spans


def test_a_parked_run_resumed_on_aws_links_its_resuming_step_to_the_parking_one(
    stack: Stack, spans
):
    # Given a one-batch migration (step 3 asks to drop the legacy table), approved on its page.
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": "otel"})
    assert status == 201, started
    stack.parked("otel")
    assert stack.head("otel").parked_span is not None
    page = stack.open(stack.link("otel"))
    stack.submit(page.form_action, "approve", "go ahead")

    # Then the execution ends, each step's span carrying the run, the step and the attempt.
    assert stack.finished(str(started["execution_name"]))["status"] == "SUCCEEDED"
    assert stack.head("otel").status is RunStatus.DONE
    finished = [s for s in spans.get_finished_spans() if attrs(s).get(tracing.RUN_ID) == "otel"]
    steps = named(finished, "ratchet.step")
    assert sorted(int(str(attrs(s)[tracing.STEP])) for s in steps) == [1, 2, 3, 4, 5, 6]
    parked, resuming = step_span(finished, 3), step_span(finished, 4)
    assert attrs(parked)[tracing.WAITS_FOR] == "person"
    assert parked.context is not None
    (link,) = resuming.links
    assert link.context.span_id == parked.context.span_id
    # RecordDecision settled the wait, linked to the same span.
    (settled,) = named(finished, "ratchet.settle")
    assert [lk.context.span_id for lk in settled.links] == [parked.context.span_id]
    assert [s.name for s in finished if s.name.startswith("execute_tool")][:1] == [
        "execute_tool inspect_table"
    ]
