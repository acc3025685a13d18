"""What every handler shares: Powertools' logger, metrics and tracer, and the settings, clients
and runtime, each built once per container on first use.

Nothing here reads Ratchet's settings at import time: importing happens in Lambda's init phase
(and in tests that never invoke a handler), the settings are read by the first invocation, and
a missing variable fails that invocation with the variable's name. The Powertools objects
exist at import time because their decorators need them; they read only their own
`POWERTOOLS_*` variables.
"""

from __future__ import annotations

import os
from functools import cache
from typing import TYPE_CHECKING, Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from botocore.config import Config
from pydantic import SecretStr

from ratchet.aws.approvals import ApprovalTokens
from ratchet.aws.runtime import AwsRuntime
from ratchet.aws.settings import AwsSettings
from ratchet.engine.core import Engine

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext
    from mypy_boto3_stepfunctions import SFNClient

SERVICE = "ratchet"
METRICS_NAMESPACE = "Ratchet"

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=METRICS_NAMESPACE, service=SERVICE)
# Patch botocore only: patching everything would import every supported library the bundle
# happens to hold (httpx, sqlite3, ...) at cold start.
tracer = Tracer(service=SERVICE, patch_modules=("botocore",))

# Step Functions owns the retries of a step (each attempt visible and counted by the engine),
# so the SDK only smooths over a brief throttle or a dropped connection.
_CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 3}, connect_timeout=3, read_timeout=10
)


@cache
def settings() -> AwsSettings:
    return AwsSettings.from_env()


ANTHROPIC_SECRET_ARN = "RATCHET_ANTHROPIC_SECRET_ARN"
"""Set by the stack only when the deployer configured a key (see cdk/contract.py)."""


@cache
def anthropic_api_key() -> SecretStr | None:
    """The Anthropic API key from Secrets Manager, read once per container. The stack keeps
    it there rather than in an environment variable, which the console shows to anyone who
    can read the function. Without it, runs can use only their agent's scripted policy."""
    arn = os.environ.get(ANTHROPIC_SECRET_ARN)
    if not arn:
        return None
    secrets: Any = boto3.client("secretsmanager", config=_CLIENT_CONFIG)
    return SecretStr(secrets.get_secret_value(SecretId=arn)["SecretString"])


@cache
def runtime() -> AwsRuntime:
    return AwsRuntime(
        settings(),
        boto3.client("dynamodb", config=_CLIENT_CONFIG),
        s3=boto3.client("s3", config=_CLIENT_CONFIG) if settings().blob_bucket else None,
        anthropic_api_key=anthropic_api_key(),
    )


@cache
def stepfunctions() -> SFNClient:
    return boto3.client("stepfunctions", config=_CLIENT_CONFIG)


def approvals() -> ApprovalTokens:
    return ApprovalTokens(runtime().dynamodb, settings().checkpoints_table)


def engine(context: LambdaContext) -> Engine:
    """A fresh engine per invocation, named after it so checkpoints point at its logs."""
    return runtime().engine(worker_id=f"lambda:{context.aws_request_id}", logger=logger)
