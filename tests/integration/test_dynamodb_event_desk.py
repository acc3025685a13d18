"""The event desk of the AWS runtime (`AwsRuntime.event_desk`): the same desk as locally, on the
DynamoDB store and mailbox (moto) and S3 blobs, worked in this process (`AwsRuntime.work`), so
an event is taken once into the run's partition and settles its wait in the commit that
consumes it, whichever comes first, the event or the wait."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from ratchet.errors import EventNotAwaited
from ratchet.runtime.aws import AwsRuntime
from ratchet.state import INLINE_BYTES, RunOptions, RunState, RunStatus, WaitSettled
from ratchet.waiting.desk import EventDesk
from tests.dynamodb_support import REGION, SETTINGS, moto_tables, scan
from tests.support import LOG
from tests.waits_agent import AGENT, agent

BUCKET = "ratchet-blobs-test"
PASSED = {"conclusion": "success", "url": "https://ci.example/1"}


class Aws:
    def __init__(self, client: Any) -> None:
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        self.client = client
        self.runtime = AwsRuntime(
            SETTINGS.model_copy(update={"blob_bucket": BUCKET}), client, s3=s3
        )
        self.nudged: list[tuple[RunState, WaitSettled]] = []
        self.owed: list[tuple[str, int, str]] = []
        self.resumed: list[tuple[str, int]] = []

    def owe(self, run_id: str, step: int, how: str) -> None:
        self.owed.append((run_id, step, how))

    def __call__(self, head: RunState, settled: WaitSettled) -> None:
        self.nudged.append((head, settled))

    def resume(self, run_id: str, step: int) -> bool:
        self.resumed.append((run_id, step))
        return False

    def desk(self) -> EventDesk:
        engine = self.runtime.engine(worker_id="api", logger=LOG)
        return self.runtime.event_desk(engine, self)

    def start(self, run_id: str = "run-1") -> str:
        state = RunState(
            run_id=run_id, agent=AGENT, goal=agent.goal, options=RunOptions(model="scripted")
        )
        assert self.runtime.engine(worker_id="api", logger=LOG).start(state)
        return run_id

    def work(self, run_id: str) -> RunState:
        self.runtime.work(run_id, worker_id="step", logger=LOG)
        head = self.runtime.store.load_head(run_id)
        assert head is not None
        return head

    def settled(self, run_id: str) -> list[WaitSettled]:
        return [
            c.event
            for c in self.runtime.store.list_checkpoints(run_id)
            if isinstance(c.event, WaitSettled)
        ]


@pytest.fixture
def aws() -> Iterator[Aws]:
    with moto_tables() as client:
        yield Aws(client)


def test_an_event_sent_during_the_wait_settles_it_once_and_wakes_the_execution(aws):
    run_id = aws.start()
    parked = aws.work(run_id)
    assert parked.status is RunStatus.WAITING

    sent = aws.desk().send(run_id, "ci-finished", PASSED, event_id="gh-1", source="webhook")
    again = aws.desk().send(run_id, "ci-finished", PASSED, event_id="gh-1", source="webhook")

    assert (sent.status, sent.duplicate, sent.event.consumed_step) == ("delivered", False, 1)
    assert (again.status, again.duplicate) == ("delivered", True)
    [(head, settled)] = aws.nudged
    assert aws.owed == [(run_id, 1, "event")], "marked owed before it was settled"
    assert aws.resumed == [(run_id, 1)], "the retry answers the execution again, if parked"
    assert head.status is RunStatus.RUNNING
    assert (settled.how, settled.event_id, settled.payload) == ("event", "gh-1", PASSED)
    done = aws.work(run_id)
    assert done.status is RunStatus.DONE
    assert [s.event_id for s in aws.settled(run_id)] == ["gh-1"]
    assert [e.is_pending for e in aws.runtime.mailbox().of_run(run_id)] == [False]


def test_an_event_sent_before_the_wait_is_kept_and_taken_when_the_run_parks(aws):
    # A large payload: its blob in S3, the mailbox item keeping the reference.
    big = {"conclusion": "success", "url": "https://ci.example/" + "x" * (2 * INLINE_BYTES)}
    run_id = aws.start()

    sent = aws.desk().send(run_id, "ci-finished", big, event_id="gh-1")
    assert (sent.status, aws.nudged) == ("queued", [])
    assert aws.work(run_id).status is RunStatus.WAITING
    # What the parked execution's wait task does as it opens: take what already came.
    head = aws.desk().deliver(run_id)

    assert head is not None
    assert head.status is RunStatus.RUNNING
    assert aws.work(run_id).status is RunStatus.DONE
    [settled] = aws.settled(run_id)
    assert settled.blob is not None
    assert json.loads(aws.runtime.blobs.get(settled.blob)) == big
    assert aws.runtime.mailbox().get(run_id, "gh-1").consumed_step == 1


def test_the_desk_refuses_on_aws_what_it_refuses_locally_and_writes_nothing(aws):
    run_id = aws.start()
    aws.work(run_id)
    before = scan(aws.client, SETTINGS.checkpoints_table)

    with pytest.raises(EventNotAwaited, match="waits for no event named 'deploy-done'"):
        aws.desk().send(run_id, "deploy-done", PASSED)

    assert scan(aws.client, SETTINGS.checkpoints_table) == before
