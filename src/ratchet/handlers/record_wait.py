"""The `RecordWait` task: a park that ended by its own clock settles the wait, if it is due.

The state machine comes here when a `Sleep` ends and when an `AwaitEvent` task times out. A
park lasts at most a chunk (`ratchet.handlers.payloads.WAIT_CHUNK_SECONDS`), so its end proves
nothing by itself: the wait is settled (`timer_due`, `event_timed_out`) only if the run still
waits at the step the execution parked at, for a wait of this kind, and the wait's own time
(a timer's `until`, an event wait's `expires_at`) has passed by this function's clock. A chunk
that ended early records nothing, and `Step` finds the run waiting and parks it again.

The settling is the engine's one conditional write (`decide_waiting`, at that step): an event,
a wake or a cancel that got there first wins, and this records nothing.

A function of its own rather than the decide function: it needs the checkpoints table only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.errors import NotWaiting, StaleVersion
from ratchet.handlers._wiring import engine, logger, metrics, runtime, tracer
from ratchet.handlers.payloads import RecordWaitRequest, RecordWaitResult
from ratchet.state import EventWait, RunState, RunStatus, TimerWait, WaitSettled, utcnow
from ratchet.waits import event_timed_out, timer_due


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = RecordWaitRequest.model_validate(event)
    return record_wait(request, context).model_dump(mode="json")


def record_wait(request: RecordWaitRequest, context: LambdaContext) -> RecordWaitResult:
    if request.kind == "event":
        # The park timed out, so its token answers nothing now; a next park keeps its own.
        runtime().wait_tokens().drop(request.run_id, request.step)
    ratchet = engine(context)
    head = ratchet.load(request.run_id)
    settled = due_settlement(head, request, utcnow())
    recorded = False
    if settled is not None:
        try:
            head = ratchet.decide_waiting(head, settled, step=request.step)
            recorded = True
        except (NotWaiting, StaleVersion):
            # Settled another way meanwhile (an event, a wake, a cancel): that one counts.
            head = ratchet.load(request.run_id)
    metrics.add_metric(
        name="WaitsComeDue" if recorded else "WaitParksRenewed", unit=MetricUnit.Count, value=1
    )
    logger.info(
        "wait settled: due" if recorded else "wait not settled here",
        extra={"run_id": request.run_id, "step": request.step, "kind": request.kind},
    )
    return RecordWaitResult(
        run_id=head.run_id, status=head.status.value, step=head.step, recorded=recorded
    )


def due_settlement(head: RunState, request: RecordWaitRequest, now: datetime) -> WaitSettled | None:
    """What settles the run's wait at `now`, if it waits at the request's step for a wait of
    its kind that is due; else None."""
    if head.status is not RunStatus.WAITING or head.step != request.step or head.waiting is None:
        return None
    wait = head.waiting.request
    due = head.waiting.due
    if due is None or now < due:
        return None
    if request.kind == "timer" and isinstance(wait, TimerWait):
        return timer_due(wait, head.step, now)
    if request.kind == "event" and isinstance(wait, EventWait):
        return event_timed_out(wait, head.step)
    return None
