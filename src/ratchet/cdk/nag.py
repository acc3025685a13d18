"""cdk-nag: its AWS Solutions checks on every synth, and the acknowledgements, each naming the
finding and saying why it is acceptable."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct


def add_checks(app: IConstruct) -> None:
    """Run cdk-nag's AWS Solutions checks on every synth of `app`, through CDK's Validations:
    a finding that is not acknowledged, with a reason, next to its resource fails the synth."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Accept one cdk-nag finding (e.g. `AwsSolutions-IAM5[Resource::*]`) on `scope`."""
    Validations.of(scope).acknowledge(Acknowledgment(id=finding, reason=reason))
