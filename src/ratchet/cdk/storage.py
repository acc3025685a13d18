"""Where runs live: the checkpoints, idempotency and app tables, and the blob bucket."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

TTL_ATTRIBUTE = "expires_at"
"""Epoch seconds after which DynamoDB may delete the item (step records, ledger entries)."""


def _table(
    scope: Construct,
    construct_id: str,
    *,
    partition_key: str,
    sort_key: str | None = None,
    ttl_attribute: str | None = None,
    stream: dynamodb.StreamViewType | None = None,
    key: kms.IKey | None = None,
) -> dynamodb.Table:
    return dynamodb.Table(
        scope,
        construct_id,
        partition_key=dynamodb.Attribute(name=partition_key, type=dynamodb.AttributeType.STRING),
        sort_key=(
            dynamodb.Attribute(name=sort_key, type=dynamodb.AttributeType.STRING)
            if sort_key
            else None
        ),
        time_to_live_attribute=ttl_attribute,
        stream=stream,
        # Runs are bursty and mostly idle (a run may wait a week for a person): pay per request.
        billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
        point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=True
        ),
        # Without the deployment's own key (`ratchet:kmsKeyArn`), the AWS managed key
        # (aws/dynamodb) rather than the default AWS owned key: every use of the key shows in
        # CloudTrail, with no key policy to maintain and no monthly key fee.
        encryption=(
            dynamodb.TableEncryption.CUSTOMER_MANAGED
            if key
            else dynamodb.TableEncryption.AWS_MANAGED
        ),
        encryption_key=key,
        removal_policy=RemovalPolicy.RETAIN,
    )


RUNS_INDEX_NAME = "runs-by-status"
WAKES_INDEX_NAME = "wakes-owed"


class Storage(Construct):
    """The run's durable state. Data survives the stack: the tables and buckets are retained."""

    def __init__(self, scope: Construct, construct_id: str, *, key: kms.IKey | None = None) -> None:
        """`key`: the deployment's own key, which the tables and the blob bucket then use."""
        super().__init__(scope, construct_id)

        self.checkpoints = _table(
            self,
            "Checkpoints",
            partition_key="run_id",
            sort_key="sk",
            ttl_attribute=TTL_ATTRIBUTE,
            # Every write of a run's head, old and new, for the status-events function: the
            # changes of a run's status come from the commits themselves, so a step that dies
            # right after its commit loses none (ratchet.adapters.dynamodb.stream).
            stream=dynamodb.StreamViewType.NEW_AND_OLD_IMAGES,
            key=key,
        )
        # Run heads by status and last change, for a page of the runs list without a Scan
        # (ratchet.adapters.dynamodb.items.RUNS_INDEX): only head items carry its keys.
        self.checkpoints.add_global_secondary_index(
            index_name=RUNS_INDEX_NAME,
            partition_key=dynamodb.Attribute(name="list_pk", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="list_sk", type=dynamodb.AttributeType.STRING),
            projection_type=dynamodb.ProjectionType.INCLUDE,
            non_key_attributes=["status", "step", "version", "updated_at", "agent"],
        )
        # The wakes still owed to parked executions, for the wake sweep
        # (ratchet.adapters.dynamodb.items.WAKES_INDEX): only a wait or approval item whose
        # waker has not answered yet carries its keys, so it is nearly always empty.
        self.checkpoints.add_global_secondary_index(
            index_name=WAKES_INDEX_NAME,
            partition_key=dynamodb.Attribute(name="wake_pk", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="wake_sk", type=dynamodb.AttributeType.STRING),
            projection_type=dynamodb.ProjectionType.INCLUDE,
            non_key_attributes=["wake_how"],
        )
        self.idempotency = _table(
            self, "Idempotency", partition_key="key", ttl_attribute=TTL_ATTRIBUTE, key=key
        )
        self.app = _table(self, "App", partition_key="pk", sort_key="sk", key=key)

        # Who read or wrote which blob. SSE-S3 because S3 log delivery cannot write to a bucket
        # whose default encryption is SSE-KMS, with the deployment's own key or any other.
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(90))],
            removal_policy=RemovalPolicy.RETAIN,
        )

        self.blobs = s3.Bucket(
            self,
            "Blobs",
            # SSE-KMS with the AWS managed key (or the deployment's own), like the tables; the
            # bucket key keeps the KMS request count (and cost) to about one per object batch
            # instead of one per object.
            encryption=s3.BucketEncryption.KMS if key else s3.BucketEncryption.KMS_MANAGED,
            encryption_key=key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            # Blobs are content-addressed and never overwritten on purpose; versioning keeps a
            # deleted or clobbered blob recoverable, and the lifecycle rule bounds what it keeps.
            versioned=True,
            lifecycle_rules=[
                s3.LifecycleRule(
                    noncurrent_version_expiration=Duration.days(30),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="blobs/",
            removal_policy=RemovalPolicy.RETAIN,
        )
