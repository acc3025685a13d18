"""Configuration of the Lambda handlers: one pydantic model, validated at cold start.

The CDK stack sets exactly these environment variables on every function (a test in
tests/infra compares the template with `ENVIRONMENT`), so a renamed field is caught before a
deploy, not by a function failing at 3 a.m.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ratchet.errors import InvalidInput
from ratchet.limits import (
    DEFAULT_QUEUE_RETRY_SECONDS,
    MAX_REQUESTS_PER_MINUTE,
    parse_overrides,
)
from ratchet.pricing import check_prices
from ratchet.sealing import SETTING, check_setting

ENVIRONMENT = {
    "checkpoints_table": "RATCHET_CHECKPOINTS_TABLE",
    "idempotency_table": "RATCHET_IDEMPOTENCY_TABLE",
    "app_table": "RATCHET_APP_TABLE",
    "blob_bucket": "RATCHET_BLOB_BUCKET",
    "state_machine_arn": "RATCHET_STATE_MACHINE_ARN",
    "rollover_after": "RATCHET_ROLLOVER_AFTER",
    "max_steps_per_invocation": "RATCHET_MAX_STEPS_PER_INVOCATION",
    "approval_timeout_seconds": "RATCHET_APPROVAL_TIMEOUT_SECONDS",
    "checkpoint_retention_days": "RATCHET_CHECKPOINT_RETENTION_DAYS",
    "public_url": "RATCHET_PUBLIC_URL",
    "link_key_secret_arn": "RATCHET_LINK_KEY_SECRET_ARN",
    "hook_key_secret_arn": "RATCHET_HOOK_KEY_SECRET_ARN",
    "email_sender": "RATCHET_EMAIL_SENDER",
    "notify_emails": "RATCHET_NOTIFY_EMAILS",
    "notify_slack_channel": "RATCHET_NOTIFY_SLACK_CHANNEL",
    "slack_bot_token_secret_arn": "RATCHET_SLACK_BOT_TOKEN_SECRET_ARN",
    "slack_signing_secret_arn": "RATCHET_SLACK_SIGNING_SECRET_ARN",
    "slack_api_url": "RATCHET_SLACK_API_URL",
    "agents": "RATCHET_AGENTS",
    "bedrock_models": "RATCHET_BEDROCK_MODELS",
    "prices": "RATCHET_PRICES",
    "max_concurrent": "RATCHET_MAX_CONCURRENT",
    "queue_retry_seconds": "RATCHET_QUEUE_RETRY_SECONDS",
    "requests_per_minute": "RATCHET_REQUESTS_PER_MINUTE",
    "secrets": "RATCHET_SECRETS",
    "models": "RATCHET_MODELS",
    "event_bus_name": "RATCHET_EVENT_BUS_NAME",
    "payload_key": SETTING,
}
"""Setting name -> environment variable, the contract between the stack and the handlers."""

_KINDS = ("secretsmanager", "ssm")

# A loop iteration costs ~7 history events (Task scheduled/started/succeeded, Choice
# entered/exited, ...); an execution is capped at 25,000. 1,000 iterations leave a wide margin.
DEFAULT_ROLLOVER_AFTER = 1000

DEFAULT_MAX_STEPS_PER_INVOCATION = 100
"""At most this many steps per invocation of the step function (`ratchet.engine.budget`):
enough that state transitions are a few percent of a scripted run's bill (2 per invocation,
not per step), few enough that an invocation of quick steps still returns to the state machine
every few tens of seconds. An agent with long steps is held to fewer by the time it has left
(its step time limit a step), down to one."""
MAX_STEPS_PER_INVOCATION = 1000


class AwsSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoints_table: str = Field(min_length=3)
    idempotency_table: str = Field(min_length=3)
    app_table: str = Field(min_length=3)
    blob_bucket: str | None = None
    state_machine_arn: str | None = None
    rollover_after: int = Field(default=DEFAULT_ROLLOVER_AFTER, ge=1, le=3000)
    """Loop iterations (invocations of the step function) before an execution hands the run
    to its successor."""
    max_steps_per_invocation: int = Field(
        default=DEFAULT_MAX_STEPS_PER_INVOCATION, ge=1, le=MAX_STEPS_PER_INVOCATION
    )
    """The most steps one invocation of the step function takes (1: one step each, as before
    there was a choice)."""
    approval_timeout_seconds: int = Field(default=7 * 24 * 3600, ge=1, le=365 * 24 * 3600)
    checkpoint_retention_days: int = Field(default=30, ge=1, le=3650)
    public_url: str | None = Field(default=None, pattern=r"^https?://[^\s?#]+$")
    """The API's base URL (stage included): where approval links point."""
    link_key_secret_arn: str | None = None
    """The Secrets Manager secret whose value signs approval links (the stack creates it)."""
    hook_key_secret_arn: str | None = None
    """The Secrets Manager secret whose value webhook ids and secrets derive from (the stack
    creates it; `ratchet.waiting.hooks`). A key of its own: the hook function never holds the
    key that signs approval links, nor the reverse."""
    email_sender: str | None = None
    """The SES identity approval emails are sent from; none: no email."""
    notify_emails: list[str] = Field(default_factory=list)
    """Who is asked when a run names nobody (comma-separated in the environment)."""
    notify_slack_channel: str | None = None
    slack_bot_token_secret_arn: str | None = None
    slack_signing_secret_arn: str | None = None
    slack_api_url: str = Field(default="https://slack.com/api", pattern=r"^https?://[^\s?#]+$")
    agents: str | None = None
    """The agents the API may start, besides the built-in scenarios: a JSON object of
    `{"name": "package.module:attr"}` (the deployment registers them; callers name them)."""
    models: str | None = None
    """The deployment's own models (`[tool.ratchet] models`), as `agents`: a JSON object of
    `{"name": "package.module:attr"}` that runs name."""
    bedrock_models: tuple[str, ...] | None = None
    """The Bedrock model ids the step function may invoke (`ratchet:bedrockModels`), a JSON
    array, so the API refuses a run naming another before it starts; None where no stack said
    (a client on a laptop): the grant is then checked by the first step."""
    event_bus_name: str = Field(default="default", min_length=1, max_length=1600)
    """Where the status-events function puts each change of a run's status (a bus's name or
    ARN; `ratchet.handlers.status_events`)."""
    prices: str | None = None
    """`RATCHET_PRICES` (`ratchet.pricing`), checked here at cold start rather than by the first
    cost estimate."""
    payload_key: str | None = None
    """What seals the runs' records and blobs before they are stored (`RATCHET_PAYLOAD_KEY`,
    `ratchet.sealing`): the stack sets `kms:<its key's ARN>` on every function that reads or
    writes them when the deployment asks for it (`ratchet:payloadEncryption`); unset, nothing
    is sealed."""

    @field_validator("payload_key")
    @classmethod
    def _payload_key(cls, value: str | None) -> str | None:
        return None if value is None else check_setting(value)

    @field_validator("bedrock_models", mode="before")
    @classmethod
    def _json_list(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as error:
                raise ValueError(f"not a JSON array of model ids: {error}") from None
        return value

    max_concurrent: dict[str, int] = Field(default_factory=dict)
    """Bounds on concurrent runs, over each agent's own `max_concurrent`, by a name the
    deployment registers the agent under (`ratchet.limits`); the stack's `max_concurrent`,
    which the runtime refuses at cold start if a key names no such agent."""
    queue_retry_seconds: int = Field(default=DEFAULT_QUEUE_RETRY_SECONDS, ge=1, le=300)
    """A step that found no free slot is tried again after 1 to this many seconds."""
    requests_per_minute: int | None = Field(default=None, ge=1, le=MAX_REQUESTS_PER_MINUTE)
    """The deployment's model calls a minute, shared by every run (`ratchet.limits`)."""

    secrets: dict[str, str] = Field(default_factory=dict)
    """The project's secrets (`[tool.ratchet] secrets`), for the step function: name ->
    `secretsmanager:<ARN>` or `ssm:<parameter>` (`ratchet.adapters.secrets.AwsSecrets`)."""

    @field_validator("secrets", mode="before")
    @classmethod
    def _secret_references(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as error:
                raise ValueError(f"not a JSON object of secret references: {error}") from None
        if isinstance(value, dict):
            for name, reference in value.items():
                if not (isinstance(reference, str) and reference.split(":", 1)[0] in _KINDS):
                    raise ValueError(f"{name}: not a secretsmanager: or ssm: reference")
        return value

    @field_validator("max_concurrent", mode="before")
    @classmethod
    def _bounds(cls, value: object) -> object:
        return parse_overrides(value) if isinstance(value, str) else value

    @field_validator("prices")
    @classmethod
    def _prices(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                check_prices(value)
            except InvalidInput as error:
                raise ValueError(str(error)) from None
        return value

    def required_for_approvals(self, name: str) -> str:
        """A setting approvals cannot do without (the stack sets it): its value, or an error
        naming its variable."""
        value = getattr(self, name)
        if not value:
            raise RuntimeError(
                f"{ENVIRONMENT[name]} is not set: approvals need it (the stack sets it)"
            )
        return str(value)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AwsSettings:
        """Read the settings; a missing required variable fails here, at cold start."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {
            field: env[name] for field, name in ENVIRONMENT.items() if env.get(name)
        }
        if "notify_emails" in values:
            listed = str(values["notify_emails"]).split(",")
            values["notify_emails"] = [e.strip() for e in listed if e.strip()]
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            # A payload key the codec cannot use would fail every read of a sealed record:
            # said at cold start in one line naming the variable, as a local process says it.
            for refused in error.errors(include_url=False):
                if refused["loc"] == ("payload_key",):
                    message = str(refused["msg"]).removeprefix("Value error, ")
                    raise InvalidInput(f"{SETTING} is not valid: {message}") from None
            raise
