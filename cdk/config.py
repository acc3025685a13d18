"""What a deployer may choose, from CDK context (`cdk deploy -c ratchet:<key>=<value>`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from constructs import Construct

_SECRET_ARN = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[^\s]+$")


@dataclass(frozen=True)
class DeployConfig:
    rollover_after: int = 1000
    """Loop iterations before an execution hands the run to its successor (continue-as-new)."""
    approval_timeout_seconds: int = 7 * 24 * 3600
    checkpoint_retention_days: int = 30
    anthropic_secret_arn: str | None = None
    """A Secrets Manager secret whose value is an Anthropic API key; none: no Claude runs."""

    @classmethod
    def from_context(cls, scope: Construct) -> DeployConfig:
        values: dict[str, Any] = {}
        for field in fields(cls):
            key = "ratchet:" + _camel(field.name)
            raw = scope.node.try_get_context(key)
            if raw is None or raw == "":
                continue
            if field.name == "anthropic_secret_arn":
                if not isinstance(raw, str) or not _SECRET_ARN.match(raw):
                    raise ValueError(f"context {key} must be a Secrets Manager secret ARN: {raw!r}")
                values[field.name] = raw
                continue
            try:
                number = int(raw)
            except (TypeError, ValueError):
                raise ValueError(f"context {key} must be an integer: {raw!r}") from None
            if number < 1:
                raise ValueError(f"context {key} must be at least 1: {raw!r}")
            values[field.name] = number
        return cls(**values)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
