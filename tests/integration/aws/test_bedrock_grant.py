"""A deployment says which Bedrock models its step may invoke (`ratchet:bedrockModels`, passed
to the API as `RATCHET_BEDROCK_MODELS`), so the API refuses a run naming another before it
starts, instead of a first step denied by IAM; and its own prices (`ratchet:prices`, passed as
`RATCHET_PRICES`) are what the API's cost estimates use."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from ratchet.handlers import _wiring
from ratchet.runtime.aws_settings import AwsSettings
from tests.integration.aws.harness import Stack
from tests.integration.aws.test_api import call

GRANTED = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"


def test_a_bedrock_model_the_deployment_does_not_grant_is_refused_naming_model(stack: Stack):
    stack.configure(bedrock_models=json.dumps([GRANTED]))

    status, answer = stack.post_run(
        {"scenario": "migration", "run_id": "b-1", "model": "bedrock:anthropic.claude-v2"}
    )

    assert status == 400
    assert [p["field"] for p in answer["problems"]] == ["model"]
    assert f"may call only these Bedrock models: {GRANTED}" in answer["problems"][0]["message"]
    assert "ratchet:bedrockModels" in answer["problems"][0]["message"]
    assert stack.executions() == []
    assert _wiring.runtime().store.load_head("b-1") is None


def test_a_deployment_that_grants_no_bedrock_model_refuses_every_one(stack: Stack):
    stack.configure(bedrock_models="[]")

    status, answer = stack.post_run({"scenario": "migration", "model": f"bedrock:{GRANTED}"})

    assert status == 400
    assert "may call no Bedrock model" in answer["problems"][0]["message"]
    assert stack.executions() == []


def test_a_granted_model_passes_the_check_and_others_are_not_bedrocks_concern(stack: Stack):
    stack.configure(bedrock_models=json.dumps([GRANTED]))
    runtime = _wiring.runtime()

    runtime.check_model(f"bedrock:{GRANTED}")
    runtime.check_model("scripted")


def test_the_deployments_prices_are_the_ones_the_api_estimates_with(stack: Stack):
    stack.configure(prices=json.dumps({"scripted": {"input": 1, "output": 2}}))

    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": "p-1"})
    assert status == 201, started
    status, run = call("GET", "/runs/p-1")

    assert status == 200
    assert run["cost_usd"] == 0.0  # priced (no tokens yet), where the built-in table has none


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RATCHET_BEDROCK_MODELS", "anthropic.claude-v2"),
        ("RATCHET_BEDROCK_MODELS", '[1, "x"]'),
        ("RATCHET_PRICES", "{not json"),
        ("RATCHET_PRICES", '{"claude*": {"input": -1, "output": 2}}'),
    ],
)
def test_a_malformed_setting_fails_at_cold_start(name: str, value: str):
    environ = {
        "RATCHET_CHECKPOINTS_TABLE": "ckp",
        "RATCHET_IDEMPOTENCY_TABLE": "idm",
        "RATCHET_APP_TABLE": "app",
        name: value,
    }

    with pytest.raises((ValidationError, ValueError)):
        AwsSettings.from_env(environ)
