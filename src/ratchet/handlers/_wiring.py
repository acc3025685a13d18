"""What every handler shares: Powertools' logger, metrics and tracer, and the settings, secrets,
clients and what `ratchet.runtime` builds from them (the runtime, the approval desk, the apps'
services), each made once per container on first use.

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

from ratchet.agents import AgentRegistry
from ratchet.faults import FaultPlan
from ratchet.observability import redacted_json
from ratchet.runtime.aws import AwsRuntime
from ratchet.runtime.aws_settings import AwsSettings

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext
    from mypy_boto3_stepfunctions import SFNClient

    from ratchet.adapters.dynamodb.approvals import AwsApprovals
    from ratchet.approvals.desk import ApprovalDesk
    from ratchet.children import ChildRunDesk
    from ratchet.engine import Engine
    from ratchet.waiting.desk import EventDesk
    from ratchet.web.approvals import ApprovalServices
    from ratchet.web.hooks import HookServices
    from ratchet.web.routes import RunsServices

SERVICE = "ratchet"
METRICS_NAMESPACE = "Ratchet"

# Every line is serialized by `redacted_json`: no task token reaches the log, even when the
# handlers' events are logged whole (POWERTOOLS_LOGGER_LOG_EVENT=true).
logger = Logger(service=SERVICE, json_serializer=redacted_json)
metrics = Metrics(namespace=METRICS_NAMESPACE, service=SERVICE)
# Patch botocore only: patching everything would import every supported library the bundle
# happens to hold (httpx, sqlite3, ...) at cold start.
tracer = Tracer(service=SERVICE, patch_modules=("botocore",))

# Step Functions owns the retries of a step (each attempt visible and counted by the engine),
# so the SDK only smooths over a brief throttle or a dropped connection.
CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 3}, connect_timeout=3, read_timeout=10
)


@cache
def settings() -> AwsSettings:
    return AwsSettings.from_env()


ANTHROPIC_SECRET_ARN = "RATCHET_ANTHROPIC_SECRET_ARN"
"""Set by the stack only when the deployer configured a key (see ratchet/cdk/contract.py)."""


@cache
def anthropic_api_key() -> SecretStr | None:
    """The Anthropic API key from Secrets Manager, read once per container. The stack keeps
    it there rather than in an environment variable, which the console shows to anyone who
    can read the function. Without it, runs can use only their agent's scripted policy."""
    arn = os.environ.get(ANTHROPIC_SECRET_ARN)
    if not arn:
        return None
    secrets: Any = boto3.client("secretsmanager", config=CLIENT_CONFIG)
    return SecretStr(secrets.get_secret_value(SecretId=arn)["SecretString"])


FAULT = "RATCHET_FAULT"
"""Crash the step function at an exact point (`ratchet.faults`), as the CLI's workers can: for
tests only, to run the crash sweep on Lambda. Never set it in a deployment: the stack never
does (tests/infra checks), and a function given it fails its steps on purpose."""


@cache
def faults() -> FaultPlan:
    """The faults this container injects, read once: Lambda's environment is fixed for the
    container's life. A malformed value fails the invocation, naming the variable."""
    return FaultPlan.parse(os.environ.get(FAULT))


@cache
def runtime() -> AwsRuntime:
    return AwsRuntime(
        settings(),
        boto3.client("dynamodb", config=CLIENT_CONFIG),
        s3=boto3.client("s3", config=CLIENT_CONFIG) if settings().blob_bucket else None,
        anthropic_api_key=anthropic_api_key(),
        stepfunctions=stepfunctions,
        hook_key=hook_key,
        kms=kms,
    )


def kms() -> Any:
    """The KMS client of the payload codec (`RATCHET_PAYLOAD_KEY=kms:...`), made with the
    runtime when the settings name a KMS key, and only then."""
    return boto3.client("kms", config=CLIENT_CONFIG)


@cache
def agents() -> AgentRegistry:
    """The agents this deployment registered (`RATCHET_AGENTS`), parsed once per container."""
    return AgentRegistry.deployment(settings().agents, settings().models)


@cache
def stepfunctions() -> SFNClient:
    return boto3.client("stepfunctions", config=CLIENT_CONFIG)


def approvals() -> AwsApprovals:
    return runtime().approvals()


@cache
def _secret(arn: str) -> SecretStr:
    """A Secrets Manager secret's value, read once per container; never logged."""
    secrets: Any = boto3.client("secretsmanager", config=CLIENT_CONFIG)
    return SecretStr(secrets.get_secret_value(SecretId=arn)["SecretString"])


@cache
def approval_desk() -> ApprovalDesk:
    """The runtime's approval desk, with the secrets and the SES client the deployment's
    notifiers need."""
    config = settings()
    token = config.slack_bot_token_secret_arn
    return runtime().approval_desk(
        link_key=_secret(config.required_for_approvals("link_key_secret_arn")),
        ses=boto3.client("sesv2", config=CLIENT_CONFIG) if config.email_sender else None,
        slack_bot_token=_secret(token) if token else None,
        faults=faults(),
    )


def runs_services() -> RunsServices:
    """The runs API's services: starts go to the state machine, decisions to the desk."""
    from ratchet.runtime.services import aws_runs_services

    return aws_runs_services(
        runtime(), agents=agents(), desk=approval_desk, logger=logger, metrics=metrics
    )


def approval_services() -> ApprovalServices:
    from ratchet.runtime.services import approval_services

    signing = settings().slack_signing_secret_arn
    return approval_services(
        approval_desk(),
        slack_signing_secret=_secret(signing) if signing else None,
        logger=logger,
    )


def engine(context: LambdaContext) -> Engine:
    """A fresh engine per invocation, named after it so checkpoints point at its logs."""
    return runtime().engine(
        worker_id=f"lambda:{context.aws_request_id}", logger=logger, faults=faults()
    )


def event_desk(context: LambdaContext) -> EventDesk:
    """The event desk, settling with a fresh engine and waking parked executions with the
    runtime's nudge (their tokens answered, a sleeper restarted)."""
    return runtime().event_desk(engine(context))


def child_runs(context: LambdaContext) -> ChildRunDesk:
    """The child runs' desk, settling parents' waits with a fresh engine and answering the
    parked parent's token."""
    ratchet = engine(context)
    return runtime().child_runs(ratchet, worker_id=ratchet.worker_id, logger=logger)


HOOK_KEY_MISSING = (
    "RATCHET_HOOK_KEY_SECRET_ARN is not set: webhooks need the hook key (the stack sets it)"
)


def hook_key() -> SecretStr:
    """The key webhook ids and secrets derive from, read once per container; never logged."""
    arn = settings().hook_key_secret_arn
    if not arn:
        raise RuntimeError(HOOK_KEY_MISSING)
    return _secret(arn)


def hook_services(context: LambdaContext) -> HookServices:
    """The webhook route's services: the hook items, the key, and the event desk (whose nudge
    answers the token of the execution parked on the wait a delivery settles)."""
    from ratchet.runtime.hooks import aws_hook_services

    return aws_hook_services(runtime(), key=hook_key(), desk=event_desk(context), logger=logger)
