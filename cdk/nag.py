"""cdk-nag acknowledgements: each one names the finding and says why it is acceptable."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Accept one cdk-nag finding (e.g. `AwsSolutions-IAM5[Resource::*]`) on `scope`."""
    Validations.of(scope).acknowledge(Acknowledgment(id=finding, reason=reason))
