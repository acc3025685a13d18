"""cdk-nag's AWS Solutions checks: no finding left open, and every acknowledgement answers a
finding that really exists, with a reason."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import aws_cdk
import pytest
from cdk_nag import AwsSolutionsChecks

from cdk.app import build_app
from tests.infra.synth import ASL, Synthesized, synthesize, template_only_context


def test_no_finding_is_left_unacknowledged(synthesized: Synthesized) -> None:
    report = AwsSolutionsChecks().validate_scope(synthesized.stack)
    assert [v.rule_name for v in report.violations] == []
    assert report.success


def test_the_app_synthesizes_with_the_checks_as_a_validation_plugin(tmp_path: Path) -> None:
    # What `cdk synth` runs: the checks registered with Validations.of(app); any open finding
    # would make synth raise.
    app = build_app(template_only_context(), outdir=str(tmp_path), asl_path=ASL)
    assembly = app.synth()
    assert [stack.stack_name for stack in assembly.stacks] == ["Ratchet"]


class _Recorded:
    def __init__(self) -> None:
        self.acknowledgements: list[tuple[str, str]] = []


@pytest.fixture
def recorded_acknowledgements(monkeypatch: pytest.MonkeyPatch) -> _Recorded:
    """Build the stack with every acknowledgement recorded instead of applied."""
    recorded = _Recorded()

    def record(_self: Any, *rules: aws_cdk.Acknowledgment) -> None:
        recorded.acknowledgements.extend((rule.id, rule.reason) for rule in rules)

    monkeypatch.setattr(aws_cdk.Validations, "acknowledge", record)
    return recorded


def test_each_acknowledgement_answers_one_real_finding_and_says_why(
    recorded_acknowledgements: _Recorded,
) -> None:
    bare = synthesize()
    report = AwsSolutionsChecks().validate_scope(bare.stack)
    findings = Counter(
        violation.rule_name
        for violation in report.violations
        for _ in violation.violating_resources
    )

    acknowledged = recorded_acknowledgements.acknowledgements

    assert Counter(finding for finding, _ in acknowledged) == findings
    for finding, reason in acknowledged:
        assert len(reason.split()) >= 12, f"{finding}: {reason!r} is not a reason"
