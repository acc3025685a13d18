"""The Lambda functions: one shared code asset, one role and log group per function.

Each function gets its own role with no managed policy: it may write to its own log group and
touch the tables its job needs, nothing else. The names of what it reads from its environment
come from `contract.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from ratchet.cdk import contract
from ratchet.cdk.bundling import ARCHITECTURE, RUNTIME, lambda_code
from ratchet.cdk.nag import acknowledge
from ratchet.cdk.project import Project
from ratchet.cdk.sources import RatchetCode

LOG_RETENTION = logs.RetentionDays.ONE_MONTH


@dataclass(frozen=True)
class FunctionSpec:
    """A function of the stack: its handler module and its size."""

    name: str
    description: str
    timeout: Duration
    memory_mb: int = 256
    wildcards: str = ""
    """Why its role holds actions on `*` besides X-Ray's (cdk-nag's IAM5, acknowledged)."""

    @property
    def handler(self) -> str:
        return f"{contract.HANDLER_MODULE}.{self.name}.handler"


STEP_MARGIN_SECONDS = 60
"""What a step takes beyond its agent's code: a cold start (imports take about a second), and
the engine's own DynamoDB calls around the code (load the head, count the attempt, read the
ledger, commit), each bounded by the client's 3 s connect and 10 s read timeouts. An invocation
takes another step only while its time left holds this and the agent's step time limit
(`ratchet.engine.budget.STEP_MARGIN_SECONDS`, kept equal by tests/infra)."""
STEP = FunctionSpec(
    "step",
    "Advances one run step by step, each step committed before the next.",
    # Above the longest step time limit an agent may set, so that the engine always times a
    # step out (and records why) before Lambda kills the invocation; an invocation that dies
    # anyway (Sandbox.Timedout) is retried by the state machine like any crash.
    timeout=Duration.seconds(contract.MAX_STEP_TIMEOUT_SECONDS + STEP_MARGIN_SECONDS),
    memory_mb=512,
)
NOTIFY = FunctionSpec(
    "notify",
    "Opens the approval request of a waiting run and sends it by email and Slack.",
    timeout=Duration.seconds(30),
)
DECIDE = FunctionSpec(
    "decide", "Applies a person's decision to a waiting run.", timeout=Duration.seconds(30)
)
MARK_FAILED = FunctionSpec(
    "mark_failed", "Marks a run failed, keeping its last checkpoint.", timeout=Duration.seconds(30)
)
API = FunctionSpec(
    "api",
    "The runs API: starts runs (once per run id), lists and shows them, approves and rejects.",
    timeout=Duration.seconds(29),  # API Gateway gives up on an integration after 29 s
)
APPROVALS = FunctionSpec(
    "approvals",
    "The public approval page behind signed links, and Slack's Approve/Reject buttons.",
    # Slack wants an answer within 3 s, cold start included, and gives up after that; a
    # decision takes a few DynamoDB and Step Functions calls. Memory buys CPU, which is most
    # of a cold start (imports), for a function that runs once per decision.
    timeout=Duration.seconds(10),
    memory_mb=1024,
)
OPEN_WAIT = FunctionSpec(
    "open_wait",
    "Parks a run's execution on its event wait, keeping the task token; takes an event sent "
    "before.",
    timeout=Duration.seconds(30),
)
RECORD_WAIT = FunctionSpec(
    "record_wait",
    "Settles a wait whose park ended, if it is due: a timer's time, an event wait's timeout.",
    timeout=Duration.seconds(30),
)
HOOKS = FunctionSpec(
    "hooks",
    "Signed webhook deliveries (GitHub, Stripe, CI): each becomes an event of its run.",
    # GitHub gives up on a delivery after 10 s; it takes a few DynamoDB calls and, when it
    # settles a wait, one Step Functions call. Memory buys CPU for the cold start (imports).
    timeout=Duration.seconds(10),
    memory_mb=1024,
)
SCHEDULE = FunctionSpec(
    "schedule",
    "Starts the run of a schedule's fire (EventBridge Scheduler), once per fire time.",
    # A start as POST /runs makes it: a few DynamoDB calls, the agent's `prepare`, and one
    # Step Functions call.
    timeout=Duration.seconds(29),
)
SWEEP = FunctionSpec(
    "sweep",
    "Every minute: answers the executions parked on waits whose waker settled them and died.",
    # A few calls per wake owed, at most 500 a run (ratchet.waiting.wakes): seconds. A run
    # that overlaps the next minute's is harmless (each write is conditional, an answer
    # twice is refused by Step Functions).
    timeout=Duration.seconds(120),
)
STATUS_EVENTS = FunctionSpec(
    "status_events",
    "Puts an EventBridge event for each change of a run's status, read from the table's stream.",
    # A batch of up to 100 head writes: a Query and a few PutEvents calls for each change.
    timeout=Duration.seconds(60),
    wildcards=(
        " Reading the table's stream through an event source mapping needs "
        "dynamodb:ListStreams, which supports no resource-level permissions either; the "
        "stream's own actions are granted on its ARN alone."
    ),
)
ROLLOVER = FunctionSpec(
    "rollover",
    "Starts the next execution of a long run (continue-as-new).",
    timeout=Duration.seconds(30),
)


def _powertools_environment() -> dict[str, str]:
    return {
        "POWERTOOLS_SERVICE_NAME": contract.POWERTOOLS_SERVICE_NAME,
        "POWERTOOLS_METRICS_NAMESPACE": contract.POWERTOOLS_METRICS_NAMESPACE,
        "POWERTOOLS_LOG_LEVEL": "INFO",
    }


class Functions(Construct):
    """Creates the functions; the state machine and the API are wired to them afterwards."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        code: RatchetCode,
        specs: list[FunctionSpec],
        environment: Mapping[str, str],
        project: Project | None = None,
        key: kms.IKey | None = None,
        sealing: bool = False,
    ) -> None:
        """`key`: the deployment's own key, which the functions' log groups then use;
        `sealing`: the functions seal payloads, so their code holds the codec's packages."""
        super().__init__(scope, construct_id)
        self._key = key
        asset = lambda_code(code, project, sealing=sealing)
        self.by_name: dict[str, lambda_.Function] = {}
        self.roles: dict[str, iam.Role] = {}
        for spec in specs:
            self.by_name[spec.name] = self._function(spec, asset, environment)

    def __getitem__(self, name: str) -> lambda_.Function:
        return self.by_name[name]

    def among(self, names: Iterable[str]) -> list[lambda_.Function]:
        """Those of `names` this stack has (the schedule function only with schedules)."""
        return [self.by_name[name] for name in names if name in self.by_name]

    def _function(
        self, spec: FunctionSpec, code: lambda_.Code, environment: Mapping[str, str]
    ) -> lambda_.Function:
        construct_id = "".join(part.title() for part in spec.name.split("_"))
        log_group = logs.LogGroup(
            self, f"{construct_id}Logs", retention=LOG_RETENTION, encryption_key=self._key
        )
        role = iam.Role(
            self,
            f"{construct_id}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"Ratchet's {spec.name} function",
        )
        log_group.grant_write(role)
        self.roles[spec.name] = role
        function = lambda_.Function(
            self,
            construct_id,
            description=spec.description,
            code=code,
            handler=spec.handler,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            memory_size=spec.memory_mb,
            timeout=spec.timeout,
            role=role,
            log_group=log_group,
            tracing=lambda_.Tracing.ACTIVE,
            environment={**environment, **_powertools_environment()},
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            (
                "Active tracing lets the function send segments to X-Ray "
                "(xray:PutTraceSegments, xray:PutTelemetryRecords); X-Ray supports no "
                "resource-level permissions for these actions." + spec.wildcards
            ),
        )
        acknowledge(
            function,
            "AwsSolutions-L1",
            (
                f"{RUNTIME.name} is the Python that synthesizes the stack, so the bundle ships "
                "bytecode compiled for it: the step handler imports in 0.7-0.9 s on a cold "
                "start instead of 3.2-3.9 s when every module is compiled at start (Lambda's "
                "code folder is read-only)."
            ),
        )
        return function
