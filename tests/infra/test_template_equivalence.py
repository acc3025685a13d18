"""The repository's app synthesizes what it did before the stack became a construct in the
package (`ratchet.cdk`): the same resources under the same logical ids (a new id would replace
a deployed table, whose data the old one keeps), the same IAM, the same state machine and
outputs. The fingerprints were taken from the stack as `cdk/stack.py` defined it (7216823)."""

from __future__ import annotations

import json

import pytest

from tests.infra.conftest import VARIANTS
from tests.infra.fingerprint import FINGERPRINTS, fingerprint

FIXTURES = {"default": "synthesized", "configured": "configured", "project": "with_project"}
"""Each fingerprint's template, as the session fixture that holds it (synthesized once)."""
SECTIONS = ("resources", "functions", "iam", "state_machines", "outputs", "parameters")


def test_every_variant_has_its_fingerprint() -> None:
    assert sorted(FIXTURES) == sorted(VARIANTS)
    assert sorted(p.stem for p in FINGERPRINTS.glob("*.json")) == sorted(VARIANTS)


@pytest.mark.parametrize("variant", sorted(FIXTURES))
@pytest.mark.parametrize("section", SECTIONS)
def test_the_template_is_the_one_from_before_the_move(
    request: pytest.FixtureRequest, variant: str, section: str
) -> None:
    synthesized = request.getfixturevalue(FIXTURES[variant])
    before = json.loads((FINGERPRINTS / f"{variant}.json").read_text(encoding="utf-8"))

    now = fingerprint(synthesized.template.to_json())

    assert now[section] == before[section]
