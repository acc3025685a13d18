"""The names the stack shares with the Lambda code and the ASL file.

The construct does not import the functions' code (`ratchet.handlers` and the AWS runtime are
only an asset it ships; `ratchet.schedules`, for its checks, is an exception), so the
environment variable names are repeated here; tests/infra compares them with
`ratchet.runtime.aws_settings.ENVIRONMENT`, so a rename on either side fails a test instead of
a deployed function.
"""

from __future__ import annotations

CHECKPOINTS_TABLE = "RATCHET_CHECKPOINTS_TABLE"
IDEMPOTENCY_TABLE = "RATCHET_IDEMPOTENCY_TABLE"
APP_TABLE = "RATCHET_APP_TABLE"
BLOB_BUCKET = "RATCHET_BLOB_BUCKET"
STATE_MACHINE_ARN = "RATCHET_STATE_MACHINE_ARN"
ROLLOVER_AFTER = "RATCHET_ROLLOVER_AFTER"
MAX_STEPS_PER_INVOCATION = "RATCHET_MAX_STEPS_PER_INVOCATION"
"""The most steps one invocation of the step function takes (`ratchet:maxStepsPerInvocation`)."""
APPROVAL_TIMEOUT_SECONDS = "RATCHET_APPROVAL_TIMEOUT_SECONDS"
CHECKPOINT_RETENTION_DAYS = "RATCHET_CHECKPOINT_RETENTION_DAYS"

ANTHROPIC_SECRET_ARN = "RATCHET_ANTHROPIC_SECRET_ARN"
"""The ARN of the Secrets Manager secret holding the Anthropic API key. Set (on the step and api
functions) only when the deployer configured one: without it, runs use scripted policies."""

MAX_STEP_TIMEOUT_SECONDS = 840
"""The longest step time limit an agent may set (`ratchet.tools.MAX_STEP_TIMEOUT_SECONDS`; the
engine enforces each agent's own). The step function's timeout is derived from it."""

POWERTOOLS_SERVICE_NAME = "ratchet"
POWERTOOLS_METRICS_NAMESPACE = "Ratchet"

HANDLER_MODULE = "ratchet_functions"
"""The package of entry points in `lambdas/`, each calling into `ratchet.handlers`."""

HEAD_SORT_KEY = "HEAD"
"""The sort key of a run's head item (`ratchet.adapters.dynamodb.store.HEAD_SK`): the
status-events function's stream filter lets only the heads' writes through."""

BLOB_PREFIX = "blobs/"
"""Where the S3 blob store keeps its objects (`ratchet.adapters.s3_blobs.PREFIX`)."""

PUBLIC_URL = "RATCHET_PUBLIC_URL"
"""The API stage's base URL, which approval links and the Slack interactivity URL start with."""
LINK_KEY_SECRET_ARN = "RATCHET_LINK_KEY_SECRET_ARN"
HOOK_KEY_SECRET_ARN = "RATCHET_HOOK_KEY_SECRET_ARN"
"""The secret webhook ids and secrets derive from (`ratchet.waiting.hooks`)."""
EMAIL_SENDER = "RATCHET_EMAIL_SENDER"
NOTIFY_EMAILS = "RATCHET_NOTIFY_EMAILS"
"""Comma-separated addresses."""
NOTIFY_SLACK_CHANNEL = "RATCHET_NOTIFY_SLACK_CHANNEL"
SLACK_BOT_TOKEN_SECRET_ARN = "RATCHET_SLACK_BOT_TOKEN_SECRET_ARN"
SLACK_SIGNING_SECRET_ARN = "RATCHET_SLACK_SIGNING_SECRET_ARN"
AGENTS = "RATCHET_AGENTS"
"""A JSON object of the agents the API may start: `{"name": "module:attr"}`."""
MODELS = "RATCHET_MODELS"
"""A JSON object of the project's own models: `{"name": "module:attr"}`."""
SECRETS = "RATCHET_SECRETS"
"""The project's secrets, for the step function: a JSON object of the name the agent reads ->
`secretsmanager:<ARN>` or `ssm:<parameter name>` (`RunContext.secrets`)."""
BEDROCK_MODELS = "RATCHET_BEDROCK_MODELS"
"""A JSON array of the Bedrock model ids the step may invoke (`[]`: none), so the API refuses
a run naming another at start."""
QUEUE_RETRY_SECONDS = "RATCHET_QUEUE_RETRY_SECONDS"
REQUESTS_PER_MINUTE = "RATCHET_REQUESTS_PER_MINUTE"
"""The deployment's model calls a minute (`ratchet:requestsPerMinute`): the step's only."""
MAX_CONCURRENT = "RATCHET_MAX_CONCURRENT"
"""The deployer's bounds on concurrent runs by a name the deployment registers the agent
under (`ratchet:maxConcurrent`): read by the step function only."""
EVENT_BUS_NAME = "RATCHET_EVENT_BUS_NAME"
"""The bus the status-events function puts each change of a run's status on."""
PRICES = "RATCHET_PRICES"
"""The deployer's prices for cost estimates (`ratchet:prices`)."""
PAYLOAD_KEY = "RATCHET_PAYLOAD_KEY"
"""What seals the runs' records and blobs (`ratchet.sealing.SETTING`): `kms:<the stack's key
ARN>` on every function, when the deployment seals payloads (`ratchet:payloadEncryption`)."""
PAYLOAD_ENCRYPTION_CONTEXT = {"ratchet": "payload"}
"""The encryption context the payload codec gives KMS with every data key
(`ratchet.adapters.payload_keys.KmsCodec.ENCRYPTION_CONTEXT`): the functions' grants hold for
it alone, so they let no function use the key directly for anything else."""

SCHEDULED_TIME = "<aws.scheduler.scheduled-time>"
"""The context attribute EventBridge Scheduler replaces with a fire's time in the target's
input (`ratchet.handlers.schedule.SCHEDULED_TIME`)."""
