"""The REST API: the runs API for programs (IAM-signed), the approval routes for people, and the
webhook route for senders that sign their deliveries (GitHub, Stripe, CI).

Programs (services, scripts, CI jobs) call the `/runs` routes with SigV4 (IAM) signatures: no
key to distribute or rotate, every call attributable to a principal in CloudTrail, and access
granted with an ordinary `execute-api:Invoke` policy.

People answer approvals from an email link or a Slack button, with no AWS credentials, so those
routes are public: the approval page checks the link's HMAC signature and expiry, the Slack
route checks Slack's request signature and age, both are throttled far below the stage's rate,
and there is no route that lists approvals (an id is 128 random bits). The webhook route is
public on the same terms: each delivery is signed with its hook's secret, and no route lists
hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from ratchet.cdk.nag import acknowledge

STAGE = "v1"
THROTTLE_RATE_PER_SECOND = 20
THROTTLE_BURST = 40
PUBLIC_THROTTLE_RATE_PER_SECOND = 5
PUBLIC_THROTTLE_BURST = 10
"""A person clicks once; mail scanners fetch a link a few times. Far above that is abuse."""


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    function: str
    """The function (see `functions.py`) that serves it, through a proxy integration."""
    public: bool = False
    """No AWS signature: the handler authenticates the request itself (and it is throttled)."""


ROUTES = (
    Route("POST", "/runs", "api"),
    Route("GET", "/runs", "api"),
    Route("GET", "/runs/{run_id}", "api"),
    Route("GET", "/runs/{run_id}/history", "api"),
    Route("GET", "/runs/{run_id}/checkpoints/{step}", "api"),
    Route("POST", "/runs/{run_id}/approve", "api"),
    Route("POST", "/runs/{run_id}/reject", "api"),
    Route("POST", "/runs/{run_id}/retry", "api"),
    Route("POST", "/runs/{run_id}/cancel", "api"),
    Route("POST", "/runs/{run_id}/fork", "api"),
    Route("POST", "/runs/{run_id}/events/{name}", "api"),
    Route("POST", "/runs/{run_id}/wake", "api"),
    Route("POST", "/runs/{run_id}/hooks/{name}", "api"),
    Route("GET", "/runs/{run_id}/steps/{step}/prompt", "api"),
    # A local store's schedules; on AWS each answers 404, naming where schedules are declared.
    Route("GET", "/schedules", "api"),
    Route("POST", "/schedules", "api"),
    Route("POST", "/schedules/{name}/pause", "api"),
    Route("POST", "/schedules/{name}/resume", "api"),
    Route("DELETE", "/schedules/{name}", "api"),
    Route("GET", "/approvals/{approval_id}", "approvals", public=True),
    Route("POST", "/approvals/{approval_id}", "approvals", public=True),
    Route("POST", "/slack/interactions", "approvals", public=True),
    Route("POST", "/hooks/{hook_id}", "hooks", public=True),
)

_REFUSAL = '{"error": $context.error.messageString, "problems": []}'
"""API Gateway's own refusals in the handler's envelope (`RequestRefused`): the message is
API Gateway's (already a quoted JSON string, as in its default `{"message": ...}`), and no
field is named since none of the request's fields is at fault."""

_SIGNED = (
    "The method uses IAM (SigV4) authorization: callers are services and CI jobs with AWS "
    "credentials, not end users signing in to a Cognito user pool."
)
_PUBLIC = {
    "/approvals/{approval_id}": (
        "A person opens this from an email with no AWS credentials or account: the handler "
        "accepts only links whose HMAC-SHA256 signature (key in Secrets Manager) covers the "
        "approval id, run, recipient and expiry; GET changes nothing, a POST decides once, "
        "and the method is throttled to {rate} requests/s."
    ),
    "/slack/interactions": (
        "Slack calls this without AWS credentials: the handler accepts only requests whose "
        "X-Slack-Signature (HMAC-SHA256 with the app's signing secret) matches and whose "
        "timestamp is under 5 minutes old; the method is throttled to {rate} requests/s."
    ),
    "/hooks/{hook_id}": (
        "GitHub, Stripe or a CI server delivers an event here without AWS credentials: the "
        "handler accepts only deliveries signed with HMAC-SHA256 under the hook's secret "
        "(derived from a key in Secrets Manager and the hook's 128-bit id), within 5 minutes "
        "when the sender signs a time, once per delivery id; the method is throttled to "
        "{rate} requests/s."
    ),
}


class RunsApi(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        handlers: Mapping[str, lambda_.IFunction],
        key: kms.IKey | None = None,
    ) -> None:
        """`key`: the deployment's own key, which the access and execution logs then use."""
        super().__init__(scope, construct_id)
        access_logs = logs.LogGroup(
            self, "AccessLogs", retention=logs.RetentionDays.ONE_MONTH, encryption_key=key
        )
        self.rest_api = apigateway.RestApi(
            self,
            "Api",
            description="Ratchet: the runs API and the approval routes",
            endpoint_types=[apigateway.EndpointType.REGIONAL],
            # API Gateway logs through one role per account and region (AWS::ApiGateway::Account);
            # a fresh account has none, and the stage's logging then fails the deploy. The stack
            # provides it and retains it: deleting the stack must not break the logging of other
            # APIs in the account that have come to rely on it.
            cloud_watch_role=True,
            cloud_watch_role_removal_policy=RemovalPolicy.RETAIN,
            deploy_options=apigateway.StageOptions(
                stage_name=STAGE,
                access_log_destination=apigateway.LogGroupLogDestination(access_logs),
                access_log_format=apigateway.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
                # Errors only, and never the request data: bodies hold what people wrote and
                # query strings hold link signatures.
                logging_level=apigateway.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                throttling_rate_limit=THROTTLE_RATE_PER_SECOND,
                throttling_burst_limit=THROTTLE_BURST,
                # A method's settings replace the stage's, so they repeat its logging.
                method_options={
                    f"{route.path}/{route.method}": apigateway.MethodDeploymentOptions(
                        throttling_rate_limit=PUBLIC_THROTTLE_RATE_PER_SECOND,
                        throttling_burst_limit=PUBLIC_THROTTLE_BURST,
                        logging_level=apigateway.MethodLoggingLevel.ERROR,
                        data_trace_enabled=False,
                    )
                    for route in ROUTES
                    if route.public
                },
                tracing_enabled=True,
            ),
        )
        # API Gateway would create this group itself on the first error, kept forever.
        execution_logs = logs.LogGroup(
            self,
            "ExecutionLogs",
            log_group_name=f"API-Gateway-Execution-Logs_{self.rest_api.rest_api_id}/{STAGE}",
            retention=logs.RetentionDays.ONE_MONTH,
            encryption_key=key,
        )
        self.rest_api.deployment_stage.node.add_dependency(execution_logs)

        # No request validator and no body models: every body reaches the function, whose
        # models (`ratchet.handlers.api`, documented in docs/openapi.json) are the contract and
        # whose 400 names the field at fault, which API Gateway's validator cannot. What the
        # gateway still refuses itself (a missing or bad signature, a denied caller, a route
        # that does not exist, throttling, a body over its size limit, an integration that
        # fails) is answered in the handler's envelope, each with its own status code.
        for response_type, construct_id in (
            (apigateway.ResponseType.DEFAULT_4_XX, "Default4xx"),
            (apigateway.ResponseType.DEFAULT_5_XX, "Default5xx"),
        ):
            self.rest_api.add_gateway_response(
                construct_id, type=response_type, templates={"application/json": _REFUSAL}
            )
        for route in ROUTES:
            resource = self.rest_api.root.resource_for_path(route.path)
            method = resource.add_method(
                route.method,
                apigateway.LambdaIntegration(handlers[route.function], allow_test_invoke=False),
                authorization_type=(
                    apigateway.AuthorizationType.NONE
                    if route.public
                    else apigateway.AuthorizationType.IAM
                ),
            )
            if route.public:
                reason = _PUBLIC[route.path].format(rate=PUBLIC_THROTTLE_RATE_PER_SECOND)
                acknowledge(method, "AwsSolutions-APIG4", reason)
                acknowledge(method, "AwsSolutions-COG4", reason)
            else:
                acknowledge(method, "AwsSolutions-COG4", _SIGNED)

        acknowledge(
            self.rest_api,
            "AwsSolutions-APIG3",
            (
                "No WAF: the /runs routes need a valid SigV4 signature, which API Gateway "
                "checks before any function runs; the public approval and webhook routes do "
                "nothing without a valid HMAC link, Slack or webhook signature and are "
                "throttled to "
                f"{PUBLIC_THROTTLE_RATE_PER_SECOND} requests/s. Associate a web ACL with a "
                "rate-based rule if they are ever flooded."
            ),
        )
        acknowledge(
            self.rest_api,
            "AwsSolutions-APIG2",
            (
                "No request validation at the gateway, by design: its validator cannot say "
                "which field is wrong. Every request reaches a function that checks it in full: "
                "the /runs function validates bodies, paths and queries against its models and "
                "answers a 400 naming the field; the approval and webhook routes check their "
                "link, Slack or webhook signature before they read anything else."
            ),
        )
        role = self.rest_api.node.find_child("CloudWatchRole")
        acknowledge(
            role,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonAPIGatewayPushToCloudWatchLogs]",
            (
                "API Gateway's account-wide logging role: the AWS managed policy is the one "
                "AWS documents for it, and the role is assumable by API Gateway only; it "
                "covers every API's log groups in the region, so no narrower resource exists."
            ),
        )

    @property
    def default_url(self) -> str:
        """The stage's base URL, built from the API's id and the stage's literal name.

        Not `rest_api.url`: that names the deployment stage, which depends on every method,
        whose functions the state machine calls, whose notify function needs this URL."""
        stack = Stack.of(self)
        return (
            f"https://{self.rest_api.rest_api_id}.execute-api.{stack.region}."
            f"{stack.url_suffix}/{STAGE}"
        )
