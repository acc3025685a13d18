"""The `AwaitEvent` task: park the execution on the run's event wait until the event comes
(or on its children wait until its child runs end: the same park, settled by their ends).

The task waits for its token; this function keeps the token where the event desk's nudge finds
it (the run's wait item), then settles the wait at once if its event is already in the mailbox
(`EventDesk.deliver`: sent before the run waited, or by a sender that died before delivering).

Then it looks at the run again, and if the wait is settled (by that delivery, or by a sender
before the token was kept) it answers its own token. That look must come after the token is
kept: a sender settles the wait, then reads the token to nudge. Either the sender's read finds
the token (and answers it), or the sender settled before the token was kept, and this read,
which comes later still, finds the run settled. One of the two always answers, both may (the
second is told the task is over, and does nothing); without this look an event that came in
between the step's commit and the token's keeping would leave the execution parked until its
timeout, the run stranded with its event taken.

The token is a bearer credential for the execution: it goes to the table and nowhere else,
not to the log and not to the result.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.handlers._wiring import child_runs, event_desk, logger, metrics, runtime, tracer
from ratchet.handlers.payloads import OpenWaitRequest, OpenWaitResult
from ratchet.state import ChildrenWait, EventWait, RunState, RunStatus, utcnow


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = OpenWaitRequest.model_validate(event)
    return open_wait(request, context).model_dump(mode="json")


def open_wait(request: OpenWaitRequest, context: LambdaContext) -> OpenWaitResult:
    aws = runtime()
    aws.wait_tokens().keep(request.run_id, request.step, request.task_token, at=utcnow())
    head = aws.store.load_head(request.run_id)
    if _waiting_for(head, request.step) is ChildrenWait:
        # Children that ended before the token was kept (or while no one could tell): their
        # outcomes settle the wait now.
        child_runs(context).settle(request.run_id)
    else:
        event_desk(context).deliver(request.run_id)
    head = aws.store.load_head(request.run_id)
    settled = _waiting_for(head, request.step) is None
    if settled:
        # Settled before the token was kept, or just now by `deliver` (whose own nudge may
        # have answered already: then this answer finds the task over, and does nothing).
        aws.nudge().resume(request.run_id, request.step)
        metrics.add_metric(name="EventWaitsSettledAtOnce", unit=MetricUnit.Count, value=1)
    else:
        metrics.add_metric(name="EventWaitsParked", unit=MetricUnit.Count, value=1)
    logger.info(
        "event wait settled, going on" if settled else "parked for an event",
        extra={"run_id": request.run_id, "step": request.step},
    )
    return OpenWaitResult(run_id=request.run_id, step=request.step, settled=settled)


def _waiting_for(head: RunState | None, step: int) -> type | None:
    """What the run waits for at `step` that parks on a token (an event, child runs), if it
    still does."""
    if head is None or head.status is not RunStatus.WAITING or head.step != step:
        return None
    request = head.waiting.request if head.waiting is not None else None
    return type(request) if isinstance(request, EventWait | ChildrenWait) else None
