"""Claude on Bedrock: the step function may invoke exactly the models a deployer configured
(`ratchet:bedrockModels`), and nothing at all when none is."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk import App
from cdk_nag import AwsSolutionsChecks

from ratchet.cdk import contract
from ratchet.cdk.config import DeployConfig
from ratchet.runtime.aws_settings import AwsSettings
from tests.infra.queries import as_list, environment, function_names, statements_of_function
from tests.infra.synth import Synthesized, synthesize

MODEL = "anthropic.claude-haiku-4-5-20251001-v1:0"
PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
REQUIRED = {
    contract.CHECKPOINTS_TABLE: "ckp",
    contract.IDEMPOTENCY_TABLE: "idm",
    contract.APP_TABLE: "app",
}


@pytest.fixture(scope="module")
def with_bedrock() -> Synthesized:
    return synthesize(context={"ratchet:bedrockModels": f"{MODEL}, {PROFILE}"})


def _rendered(value: Any) -> str:
    """An ARN as text, pseudo-parameters as `${AWS::Region}`."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return "${" + str(value["Ref"]) + "}"
    separator, parts = value["Fn::Join"]
    return str(separator).join(_rendered(part) for part in parts)


def _bedrock_statements(synth: Synthesized, name: str) -> list[dict[str, Any]]:
    return [
        statement
        for statement in statements_of_function(synth, name)
        if any(str(action).startswith("bedrock:") for action in as_list(statement["Action"]))
    ]


def test_no_function_may_invoke_bedrock_by_default(synthesized: Synthesized) -> None:
    for name in function_names(synthesized):
        assert _bedrock_statements(synthesized, name) == [], name


def test_the_step_may_invoke_exactly_the_configured_models(with_bedrock: Synthesized) -> None:
    [statement] = _bedrock_statements(with_bedrock, "step")

    assert statement["Action"] == "bedrock:InvokeModel"
    assert sorted(_rendered(r) for r in as_list(statement["Resource"])) == sorted(
        [
            f"arn:${{AWS::Partition}}:bedrock:${{AWS::Region}}::foundation-model/{MODEL}",
            "arn:${AWS::Partition}:bedrock:${AWS::Region}:${AWS::AccountId}:"
            f"inference-profile/{PROFILE}",
            # The profile routes to its foundation model in any region of its geography.
            f"arn:${{AWS::Partition}}:bedrock:*::foundation-model/{PROFILE.removeprefix('us.')}",
        ]
    )
    for name in function_names(with_bedrock) - {"step"}:
        assert _bedrock_statements(with_bedrock, name) == [], name


def test_the_api_learns_the_granted_models_to_refuse_others_at_start(
    synthesized: Synthesized, with_bedrock: Synthesized
) -> None:
    granted = environment(with_bedrock, "api")[contract.BEDROCK_MODELS]
    none = environment(synthesized, "api")[contract.BEDROCK_MODELS]

    assert AwsSettings.from_env({**REQUIRED, contract.BEDROCK_MODELS: granted}).bedrock_models == (
        MODEL,
        PROFILE,
    )
    assert AwsSettings.from_env({**REQUIRED, contract.BEDROCK_MODELS: none}).bedrock_models == ()


def test_cdk_nag_stays_clean_with_bedrock_configured(with_bedrock: Synthesized) -> None:
    report = AwsSolutionsChecks().validate_scope(with_bedrock.stack)
    assert [v.rule_name for v in report.violations] == []


def test_models_come_as_text_or_a_list_and_wildcards_are_refused() -> None:
    def config(raw: object) -> DeployConfig:
        return DeployConfig.from_context(App(context={"ratchet:bedrockModels": raw}))

    assert config(f"{MODEL},{PROFILE}").bedrock_models == (MODEL, PROFILE)
    assert config([MODEL, MODEL]).bedrock_models == (MODEL,)
    with pytest.raises(ValueError, match="not '\\*'"):
        config("*")
    with pytest.raises(ValueError, match="must be Bedrock model ids"):
        config("claude-sonnet-4-5")
