"""The REST API that starts runs: POST /runs, signed with SigV4 (IAM), validated, throttled, logged.

IAM authorization because the callers are services, scripts and CI jobs that already hold AWS
credentials: no key to distribute or rotate, every call attributable to a principal in
CloudTrail, and access granted with an ordinary `execute-api:Invoke` policy.
"""

from __future__ import annotations

from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from cdk.nag import acknowledge

STAGE = "v1"
THROTTLE_RATE_PER_SECOND = 20
THROTTLE_BURST = 40

_STRING = [apigateway.JsonSchemaType.STRING, apigateway.JsonSchemaType.NULL]
_INTEGER = [apigateway.JsonSchemaType.INTEGER, apigateway.JsonSchemaType.NULL]

START_RUN_SCHEMA = apigateway.JsonSchema(
    schema=apigateway.JsonSchemaVersion.DRAFT4,
    title="StartRun",
    # The shape of `ratchet.runs.RunRequest` (tests/infra keeps the two in step), checked before
    # the function is invoked and billed. The handler's model is the full contract: it checks
    # patterns and combinations and says what is wrong in its 400.
    type=apigateway.JsonSchemaType.OBJECT,
    additional_properties=False,
    properties={
        "run_id": apigateway.JsonSchema(type=_STRING, max_length=128),
        "scenario": apigateway.JsonSchema(type=_STRING),
        "agent": apigateway.JsonSchema(type=_STRING),
        "goal": apigateway.JsonSchema(type=_STRING),
        "model": apigateway.JsonSchema(type=_STRING),
        "max_steps": apigateway.JsonSchema(type=_INTEGER, minimum=1),
        "batches": apigateway.JsonSchema(type=_INTEGER, minimum=1),
        "tool_latency_ms": apigateway.JsonSchema(type=_INTEGER, minimum=0),
    },
)


class RunsApi(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, handler: lambda_.IFunction) -> None:
        super().__init__(scope, construct_id)
        access_logs = logs.LogGroup(self, "AccessLogs", retention=logs.RetentionDays.ONE_MONTH)
        self.rest_api = apigateway.RestApi(
            self,
            "Api",
            description="Ratchet: start agent runs",
            endpoint_types=[apigateway.EndpointType.REGIONAL],
            # The account-wide CloudWatch role is a per-region singleton; this stack must not
            # own (or overwrite) it. Access logs need no such role.
            cloud_watch_role=False,
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
                throttling_rate_limit=THROTTLE_RATE_PER_SECOND,
                throttling_burst_limit=THROTTLE_BURST,
                tracing_enabled=True,
            ),
        )
        validator = self.rest_api.add_request_validator(
            "BodyValidator", validate_request_body=True, validate_request_parameters=True
        )
        model = self.rest_api.add_model(
            "StartRun", content_type="application/json", schema=START_RUN_SCHEMA
        )
        runs = self.rest_api.root.add_resource("runs")
        self.start_run = runs.add_method(
            "POST",
            apigateway.LambdaIntegration(handler, allow_test_invoke=False),
            authorization_type=apigateway.AuthorizationType.IAM,
            request_validator=validator,
            request_models={"application/json": model},
        )

        acknowledge(
            self.rest_api,
            "AwsSolutions-APIG3",
            (
                "No WAF: every request must carry a valid SigV4 signature (IAM auth), which API "
                "Gateway checks before the function is invoked, and the stage is throttled. "
                "Associate a web ACL if the API is ever opened to anonymous callers."
            ),
        )
        acknowledge(
            self.rest_api,
            "AwsSolutions-APIG6",
            (
                "Access logs (APIG1) record every request. Execution logs need the account-wide "
                "API Gateway CloudWatch role (AWS::ApiGateway::Account), a per-region singleton "
                "that an application stack should not own or overwrite."
            ),
        )
        acknowledge(
            self.start_run,
            "AwsSolutions-COG4",
            (
                "The method uses IAM (SigV4) authorization: callers are services and CI jobs "
                "with AWS credentials, not end users signing in to a Cognito user pool."
            ),
        )
