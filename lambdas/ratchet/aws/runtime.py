"""The AWS runtime: the engine wired to DynamoDB (checkpoints, ledger, agent data) and S3 blobs.

What `LocalRuntime` is to a worker process, this is to the step Lambda (and to the CLI's read
commands on deployed tables). It is built once per cold start from `AwsSettings` and clients
the caller made; it creates no client of its own but the optional S3 one, and reads nothing
from the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from ratchet.adapters.dynamodb import DynamoDbCheckpointStore, DynamoDbLedger
from ratchet.adapters.s3_blobs import NoBlobStore, S3BlobStore
from ratchet.aws.settings import AwsSettings
from ratchet.engine.core import Binding, Engine
from ratchet.faults import NO_FAULTS, FaultPlan
from ratchet.ports import BlobStore
from ratchet.runs import Bindings
from ratchet.state import RunOptions, RunState
from ratchet.tools import RunContext

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

SCRATCH = Path("/tmp/ratchet-scratch")
"""Lambda's only writable disk, and the container's alone: never a place for agent data."""
MAX_BINDINGS = 64
"""Runs whose agent stays bound in a warm container; one container serves many runs in turn."""


class AwsRuntime:
    def __init__(
        self,
        settings: AwsSettings,
        dynamodb: DynamoDBClient,
        *,
        s3: Any = None,
        anthropic_api_key: SecretStr | None = None,
    ) -> None:
        """`s3` is a boto3 S3 client for the blob bucket; if the settings name a bucket and
        none is given, a default one is made here. Without a bucket, a tool output that needs
        a blob fails its step with a clear error."""
        self.settings = settings
        self.dynamodb = dynamodb
        self.store = DynamoDbCheckpointStore(
            dynamodb,
            table=settings.checkpoints_table,
            ledger_table=settings.idempotency_table,
            retention_days=settings.checkpoint_retention_days,
        )
        self.ledger = DynamoDbLedger(
            dynamodb,
            table=settings.idempotency_table,
            retention_days=settings.checkpoint_retention_days,
        )
        self.blobs: BlobStore = NoBlobStore()
        if settings.blob_bucket:
            if s3 is None:
                import boto3

                s3 = boto3.client("s3")
            self.blobs = S3BlobStore(s3, settings.blob_bucket)
        self._bindings = Bindings(
            self.context, anthropic_api_key=anthropic_api_key, limit=MAX_BINDINGS
        )

    def context(self, run_id: str, options: RunOptions) -> RunContext:
        """The agent's data lives in the app table (`services`), never on the function's disk:
        the workdir is scratch space in /tmp, gone with the container."""
        return RunContext(
            run_id=run_id,
            options=options,
            workdir=SCRATCH / run_id,
            services={"dynamodb": self.dynamodb, "app_table": self.settings.app_table},
        )

    def bind(self, state: RunState) -> Binding:
        """The run's agent, model and opened resources, built once per container and run."""
        return self._bindings(state)

    def engine(self, *, worker_id: str, logger: Any, faults: FaultPlan = NO_FAULTS) -> Engine:
        return Engine(
            store=self.store,
            ledger=self.ledger,
            blobs=self.blobs,
            bind=self.bind,
            unbind=self._bindings.forget,
            worker_id=worker_id,
            logger=logger,
            faults=faults,
        )

    def close(self) -> None:
        """Nothing to release (the clients are the caller's); here so the CLI can treat both
        runtimes alike."""
