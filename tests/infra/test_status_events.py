"""The status-events function (issue 35): it reads the checkpoints table's stream (new and old
images), filtered to the runs' heads, from the stream's start, one batch at a time per shard,
halving a failed batch; and may put events on the deployment's bus and nothing else."""

from __future__ import annotations

import json

from ratchet.adapters.dynamodb.store import HEAD_SK
from ratchet.cdk import contract
from tests.infra.queries import (
    as_list,
    environment,
    function_id,
    statements_of_function,
    tables_by_role,
)
from tests.infra.synth import Synthesized


def test_the_function_reads_the_heads_of_the_checkpoints_stream(synthesized: Synthesized) -> None:
    checkpoints = tables_by_role(synthesized)["checkpoints"]
    table = synthesized.resources[checkpoints]["Properties"]
    (mapping,) = synthesized.of_type("AWS::Lambda::EventSourceMapping").values()
    props = mapping["Properties"]

    assert contract.HEAD_SORT_KEY == HEAD_SK
    assert table["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
    assert props["EventSourceArn"] == {"Fn::GetAtt": [checkpoints, "StreamArn"]}
    assert props["FunctionName"] == {"Ref": function_id(synthesized, "status_events")}
    assert props["StartingPosition"] == "TRIM_HORIZON"
    assert props["BisectBatchOnFunctionError"] is True
    assert props["ParallelizationFactor"] == 1
    assert "MaximumRecordAgeInSeconds" not in props  # kept until the stream drops it (24 h)
    (pattern,) = props["FilterCriteria"]["Filters"]
    assert json.loads(pattern["Pattern"]) == {"dynamodb": {"Keys": {"sk": {"S": [HEAD_SK]}}}}


def test_the_function_puts_events_on_the_default_bus_only(synthesized: Synthesized) -> None:
    statements = statements_of_function(synthesized, "status_events")
    (put,) = [s for s in statements if "events:PutEvents" in as_list(s["Action"])]

    assert as_list(put["Action"]) == ["events:PutEvents"]
    assert "event-bus/default" in json.dumps(put["Resource"])
    assert environment(synthesized, "status_events")[contract.EVENT_BUS_NAME] == "default"
    others = [s for s in statements if s is not put]
    assert not [s for s in others if any(a.startswith("events:") for a in as_list(s["Action"]))]
