"""Configuration of the Lambda handlers: one pydantic model, validated at cold start.

The CDK stack sets exactly these environment variables on every function (a test in
tests/infra compares the template with `ENVIRONMENT`), so a renamed field is caught before a
deploy, not by a function failing at 3 a.m.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

ENVIRONMENT = {
    "checkpoints_table": "RATCHET_CHECKPOINTS_TABLE",
    "idempotency_table": "RATCHET_IDEMPOTENCY_TABLE",
    "app_table": "RATCHET_APP_TABLE",
    "blob_bucket": "RATCHET_BLOB_BUCKET",
    "state_machine_arn": "RATCHET_STATE_MACHINE_ARN",
    "rollover_after": "RATCHET_ROLLOVER_AFTER",
    "approval_timeout_seconds": "RATCHET_APPROVAL_TIMEOUT_SECONDS",
    "checkpoint_retention_days": "RATCHET_CHECKPOINT_RETENTION_DAYS",
}
"""Setting name -> environment variable, the contract between the stack and the handlers."""

# A loop iteration costs ~7 history events (Task scheduled/started/succeeded, Choice
# entered/exited, ...); an execution is capped at 25,000. 1,000 iterations leave a wide margin.
DEFAULT_ROLLOVER_AFTER = 1000


class AwsSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoints_table: str = Field(min_length=3)
    idempotency_table: str = Field(min_length=3)
    app_table: str = Field(min_length=3)
    blob_bucket: str | None = None
    state_machine_arn: str | None = None
    rollover_after: int = Field(default=DEFAULT_ROLLOVER_AFTER, ge=1, le=3000)
    approval_timeout_seconds: int = Field(default=7 * 24 * 3600, ge=1, le=365 * 24 * 3600)
    checkpoint_retention_days: int = Field(default=30, ge=1, le=3650)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AwsSettings:
        """Read the settings; a missing required variable fails here, at cold start."""
        env = os.environ if environ is None else environ
        values = {field: env[name] for field, name in ENVIRONMENT.items() if env.get(name)}
        return cls.model_validate(values)
