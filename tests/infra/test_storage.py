"""The tables and the blob bucket: keys the adapters expect, durability, encryption, exposure."""

from __future__ import annotations

from typing import Any

import pytest

from ratchet.adapters import s3_blobs
from ratchet.adapters.dynamodb import items as dynamodb_adapter
from tests.infra.queries import tables_by_role
from tests.infra.synth import Synthesized


def test_there_are_exactly_the_three_tables(synthesized: Synthesized) -> None:
    assert len(synthesized.of_type("AWS::DynamoDB::Table")) == 3
    assert set(tables_by_role(synthesized)) == set(dynamodb_adapter.TABLES)


@pytest.mark.parametrize("role", sorted(dynamodb_adapter.TABLES))
def test_table_keys_and_ttl_are_the_ones_the_adapter_uses(
    synthesized: Synthesized, role: str
) -> None:
    spec = dynamodb_adapter.TABLES[role]
    table = synthesized.resources[tables_by_role(synthesized)[role]]["Properties"]

    keys = [spec.partition_key, *([spec.sort_key] if spec.sort_key else [])]
    index_keys = [k for index in spec.indexes for k in (index.partition_key, index.sort_key)]
    assert table.get("GlobalSecondaryIndexes", []) == [
        {
            "IndexName": index.name,
            "KeySchema": [
                {"AttributeName": index.partition_key, "KeyType": "HASH"},
                {"AttributeName": index.sort_key, "KeyType": "RANGE"},
            ],
            "Projection": {
                "NonKeyAttributes": list(index.projected),
                "ProjectionType": "INCLUDE",
            },
        }
        for index in spec.indexes
    ]
    assert table["KeySchema"] == [
        {"AttributeName": key, "KeyType": "HASH" if i == 0 else "RANGE"}
        for i, key in enumerate(keys)
    ]
    assert sorted(table["AttributeDefinitions"], key=lambda a: a["AttributeName"]) == sorted(
        ({"AttributeName": key, "AttributeType": "S"} for key in [*keys, *index_keys]),
        key=lambda a: a["AttributeName"],
    )
    if spec.ttl_attribute is None:
        assert "TimeToLiveSpecification" not in table
    else:
        assert table["TimeToLiveSpecification"] == {
            "AttributeName": spec.ttl_attribute,
            "Enabled": True,
        }


@pytest.mark.parametrize("role", sorted(dynamodb_adapter.TABLES))
def test_tables_are_on_demand_recoverable_encrypted_and_retained(
    synthesized: Synthesized, role: str
) -> None:
    resource = synthesized.resources[tables_by_role(synthesized)[role]]
    table = resource["Properties"]

    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    # SSEType KMS without a key id: the AWS managed key (aws/dynamodb).
    assert table["SSESpecification"] == {"SSEEnabled": True}
    assert resource["DeletionPolicy"] == "Retain"
    assert resource["UpdateReplacePolicy"] == "Retain"


def _buckets(synthesized: Synthesized) -> tuple[dict[str, Any], dict[str, Any], str, str]:
    buckets = synthesized.of_type("AWS::S3::Bucket")
    assert len(buckets) == 2
    (blobs_id,) = [k for k, v in buckets.items() if "LoggingConfiguration" in v["Properties"]]
    (logs_id,) = [k for k in buckets if k != blobs_id]
    return buckets[blobs_id], buckets[logs_id], blobs_id, logs_id


def test_blob_bucket_is_private_encrypted_versioned_logged_and_retained(
    synthesized: Synthesized,
) -> None:
    blobs, _, _, logs_id = _buckets(synthesized)
    props = blobs["Properties"]

    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms"}
    assert rule["BucketKeyEnabled"] is True
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["LoggingConfiguration"]["DestinationBucketName"] == {"Ref": logs_id}
    assert blobs["DeletionPolicy"] == "Retain"


@pytest.mark.parametrize("which", ["blobs", "access logs"])
def test_buckets_refuse_requests_without_tls(synthesized: Synthesized, which: str) -> None:
    _, _, blobs_id, logs_id = _buckets(synthesized)
    bucket_id = blobs_id if which == "blobs" else logs_id
    (policy,) = [
        p["Properties"]["PolicyDocument"]
        for p in synthesized.of_type("AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": bucket_id}
    ]
    assert any(
        statement["Effect"] == "Deny"
        and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        for statement in policy["Statement"]
    )


def test_access_log_bucket_is_private(synthesized: Synthesized) -> None:
    _, access_logs, _, _ = _buckets(synthesized)
    block = access_logs["Properties"]["PublicAccessBlockConfiguration"]
    assert len(block) == 4
    assert all(block.values())


def test_blob_prefix_is_the_adapters(synthesized: Synthesized) -> None:
    from ratchet.cdk.contract import BLOB_PREFIX

    assert BLOB_PREFIX == s3_blobs.PREFIX
