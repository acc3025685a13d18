"""POST /runs: IAM-signed, validated against the handler's request model, throttled, logged."""

from __future__ import annotations

from typing import Any

from ratchet.runs import RunRequest
from tests.infra.queries import function_id
from tests.infra.synth import Synthesized


def _only(synth: Synthesized, resource_type: str) -> dict[str, Any]:
    (resource,) = synth.of_type(resource_type).values()
    props: dict[str, Any] = resource["Properties"]
    return props


def test_post_runs_is_the_only_method_and_needs_a_sigv4_signature(
    synthesized: Synthesized,
) -> None:
    method = _only(synthesized, "AWS::ApiGateway::Method")
    resource = _only(synthesized, "AWS::ApiGateway::Resource")

    assert (method["HttpMethod"], resource["PathPart"]) == ("POST", "runs")
    assert method["AuthorizationType"] == "AWS_IAM"


def test_post_runs_proxies_to_the_api_function(synthesized: Synthesized) -> None:
    integration = _only(synthesized, "AWS::ApiGateway::Method")["Integration"]
    assert integration["Type"] == "AWS_PROXY"
    uri_parts = integration["Uri"]["Fn::Join"][1]
    assert {"Fn::GetAtt": [function_id(synthesized, "api"), "Arn"]} in uri_parts


def test_body_is_validated_against_the_handlers_request_fields(synthesized: Synthesized) -> None:
    method = _only(synthesized, "AWS::ApiGateway::Method")
    validator = _only(synthesized, "AWS::ApiGateway::RequestValidator")
    schema = _only(synthesized, "AWS::ApiGateway::Model")["Schema"]

    assert validator["ValidateRequestBody"] is True
    assert method["RequestValidatorId"] == {
        "Ref": next(iter(synthesized.of_type("AWS::ApiGateway::RequestValidator")))
    }
    assert set(schema["properties"]) == set(RunRequest.model_fields)
    assert schema["additionalProperties"] is False


def test_stage_is_throttled_traced_and_access_logged(synthesized: Synthesized) -> None:
    stage = _only(synthesized, "AWS::ApiGateway::Stage")

    (settings,) = stage["MethodSettings"]
    assert settings["ThrottlingRateLimit"] > 0
    assert settings["ThrottlingBurstLimit"] >= settings["ThrottlingRateLimit"]
    assert stage["TracingEnabled"] is True
    assert "$context.identity.caller" in stage["AccessLogSetting"]["Format"]
    assert stage["AccessLogSetting"]["DestinationArn"]


def test_the_stack_does_not_take_over_the_accounts_api_gateway_logging_role(
    synthesized: Synthesized,
) -> None:
    assert synthesized.of_type("AWS::ApiGateway::Account") == {}


def test_only_the_deployed_api_may_invoke_the_function(synthesized: Synthesized) -> None:
    (permission,) = synthesized.of_type("AWS::Lambda::Permission").values()
    source = permission["Properties"]["SourceArn"]["Fn::Join"][1]
    assert permission["Properties"]["Principal"] == "apigateway.amazonaws.com"
    assert any("/POST/runs" in str(part) for part in source)
