"""The REST API: the runs routes for programs (IAM-signed; every body reaches the api function,
whose refusals name the field), the approval routes for people (public, throttled hard, nothing
listed), the gateway's own refusals in the same JSON envelope, the logging, and the account's
API Gateway logging role."""

from __future__ import annotations

import json
import logging
import re
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aws_lambda_powertools.utilities.typing import LambdaContext

from ratchet.cdk.api import PUBLIC_THROTTLE_BURST, PUBLIC_THROTTLE_RATE_PER_SECOND, STAGE
from ratchet.runs import RunRequest
from ratchet.waits import MAX_COMMENT_CHARS
from ratchet.web.routes import RequestRefused, RunsServices
from tests.infra.queries import environment, function_id
from tests.infra.synth import Synthesized

SIGNED = {
    ("POST", "/runs"),
    ("GET", "/runs"),
    ("GET", "/runs/{run_id}"),
    ("GET", "/runs/{run_id}/history"),
    ("GET", "/runs/{run_id}/checkpoints/{step}"),
    ("POST", "/runs/{run_id}/approve"),
    ("POST", "/runs/{run_id}/reject"),
    ("POST", "/runs/{run_id}/retry"),
    ("POST", "/runs/{run_id}/cancel"),
    ("POST", "/runs/{run_id}/fork"),
    ("POST", "/runs/{run_id}/events/{name}"),
    ("POST", "/runs/{run_id}/wake"),
    ("POST", "/runs/{run_id}/hooks/{name}"),
    ("GET", "/runs/{run_id}/steps/{step}/prompt"),
    ("GET", "/schedules"),
    ("POST", "/schedules"),
    ("POST", "/schedules/{name}/pause"),
    ("POST", "/schedules/{name}/resume"),
    ("DELETE", "/schedules/{name}"),
}
APPROVAL_ROUTES = {
    ("GET", "/approvals/{approval_id}"),
    ("POST", "/approvals/{approval_id}"),
    ("POST", "/slack/interactions"),
}
HOOK_ROUTES = {("POST", "/hooks/{hook_id}")}
PUBLIC = APPROVAL_ROUTES | HOOK_ROUTES


def _only(synth: Synthesized, resource_type: str) -> dict[str, Any]:
    (resource,) = synth.of_type(resource_type).values()
    props: dict[str, Any] = resource["Properties"]
    return props


def _paths(synth: Synthesized) -> dict[str, str]:
    """Resource logical id -> its full path (`/runs/{run_id}`)."""
    resources = synth.of_type("AWS::ApiGateway::Resource")

    def path(logical_id: str) -> str:
        props = resources[logical_id]["Properties"]
        parent = props["ParentId"]
        prefix = path(parent["Ref"]) if "Ref" in parent else ""
        return f"{prefix}/{props['PathPart']}"

    return {logical_id: path(logical_id) for logical_id in resources}


def _methods(synth: Synthesized) -> dict[tuple[str, str], dict[str, Any]]:
    """(HTTP method, path) -> the method's properties."""
    paths = _paths(synth)
    methods: dict[tuple[str, str], dict[str, Any]] = {}
    for method in synth.of_type("AWS::ApiGateway::Method").values():
        props = method["Properties"]
        resource = props["ResourceId"]
        path = paths[resource["Ref"]] if "Ref" in resource else "/"
        methods[props["HttpMethod"], path] = props
    return methods


def _integrated_function(method: dict[str, Any]) -> str:
    integration = method["Integration"]
    assert integration["Type"] == "AWS_PROXY"
    (function,) = [
        part["Fn::GetAtt"][0]
        for part in integration["Uri"]["Fn::Join"][1]
        if isinstance(part, dict) and "Fn::GetAtt" in part
    ]
    return str(function)


def _handler_routes(app: Any) -> set[tuple[str, str]]:
    schema = app.get_openapi_schema()
    return {
        (method.upper(), path)
        for path, item in schema.paths.items()
        for method in item.model_dump(exclude_none=True)
    }


def test_the_routes_are_the_signed_runs_api_and_the_public_approval_routes(
    synthesized: Synthesized,
) -> None:
    methods = _methods(synthesized)

    assert set(methods) == SIGNED | PUBLIC
    for route in SIGNED:
        assert methods[route]["AuthorizationType"] == "AWS_IAM", route
    for route in PUBLIC:
        assert methods[route]["AuthorizationType"] == "NONE", route


def test_each_route_proxies_to_the_function_that_serves_it(synthesized: Synthesized) -> None:
    methods = _methods(synthesized)
    api, approvals = function_id(synthesized, "api"), function_id(synthesized, "approvals")

    for route in SIGNED:
        assert _integrated_function(methods[route]) == api, route
    for route in APPROVAL_ROUTES:
        assert _integrated_function(methods[route]) == approvals, route
    for route in HOOK_ROUTES:
        assert _integrated_function(methods[route]) == function_id(synthesized, "hooks"), route


def test_the_public_routes_are_exactly_those_the_approvals_and_hooks_handlers_serve(
    synthesized: Synthesized,
) -> None:
    from ratchet.handlers.approvals import app
    from ratchet.handlers.hooks import app as hooks_app

    assert _handler_routes(app) == APPROVAL_ROUTES
    assert _handler_routes(hooks_app) == HOOK_ROUTES


def test_the_signed_routes_are_exactly_those_the_api_handler_serves() -> None:
    from ratchet.handlers.api import app

    assert _handler_routes(app) == SIGNED


def test_nothing_lists_approvals(synthesized: Synthesized) -> None:
    # The ids are unguessable only as long as no route hands them out.
    paths = {path for _, path in _methods(synthesized)}
    assert not {"/approvals", "/slack"} & paths
    assert not [p for p in paths if p.startswith("/approvals/") and p != "/approvals/{approval_id}"]
    # Nor hooks: a hook id opens nothing by itself, but none is handed out either.
    assert "/hooks" not in paths
    assert not [p for p in paths if p.startswith("/hooks/") and p != "/hooks/{hook_id}"]


def test_public_routes_are_throttled_far_below_the_stage(synthesized: Synthesized) -> None:
    stage = _only(synthesized, "AWS::ApiGateway::Stage")
    settings = {(s["HttpMethod"], s["ResourcePath"]): s for s in stage["MethodSettings"]}
    everything = settings.pop(("*", "/*"))

    public = {(method, "/" + path.replace("/", "~1")) for method, path in PUBLIC}
    assert set(settings) == public, "only the public routes have their own settings"
    for route in settings.values():
        assert route["ThrottlingRateLimit"] == PUBLIC_THROTTLE_RATE_PER_SECOND
        assert route["ThrottlingBurstLimit"] == PUBLIC_THROTTLE_BURST
        assert route["ThrottlingRateLimit"] * 4 <= everything["ThrottlingRateLimit"]
        # A method's settings replace the stage's: the logging must be repeated.
        assert route["LoggingLevel"] == everything["LoggingLevel"]


def test_stage_is_throttled_traced_and_logged_without_request_data(
    synthesized: Synthesized,
) -> None:
    stage = _only(synthesized, "AWS::ApiGateway::Stage")

    everything = next(s for s in stage["MethodSettings"] if s["ResourcePath"] == "/*")
    assert everything["ThrottlingRateLimit"] > 0
    assert everything["ThrottlingBurstLimit"] >= everything["ThrottlingRateLimit"]
    assert everything["LoggingLevel"] == "ERROR"
    # Bodies hold what people wrote, query strings the link signatures.
    assert all(s["DataTraceEnabled"] is False for s in stage["MethodSettings"])
    assert stage["TracingEnabled"] is True
    assert "$context.identity.caller" in stage["AccessLogSetting"]["Format"]
    assert stage["AccessLogSetting"]["DestinationArn"]


def test_the_stack_provides_the_accounts_api_gateway_logging_role_and_keeps_it(
    synthesized: Synthesized,
) -> None:
    # A fresh account has no such role, and a stage that logs cannot deploy without it.
    ((account_id, account),) = synthesized.of_type("AWS::ApiGateway::Account").items()
    role_id = account["Properties"]["CloudWatchRoleArn"]["Fn::GetAtt"][0]
    role = synthesized.resources[role_id]

    # One per account and region, which other APIs come to rely on: never deleted with us.
    for resource in (account, role):
        assert resource["DeletionPolicy"] == "Retain"
        assert resource["UpdateReplacePolicy"] == "Retain"
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "apigateway.amazonaws.com"}
    (policy,) = role["Properties"]["ManagedPolicyArns"]
    assert policy["Fn::Join"][1][-1].endswith(
        ":iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs"
    )
    (stage,) = synthesized.of_type("AWS::ApiGateway::Stage").values()
    assert account_id in stage["DependsOn"]


def test_execution_logs_go_to_a_group_with_a_retention(synthesized: Synthesized) -> None:
    (rest_api,) = synthesized.of_type("AWS::ApiGateway::RestApi")
    name = {"Fn::Join": ["", ["API-Gateway-Execution-Logs_", {"Ref": rest_api}, f"/{STAGE}"]]}
    (group_id,) = [
        logical_id
        for logical_id, group in synthesized.of_type("AWS::Logs::LogGroup").items()
        if group["Properties"].get("LogGroupName") == name
    ]
    assert synthesized.resources[group_id]["Properties"]["RetentionInDays"] == 30
    (stage,) = synthesized.of_type("AWS::ApiGateway::Stage").values()
    assert group_id in stage["DependsOn"], "API Gateway must not create the group first"


def test_no_method_validates_the_request_at_the_gateway(synthesized: Synthesized) -> None:
    # API Gateway's validator answers a 400 that cannot say which field is wrong; the api
    # function's answers name it. So every body, path and query reaches the function as sent.
    methods = _methods(synthesized)

    assert synthesized.of_type("AWS::ApiGateway::RequestValidator") == {}
    assert synthesized.of_type("AWS::ApiGateway::Model") == {}
    for route, method in methods.items():
        assert "RequestValidatorId" not in method, route
        assert "RequestModels" not in method, route
        assert "RequestParameters" not in method, route
        integration = method["Integration"]
        assert integration["Type"] == "AWS_PROXY", route
        assert "RequestTemplates" not in integration, route


@pytest.mark.parametrize("response_type", ["DEFAULT_4XX", "DEFAULT_5XX"])
def test_what_the_gateway_refuses_itself_gets_the_handlers_envelope_and_status(
    synthesized: Synthesized, response_type: str
) -> None:
    responses = {
        r["Properties"]["ResponseType"]: r["Properties"]
        for r in synthesized.of_type("AWS::ApiGateway::GatewayResponse").values()
    }
    assert set(responses) == {"DEFAULT_4XX", "DEFAULT_5XX"}
    response = responses[response_type]

    # No status code: each refusal keeps its own (403 unsigned, 429 throttled, 413 too large).
    assert "StatusCode" not in response
    template = response["ResponseTemplates"]["application/json"]
    # API Gateway substitutes its message as a quoted JSON string.
    answer = template.replace("$context.error.messageString", json.dumps("Too Many Requests"))
    assert RequestRefused.model_validate_json(answer) == RequestRefused(
        error="Too Many Requests", problems=[]
    )


def _refused(method: str, path: str, body: str) -> dict[str, Any]:
    """What the api function answers a request whose body its models refuse."""
    from ratchet.web.runs import build_app

    def start(request: RunRequest, *, request_id: str) -> Any:
        raise AssertionError(f"a refused body started a run: {request!r}")

    services = RunsServices(
        client=None,  # type: ignore[arg-type]
        desk=lambda: pytest.fail("a refused body reached the approval desk"),
        start=start,
        logger=logging.getLogger("tests.infra"),
    )
    run_id = path.split("/")[2] if path.count("/") > 1 else None
    event = {
        "resource": re.sub(r"^/runs/[^/]+", "/runs/{run_id}", path),
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": {"run_id": run_id} if run_id else None,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": path,
            "httpMethod": method,
            "stage": STAGE,
            "requestId": "test",
            "identity": {"userArn": "arn:aws:iam::123456789012:user/ci", "caller": "ci"},
        },
        "body": body,
        "isBase64Encoded": False,
    }
    context = cast(LambdaContext, SimpleNamespace(aws_request_id="test"))
    answer = build_app(lambda: services).resolve(event, context)
    assert answer["statusCode"] == 400, answer
    refused: dict[str, Any] = json.loads(answer["body"])
    return refused


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        # What API Gateway's validator used to refuse without naming the field:
        ("POST", "/runs", {"scenario": "migration", "batchez": 3}, "batchez"),
        ("POST", "/runs", {"scenario": "migration", "max_steps": "many"}, "max_steps"),
        ("POST", "/runs", {"scenario": "migration", "batches": 0}, "batches"),
        ("POST", "/runs", {"scenario": "migration", "notify": {"sms": "+1555"}}, "notify.sms"),
        ("POST", "/runs/r1/approve", {"comment": "x" * (MAX_COMMENT_CHARS + 1)}, "comment"),
        ("POST", "/runs/r1/reject", {"because": "no"}, "because"),
        ("POST", "/runs", "{not json", "(body)"),
    ],
)
def test_the_api_function_names_the_field_of_a_malformed_body(
    method: str, path: str, body: dict[str, Any] | str, field: str
) -> None:
    refused = _refused(method, path, body if isinstance(body, str) else json.dumps(body))

    assert refused["error"] == "invalid request body"
    assert [p["field"] for p in refused["problems"]] == [field]
    assert all(p["message"] for p in refused["problems"])
    for quoted in ("many", "+1555", "xxxx", "not json"):
        assert quoted not in json.dumps(refused), "a refusal never quotes what was sent"


def test_only_this_apis_routes_may_invoke_the_functions(synthesized: Synthesized) -> None:
    (rest_api,) = synthesized.of_type("AWS::ApiGateway::RestApi")
    permissions = synthesized.of_type("AWS::Lambda::Permission").values()
    invoked: set[tuple[str, str]] = set()
    swept = [p for p in permissions if p["Properties"]["Principal"] == "events.amazonaws.com"]
    # Besides the API, only the sweep's rule invokes a function (tests/infra/test_functions.py).
    assert len(swept) == 1
    for permission in permissions:
        props = permission["Properties"]
        if permission in swept:
            continue
        assert props["Principal"] == "apigateway.amazonaws.com"
        source = props["SourceArn"]["Fn::Join"][1]
        assert {"Ref": rest_api} in source
        # `<api>/<stage>/<METHOD>/<path>`, the stage being the deployed one: no console test
        # invokes (`test-invoke-stage`), no wildcard stage or method.
        stage, route = source[-2:]
        assert stage == {"Ref": next(iter(synthesized.of_type("AWS::ApiGateway::Stage")))}
        _, method, path = route.split("/", 2)
        invoked.add((method, f"/{path}"))

    # API Gateway's ARNs name a path parameter `*`.
    assert invoked == {(m, re.sub(r"\{[^}]+\}", "*", p)) for m, p in SIGNED | PUBLIC}


def test_the_public_url_names_the_api_and_stage_not_the_deployment(
    synthesized: Synthesized,
) -> None:
    # The deployment depends on every method, hence on the functions, the state machine
    # and notify: notify's environment must not depend on it (a cycle).
    (rest_api,) = synthesized.of_type("AWS::ApiGateway::RestApi")
    expected = {
        "Fn::Join": [
            "",
            [
                "https://",
                {"Ref": rest_api},
                ".execute-api.",
                {"Ref": "AWS::Region"},
                ".",
                {"Ref": "AWS::URLSuffix"},
                f"/{STAGE}",
            ],
        ]
    }
    for name in ("notify", "approvals", "api"):
        assert environment(synthesized, name)["RATCHET_PUBLIC_URL"] == expected, name


def test_outputs_give_the_approval_and_slack_urls(synthesized: Synthesized) -> None:
    outputs = synthesized.template.to_json()["Outputs"]

    approvals = outputs["ApprovalsUrl"]["Value"]["Fn::Join"][1]
    slack = outputs["SlackInteractivityUrl"]["Value"]["Fn::Join"][1]
    assert approvals[-1] == f"/{STAGE}/approvals/"
    assert slack[-1] == f"/{STAGE}/slack/interactions"
    invoke = outputs["RunsInvokeArn"]["Value"]["Fn::Join"][1]
    assert invoke[-1] == f"/{STAGE}/*/runs*", "every /runs route, and no public one"
