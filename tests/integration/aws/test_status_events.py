"""EventBridge events for each change of a run's status (issue 35), on moto: the checkpoints
table's stream (new and old images), read as Lambda's event source mapping hands it to the
status-events function, which puts each change on the bus; a rule sends them to an SQS queue.

A run that parks, is approved and finishes makes one event per change: running, waiting,
running, done. With the step function killed right after the commit that parks the run (the
state machine retries it), the event is still there, once: the stream holds the commit itself,
so there is no call after it to lose. A batch read twice (a retried batch) puts its events
again, each with the id a consumer deduplicates on."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.dynamodbstreams.models import dynamodbstreams_backends

from ratchet.handlers import status_events
from tests.integration.aws.harness import REGION, TABLES, FakeContext, Stack, wait_until
from tests.integration.aws.test_api import call

BATCH = 4
"""Records per invocation: a few, so a run's changes span batches, as they do on Lambda."""


def _stream(stack: Stack) -> None:
    stack.dynamodb.update_table(
        TableName=TABLES["checkpoints"],
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )


def _records(stack: Stack) -> list[dict[str, Any]]:
    """Every record of the table's stream, from its start, as Lambda reads them. moto 5.2.5's
    streams API answers DescribeStream and GetShardIterator with 404 ("Not yet implemented"),
    so they are read from its streams backend: the records moto made of the table's writes."""
    table = stack.dynamodb.describe_table(TableName=TABLES["checkpoints"])["Table"]
    arn = table["LatestStreamArn"]
    streams = dynamodbstreams_backends[DEFAULT_ACCOUNT_ID][REGION]
    records: list[dict[str, Any]] = []
    for shard in streams.describe_stream(arn)["Shards"]:
        iterator = streams.get_shard_iterator(arn, shard["ShardId"], "TRIM_HORIZON").arn
        while (page := streams.get_records(iterator, 100))["Records"]:
            records += page["Records"]
            iterator = page["NextShardIterator"]
    readable: list[dict[str, Any]] = json.loads(json.dumps(records, default=str))
    return readable


def _bus_to_queue() -> str:
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="run-status")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events = boto3.client("events", region_name=REGION)
    events.put_rule(
        Name="ratchet-runs",
        EventPattern=json.dumps(
            {"source": ["ratchet"], "detail-type": ["Ratchet Run Status Change"]}
        ),
    )
    events.put_targets(Rule="ratchet-runs", Targets=[{"Id": "queue", "Arn": arn}])
    return str(url)


def _received(url: str) -> list[dict[str, Any]]:
    sqs = boto3.client("sqs", region_name=REGION)
    got: list[dict[str, Any]] = []
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages"):
        for message in messages:
            got.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return got


def _consume(records: list[dict[str, Any]]) -> int:
    put = 0
    for first in range(0, len(records), BATCH):
        answer = status_events.handler(
            {"Records": records[first : first + BATCH]},
            FakeContext("ratchet-status-events", "arn:ratchet-status-events"),
        )
        put += answer["events"]
    return put


def _park_approve_finish(stack: Stack, run_id: str) -> str:
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": run_id})
    assert status == 201, started
    stack.parked(run_id)
    assert call("POST", f"/runs/{run_id}/approve", {"comment": "ok"})[0] == 200
    stack.finished(str(started["execution_name"]))
    return str(started["execution_name"])


@pytest.mark.parametrize("fault", [None, "kill:after_commit@3"])
def test_one_event_per_status_change_even_with_the_step_killed_after_its_commit(
    stack: Stack, fault: str | None
):
    _stream(stack)
    queue = _bus_to_queue()
    if fault:
        stack.fault(fault)  # step 3 asks to drop the table: its commit parks the run

    execution = _park_approve_finish(stack, "ev-1")
    records = _records(stack)
    failed = [e["type"] for e in stack.history(execution) if e["type"].endswith("Failed")]
    put = _consume(records)
    got = _received(queue)

    details = [e["detail"] for e in got]
    assert [(d.get("previous"), d["status"], d["event"]) for d in details] == [
        (None, "running", "started"),
        ("running", "waiting", "waiting"),
        ("waiting", "running", "decided"),
        ("running", "done", "done"),
    ]
    assert put == len(got) == 4
    assert bool(failed) is bool(fault), failed  # the step did die after its commit
    assert {(e["source"], e["detail-type"]) for e in got} == {
        ("ratchet", "Ratchet Run Status Change")
    }
    assert [d["id"] for d in details] == [f"ev-1:{d['version']}" for d in details]
    assert {d["agent"] for d in details} == {"migration"}
    waiting = details[1]
    assert waiting["wait"]["answer"] == {
        "approve": "/runs/ev-1/approve",
        "reject": "/runs/ev-1/reject",
    }
    text = json.dumps(got)
    assert "taskToken" not in text
    assert "token" not in text.lower()
    assert "/approvals/" not in text  # no signed link either
    print(
        f"events per run on moto: {len(got)} from {len(records)} stream records "
        f"({sum(1 for r in records if r['dynamodb']['Keys']['sk']['S'] == 'HEAD')} head writes)"
    )


def test_a_batch_read_again_puts_its_events_again_with_the_same_ids(stack: Stack):
    _stream(stack)
    queue = _bus_to_queue()
    _park_approve_finish(stack, "ev-2")
    records = _records(stack)

    _consume(records)
    _consume(records)  # the mapping retried the batch
    got = _received(queue)

    ids = [e["detail"]["id"] for e in got]
    assert len(ids) == 8
    assert len(set(ids)) == 4


def test_records_that_change_no_status_put_nothing(stack: Stack):
    _stream(stack)
    queue = _bus_to_queue()
    _park_approve_finish(stack, "ev-3")
    others = [r for r in _records(stack) if r["dynamodb"]["Keys"]["sk"]["S"] != "HEAD"]

    assert _consume(others) == 0
    wait_until(lambda: True)
    assert _received(queue) == []
