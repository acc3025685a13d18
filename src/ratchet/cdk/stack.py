"""Ratchet's deployment as one construct: storage, functions, the agent-run state machine, the
API and the approval channels, wired (`RatchetAgents`); and the stack that holds one and nothing
else (`RatchetStack`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

from aws_cdk import ArnFormat, CfnElement, CfnOutput, Duration, Stack
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from ratchet.cdk import contract, functions
from ratchet.cdk.api import STAGE, RunsApi
from ratchet.cdk.approvals import BUILDS_LINKS, ApprovalChannels
from ratchet.cdk.config import PROPS, DeployConfig, profiled_model
from ratchet.cdk.encryption import StoreKey
from ratchet.cdk.functions import Functions
from ratchet.cdk.hooks import READS_HOOK_KEY, Webhooks
from ratchet.cdk.nag import acknowledge
from ratchet.cdk.project import Project
from ratchet.cdk.schedules import Schedules
from ratchet.cdk.sources import RatchetCode
from ratchet.cdk.storage import RUNS_INDEX_NAME, WAKES_INDEX_NAME, Storage
from ratchet.cdk.workflow import AgentRunStateMachine, AslDefinition, state_machine_arn
from ratchet.waiting.wakes import SWEEP_EVERY_SECONDS

TABLES_USED = {
    "step": ("checkpoints", "idempotency", "app"),
    # Reads the run's head, then stores the task token in the run's partition.
    "notify": ("checkpoints",),
    "decide": ("checkpoints", "idempotency"),
    "mark_failed": ("checkpoints", "idempotency"),
    # Creates the run; a scenario's `prepare` seeds its data in the app table. Reads runs and
    # decides their approvals (the approval items live in the checkpoints table).
    "api": ("checkpoints", "idempotency", "app"),
    "rollover": ("checkpoints",),
    # Reads the approval item and the run's head, settles the item, drops its token.
    "approvals": ("checkpoints",),
    # Keeps the parked execution's token in the run's wait item; takes an event from the
    # run's mailbox, settling the wait (head and record, the event's item) in one commit.
    "open_wait": ("checkpoints",),
    # Reads the run's head; settles a wait that is due (head and record).
    "record_wait": ("checkpoints",),
    # Reads the hook item (its own partition, `hook#<id>`) and the run's head; keeps the
    # delivery in the run's mailbox and settles its wait in one commit; drops the wait's token.
    "hooks": ("checkpoints",),
    # Creates a fire's run as the API creates one (a scenario's `prepare` seeds the app table).
    "schedule": ("checkpoints", "idempotency", "app"),
    # Reads the wakes owed, the run's head, wait and approval items; settles a wait its waker
    # did not reach (head and record, the event's item); drops a wake or a token it answered.
    "sweep": ("checkpoints",),
    # Reads the record of the commit that changed a run's status (the stream holds its head).
    "status_events": ("checkpoints",),
}
"""The tables each function reads and writes (conditional writes need both)."""

TABLE_ACTIONS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ("open_wait", "record_wait", "hooks", "sweep"),
        ("dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem", "dynamodb:UpdateItem"),
    ),
    "status_events": ("dynamodb:GetItem", "dynamodb:Query"),
}
"""Functions granted only these actions on their tables rather than all of reading and writing:
items read by key or by a run's partition, put and updated one by one or in a transaction
(TransactWriteItems is authorised item by item); never scanned, batched or deleted. The
status-events function only reads a run's partition."""

READ_WRITE_ACTIONS = (
    "dynamodb:BatchGetItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:DeleteItem",
    "dynamodb:DescribeTable",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:Query",
    "dynamodb:Scan",
    "dynamodb:UpdateItem",
)
"""Reading and writing a table's items (CDK's `grant_read_write_data` less the stream, which
only the status-events function reads, through its event source), granted on the table alone:
`Table.grant` would add every index of the table."""

LISTS_RUNS = ("api",)
"""Queries the checkpoints table's runs index for a page of runs (`GET /runs`); no other
function reads the index."""

LISTS_WAKES = ("sweep",)
"""Queries the checkpoints table's wakes index for the wakes still owed; no other function
reads it (the wakers write its keys on the items they own)."""

READS_BLOBS = ("open_wait", "sweep")
"""Besides the step (which stores them): an event wait's schema is checked against a large
payload the sender kept in the blob store, read back by its hash (open_wait delivers what came
before the park, the sweep what a sender left undelivered)."""

STORES_BLOBS = ("hooks",)
"""Besides the step: a webhook delivery's payload over the inline size goes to the blob store
by its hash (and is read back to check it against the wait's schema)."""

NUDGES_WAITS = ("open_wait", "hooks", "step", "mark_failed")
"""SendTaskSuccess only, with the token of an execution parked on an event wait (or on its
child runs): open_wait answers its own task when the wait was settled before it kept the
token; the hooks function wakes the execution whose wait a delivery settled; the step and
mark_failed wake a parent whose last child (or first, as it waits) the run they ended was."""

STARTS_CHILDREN = ("step",)
"""StartExecution on this state machine: a step that starts child runs (`start_runs`) starts
each in an execution of its own, named after the child's id."""

READS_ANTHROPIC_KEY = ("step", "api", "schedule")
"""The step calls Claude; the API refuses a Claude run when no key is configured, and a run it
starts defaults to Claude when one is: a schedule's fire starts its runs as the API does."""

ANSWERS_EXECUTIONS = ("approvals", "api", "sweep")
"""SendTaskSuccess/SendTaskFailure with a parked execution's token: the approval page and Slack
(the approvals function), POST /runs/{id}/approve and /reject (the api function), and the wake
sweep, for a decision or a settled wait whose waker died before answering. Notify only stores
the token; decide runs after the answer."""

RESTARTS_SLEEPERS = ("api", "sweep")
"""ListExecutions, StartExecution and StopExecution on this state machine: a sleeping run
woken early has its execution restarted (`AwsRuntime.relaunch`), by `POST /runs/{id}/wake`, or
by the sweep when that waker died between the wake and the restart."""

BEDROCK_ACTIONS = ("bedrock:InvokeModel",)
"""What the step needs to call Claude on Bedrock: one synchronous call per step, no streaming."""

READS_AGENTS = ("api", "step", "schedule")
"""The API (and a schedule's fire) starts only agents the deployment registered, by name
(`RATCHET_AGENTS`); the step loads run agents, so it is given the same registry."""

STARTS_RUNS = ("api", "schedule")
"""Create runs and start their executions (StartExecution on the machine); refuse at start a
Bedrock model the step may not invoke (`RATCHET_BEDROCK_MODELS`)."""

CALLS_EXECUTIONS = frozenset(
    {*STARTS_RUNS, *RESTARTS_SLEEPERS, *STARTS_CHILDREN, "rollover", *ANSWERS_EXECUTIONS}
    | set(NUDGES_WAITS)
)
"""Every function that hands an execution data (StartExecution's input, SendTaskSuccess's and
SendTaskFailure's output) or stops one: with the deployment's own key, Step Functions encrypts
and decrypts that data with it, as the caller."""


OPENS_PAYLOADS_ONLY = ("status_events", "rollover")
"""With payloads sealed (`ratchet:payloadEncryption`), every function reads the runs' records
and so opens them (kms:Decrypt); these seal none: the status-events function reads the record
a head's change was committed with, the rollover function the head it continues from. Every
other function writes a head, a record, an approval, an event or a blob (kms:GenerateDataKey
too)."""

OUTPUTS = (
    "RunsUrl",
    "RunsInvokeArn",
    "ApprovalsUrl",
    "SlackInteractivityUrl",
    "LinkKeySecretArn",
    "HooksUrl",
    "HookKeySecretArn",
    "StateMachineArn",
    "StoreUrl",
    "BlobBucket",
)
"""The stack's outputs, by the names scripts and `cloudformation describe-stacks` read them."""


class RatchetAgents(Construct):
    """Ratchet on AWS for the agents of a project, in a stack of your own CDK app.

    It builds the three tables and the blob bucket, the functions (one code asset: Ratchet,
    its dependencies and the project's packages), the agent-run state machine, the REST API
    (the IAM-signed runs API; the approval, Slack and webhook routes), the project's
    schedules and the wake sweep, every secret and permission they need, and the stack's
    outputs (`OUTPUTS`). One per stack: the state machine and the outputs are named after it.

    `project` is a folder holding a `pyproject.toml` with a `[tool.ratchet]` table (or a
    `ratchet.toml`), or the file itself. Every other keyword is a setting, named as its
    context key is in snake case (`rollover_after` for `ratchet:rolloverAfter`; docs/deploy.md
    lists them): a prop given wins over the context key, which wins over the default. A value
    the functions would refuse fails the synth, naming its prop.
    """

    api: apigateway.RestApi
    """The REST API: `/runs` (IAM-signed), and the public approval, Slack and webhook routes."""
    checkpoints_table: dynamodb.Table
    idempotency_table: dynamodb.Table
    app_table: dynamodb.Table
    """The agents' own data (`RunContext.data`; a scenario's `prepare`)."""
    blob_bucket: s3.Bucket
    """Large tool outputs, by content hash under `blobs/`."""
    state_machine: sfn.StateMachine
    kms_key: kms.IKey | None
    """The deployment's own key (`kms_key_arn`), which every store uses; none: AWS's keys."""
    functions: dict[str, lambda_.Function]
    """By name: step, notify, decide, mark_failed, api, approvals, open_wait, record_wait,
    hooks, sweep, and rollover and schedule when the machine and the project use them."""
    roles: dict[str, iam.Role]
    """Each function's own role, by the function's name: grant a tool what it calls on
    `roles["step"]`, where the tools run."""
    store_url: str
    """The `--store` of `ratchet status` and the other read commands (CloudFormation tokens
    until deployed)."""
    runs_url: str
    """`POST` here starts a run."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        project: str | Path | None = None,
        asl_path: Path | None = None,
        **props: Any,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        if stack.node.try_find_child(OUTPUTS[0]) is not None:
            raise ValueError(
                f"stack {stack.node.path} holds a RatchetAgents already: one per stack (its "
                "state machine and its outputs are named after the stack)"
            )
        config = DeployConfig.from_context(self, {**props, "project": project})
        code = RatchetCode.find()
        definition = AslDefinition.load(asl_path or code.state_machine)
        store_key = StoreKey.of(self, config.kms_key_arn) if config.kms_key_arn else None
        key = store_key.key if store_key is not None else None
        storage = Storage(self, "Storage", key=key)

        state_machine_name = f"{stack.stack_name}-agent-run"
        specs = [functions.STEP, functions.NOTIFY, functions.DECIDE, functions.MARK_FAILED]
        specs += [functions.API, functions.APPROVALS, functions.OPEN_WAIT, functions.RECORD_WAIT]
        specs += [functions.HOOKS, functions.SWEEP, functions.STATUS_EVENTS]
        if "rollover" in definition.functions:
            specs.append(functions.ROLLOVER)
        scheduled = config.project.schedules if config.project is not None else ()
        if scheduled:
            specs.append(functions.SCHEDULE)
        lambdas = Functions(
            self,
            "Functions",
            code=code,
            project=config.project,
            specs=specs,
            key=key,
            sealing=config.payload_encryption,
            environment={
                contract.CHECKPOINTS_TABLE: storage.checkpoints.table_name,
                contract.IDEMPOTENCY_TABLE: storage.idempotency.table_name,
                contract.APP_TABLE: storage.app.table_name,
                contract.BLOB_BUCKET: storage.blobs.bucket_name,
                contract.ROLLOVER_AFTER: str(config.rollover_after),
                contract.APPROVAL_TIMEOUT_SECONDS: str(config.approval_timeout_seconds),
                contract.CHECKPOINT_RETENTION_DAYS: str(config.checkpoint_retention_days),
            },
        )

        tables: dict[str, dynamodb.Table] = {
            "checkpoints": storage.checkpoints,
            "idempotency": storage.idempotency,
            "app": storage.app,
        }
        for name, function in lambdas.by_name.items():
            for table in TABLES_USED[name]:
                iam.Grant.add_to_principal(
                    grantee=function,
                    actions=list(TABLE_ACTIONS.get(name, READ_WRITE_ACTIONS)),
                    resource_arns=[tables[table].table_arn],
                )
        for name in LISTS_RUNS:
            iam.Grant.add_to_principal(
                grantee=lambdas[name],
                actions=["dynamodb:Query"],
                resource_arns=[f"{storage.checkpoints.table_arn}/index/{RUNS_INDEX_NAME}"],
            )
        for name in LISTS_WAKES:
            iam.Grant.add_to_principal(
                grantee=lambdas[name],
                actions=["dynamodb:Query"],
                resource_arns=[f"{storage.checkpoints.table_arn}/index/{WAKES_INDEX_NAME}"],
            )

        self._grant_blobs(lambdas, storage)
        if config.bedrock_models:
            self._grant_bedrock(lambdas, config.bedrock_models)
        if config.anthropic_secret_arn:
            secret = secretsmanager.Secret.from_secret_complete_arn(
                self, "AnthropicApiKey", config.anthropic_secret_arn
            )
            for reader in lambdas.among(READS_ANTHROPIC_KEY):
                reader.add_environment(contract.ANTHROPIC_SECRET_ARN, secret.secret_arn)
                secret.grant_read(reader)

        workflow = AgentRunStateMachine(
            self,
            "AgentRun",
            definition=definition,
            functions=lambdas.by_name,
            state_machine_name=state_machine_name,
            key=key,
        )
        state_machine = workflow.state_machine
        api_function = lambdas["api"]
        for starter in lambdas.among(STARTS_RUNS):
            starter.add_environment(contract.STATE_MACHINE_ARN, state_machine.state_machine_arn)
            # A start refuses a run the step could not serve: a Bedrock model not granted.
            starter.add_environment(
                contract.BEDROCK_MODELS,
                json.dumps(list(config.bedrock_models), separators=(",", ":")),
            )
            state_machine.grant_start_execution(starter)
        if config.prices:
            api_function.add_environment(contract.PRICES, config.prices)
        lambdas["step"].add_environment(
            contract.QUEUE_RETRY_SECONDS, str(config.queue_retry_seconds)
        )
        lambdas["step"].add_environment(
            contract.MAX_STEPS_PER_INVOCATION, str(config.max_steps_per_invocation)
        )
        if config.max_concurrent:
            lambdas["step"].add_environment(contract.MAX_CONCURRENT, config.max_concurrent)
        if config.requests_per_minute is not None:
            lambdas["step"].add_environment(
                contract.REQUESTS_PER_MINUTE, str(config.requests_per_minute)
            )
        # Cancelling a run stops its execution, found among the machine's running ones; a
        # sleeper woken early is restarted: its successor started, the sleeper stopped.
        for restarter in lambdas.among(RESTARTS_SLEEPERS):
            if restarter not in lambdas.among(STARTS_RUNS):
                restarter.add_environment(
                    contract.STATE_MACHINE_ARN, state_machine.state_machine_arn
                )
                state_machine.grant_start_execution(restarter)
            state_machine.grant(restarter, "states:ListExecutions")
            restarter.add_to_role_policy(
                iam.PolicyStatement(
                    actions=["states:StopExecution"],
                    resources=[
                        Stack.of(self).format_arn(
                            service="states",
                            resource="execution",
                            resource_name=f"{state_machine_name}:*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    ],
                )
            )
        for name in RESTARTS_SLEEPERS:
            acknowledge(
                lambdas.roles[name],
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:states:<AWS::Region>:"
                f"<AWS::AccountId>:execution:{state_machine_name}:*]",
                "Execution names derive from run ids, unknown at deploy time; the statement "
                "allows only StopExecution, on this state machine's executions only (a run's "
                "cancel stops its execution; a sleeper woken early is stopped once its "
                "successor runs).",
            )
        for name in STARTS_CHILDREN:
            # The machine's ARN from its name, as for the rollover: the machine invokes the
            # step, so its ARN would make each depend on the other.
            own_arn = state_machine_arn(self, state_machine_name)
            lambdas[name].add_environment(contract.STATE_MACHINE_ARN, own_arn)
            lambdas[name].add_to_role_policy(
                iam.PolicyStatement(actions=["states:StartExecution"], resources=[own_arn])
            )
        if "rollover" in lambdas.by_name:
            own_arn = state_machine_arn(self, state_machine_name)
            rollover = lambdas["rollover"]
            rollover.add_environment(contract.STATE_MACHINE_ARN, own_arn)
            rollover.add_to_role_policy(
                iam.PolicyStatement(actions=["states:StartExecution"], resources=[own_arn])
            )

        for name in ANSWERS_EXECUTIONS:
            state_machine.grant_task_response(lambdas[name])
        # Answering an event wait's parked task: SendTaskSuccess only (`NUDGES_WAITS`). The
        # machine's ARN from its name, as the machine calls open_wait (its ARN would make each
        # depend on the other).
        for name in NUDGES_WAITS:
            lambdas[name].add_to_role_policy(
                iam.PolicyStatement(
                    actions=["states:SendTaskSuccess"],
                    resources=[state_machine_arn(self, state_machine_name)],
                )
            )
        if config.agents_json:
            for reader in lambdas.among(READS_AGENTS):
                reader.add_environment(contract.AGENTS, config.agents_json)
        if scheduled:
            Schedules(self, "Schedules", specs=scheduled, function=lambdas["schedule"])
        events.Rule(
            self,
            "WakeSweep",
            description="Every minute: Ratchet's sweep of the wakes owed to parked executions",
            schedule=events.Schedule.rate(Duration.seconds(SWEEP_EVERY_SECONDS)),
            # Not retried: the next minute's run takes whatever this one left.
            targets=[targets.LambdaFunction(lambdas["sweep"], retry_attempts=0)],
        )

        self._put_status_events(lambdas, storage, config.event_bus_name)

        if config.project is not None:
            self._give_the_tools(lambdas, config.project)

        api = RunsApi(self, "Runs", handlers=lambdas.by_name, key=key)
        public_url = config.public_url or api.default_url
        channels = ApprovalChannels(
            self, "Approvals", config=config, functions=lambdas, public_url=public_url, key=key
        )
        webhooks = Webhooks(self, "Webhooks", functions=lambdas, key=key)
        if store_key is not None:
            readers = [(name, channels.link_key.secret_arn) for name in BUILDS_LINKS]
            readers += [(name, webhooks.hook_key.secret_arn) for name in READS_HOOK_KEY]
            self._grant_key(store_key, lambdas, storage, state_machine_name, readers)
            if config.payload_encryption:
                self._seal_payloads(store_key, lambdas)

        self.api = api.rest_api
        self.checkpoints_table = storage.checkpoints
        self.idempotency_table = storage.idempotency
        self.app_table = storage.app
        self.blob_bucket = storage.blobs
        self.state_machine = state_machine
        self.kms_key = key
        self.functions = dict(lambdas.by_name)
        self.roles = dict(lambdas.roles)
        self.runs_url = api.rest_api.url_for_path("/runs")
        self.store_url = (
            f"dynamodb://{storage.checkpoints.table_name}"
            f"?ledger={storage.idempotency.table_name}&app={storage.app.table_name}"
            f"&region={stack.region}&machine={state_machine.state_machine_arn}"
        )

        # On the stack, by their own names, wherever the construct sits: `cdk deploy
        # --outputs-file` and `describe-stacks` find them as the docs name them.
        CfnOutput(stack, "RunsUrl", value=self.runs_url)
        CfnOutput(
            stack,
            "RunsInvokeArn",
            description="Grant callers execute-api:Invoke on this ARN (every /runs route)",
            value=api.rest_api.arn_for_execute_api("*", "/runs*", STAGE),
        )
        CfnOutput(
            stack,
            "ApprovalsUrl",
            description="Approval links start with this URL (RATCHET_PUBLIC_URL + /approvals/)",
            value=f"{public_url}/approvals/",
        )
        CfnOutput(
            stack,
            "SlackInteractivityUrl",
            description="The Request URL of the Slack app's Interactivity settings",
            value=f"{public_url}/slack/interactions",
        )
        CfnOutput(
            stack,
            "LinkKeySecretArn",
            description="The secret that signs approval links (rotate by hand: docs/deploy.md)",
            value=channels.link_key.secret_arn,
        )
        CfnOutput(
            stack,
            "HooksUrl",
            description="Webhook URLs start with this (a run's: ratchet.runtime.hooks)",
            value=f"{public_url}/hooks/",
        )
        CfnOutput(
            stack,
            "HookKeySecretArn",
            description="The secret webhook ids and secrets derive from (rotating it revokes all)",
            value=webhooks.hook_key.secret_arn,
        )
        CfnOutput(stack, "StateMachineArn", value=state_machine.state_machine_arn)
        CfnOutput(
            stack,
            "StoreUrl",
            description="The --store of the ratchet CLI's read commands",
            value=self.store_url,
        )
        CfnOutput(stack, "BlobBucket", value=storage.blobs.bucket_name)

    def _grant_key(
        self,
        store_key: StoreKey,
        lambdas: Functions,
        storage: Storage,
        state_machine_name: str,
        secret_readers: list[tuple[str, str]],
    ) -> None:
        """Each function's uses of the deployment's own key, each through the one service that
        calls KMS for it (docs/security.md): every function reads or writes a table; the
        functions that get or put blobs; those that start, stop or answer executions; those
        that read the stack's secrets (function name, secret ARN). The machine's role gets
        its own from CDK (`CustomerManagedEncryptionConfiguration`)."""
        for function in lambdas.by_name.values():
            store_key.grant_tables(function)
        writers = {"step", *STORES_BLOBS}
        for name in sorted({"step", *READS_BLOBS, *STORES_BLOBS}):
            store_key.grant_blobs(lambdas[name], storage.blobs.bucket_arn, writes=name in writers)
        # The machine's ARN from its name: the machine calls some of these functions, so its
        # ARN would make each depend on the other.
        machine = state_machine_arn(self, state_machine_name)
        for function in lambdas.among(sorted(CALLS_EXECUTIONS)):
            store_key.grant_executions(function, machine)
        for name, secret_arn in secret_readers:
            store_key.grant_secret(lambdas[name], secret_arn)

    def _seal_payloads(self, store_key: StoreKey, lambdas: Functions) -> None:
        """Every function seals what it stores of the runs and opens what it reads
        (`RATCHET_PAYLOAD_KEY=kms:<the key's ARN>`, `ratchet.sealing`), each granted the uses
        of the key its codec makes (`OPENS_PAYLOADS_ONLY` never seals): docs/security.md."""
        for name, function in lambdas.by_name.items():
            function.add_environment(contract.PAYLOAD_KEY, f"kms:{store_key.key.key_arn}")
            store_key.grant_payloads(function, writes=name not in OPENS_PAYLOADS_ONLY)

    def _give_the_tools(self, lambdas: Functions, project: Project) -> None:
        """What the project's tools need, on the step function alone (where they run): read
        access to each of its secrets (and `RATCHET_SECRETS`, how to fetch them), its plain
        environment, and its IAM statements, each wildcard acknowledged with its reason."""
        step, role = lambdas["step"], lambdas.roles["step"]
        fetched: dict[str, str] = {}
        for name, reference in project.secrets.items():
            kind, arn = self._secret_arn(reference)
            fetched[name] = f"{kind}:{arn}" if kind == "secretsmanager" else f"ssm:{arn}"
            action = (
                "secretsmanager:GetSecretValue" if kind == "secretsmanager" else "ssm:GetParameter"
            )
            step.add_to_role_policy(iam.PolicyStatement(actions=[action], resources=[arn]))
        if fetched:
            step.add_environment(contract.SECRETS, json.dumps(fetched, separators=(",", ":")))
        if project.models:
            models = json.dumps(dict(project.models), separators=(",", ":"))
            # The API (and a schedule's fire) checks a run's model; the step builds it.
            for reader in lambdas.among(READS_AGENTS):
                reader.add_environment(contract.MODELS, models)
        for name, value in project.environment.items():
            step.add_environment(name, value)
        for permission in project.permissions:
            step.add_to_role_policy(
                iam.PolicyStatement(
                    actions=list(permission.actions), resources=list(permission.resources)
                )
            )
            for finding in permission.wildcards:
                acknowledge(role, f"AwsSolutions-IAM5[{finding}]", permission.reason or "")

    def _secret_arn(self, reference: str) -> tuple[str, str]:
        """`secretsmanager` or `ssm`, and the ARN a grant names, of a project's secret."""
        if reference.startswith("arn:"):
            kind = reference.split(":")[2]
            if kind == "secretsmanager" and not re.search(r"-[A-Za-z0-9]{6}$", reference):
                reference += "-??????"  # a name's ARN: Secrets Manager adds six characters
            return kind, reference
        kind, name = reference.split(":", 1)
        if kind == "secretsmanager":
            return kind, Stack.of(self).format_arn(
                service="secretsmanager",
                resource="secret",
                resource_name=f"{name}-??????",
                arn_format=ArnFormat.COLON_RESOURCE_NAME,
            )
        return kind, Stack.of(self).format_arn(
            service="ssm",
            resource="parameter",
            resource_name=name.lstrip("/"),
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )

    def _grant_bedrock(self, lambdas: Functions, models: tuple[str, ...]) -> None:
        """The step calls Claude on Bedrock (`bedrock:<id>` runs): InvokeModel on exactly the
        configured models. A cross-region inference profile needs the profile in this region
        and its foundation model in every region the profile may route to."""
        resources: list[str] = []
        routed: list[str] = []
        for model_id in models:
            model = profiled_model(model_id)
            if model is None:
                resources.append(self._bedrock_arn("foundation-model", model_id))
                continue
            resources.append(self._bedrock_arn("inference-profile", model_id, account=True))
            resources.append(f"arn:{Stack.of(self).partition}:bedrock:*::foundation-model/{model}")
            routed.append(model)
        lambdas["step"].add_to_role_policy(
            iam.PolicyStatement(actions=list(BEDROCK_ACTIONS), resources=resources)
        )
        for model_id in routed:
            acknowledge(
                lambdas.roles["step"],
                f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:bedrock:*::foundation-model/"
                f"{model_id}]",
                "A cross-region inference profile routes each request to its foundation model "
                "in any region of its geography, chosen by Bedrock at request time; the "
                "statement names the one model and allows InvokeModel only.",
            )

    def _bedrock_arn(self, kind: str, model_id: str, *, account: bool = False) -> str:
        return Stack.of(self).format_arn(
            service="bedrock",
            account=None if account else "",
            resource=kind,
            resource_name=model_id,
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )

    def _put_status_events(self, lambdas: Functions, storage: Storage, bus: str) -> None:
        """The status-events function reads the checkpoints table's stream, only the heads'
        writes (a filter: the records' writes never invoke it), and puts each change of a run's
        status on `bus`. A failed batch is retried, halved, until it succeeds or its records
        leave the stream (24 h); its shard waits meanwhile, so a run's events stay in order."""
        function = lambdas["status_events"]
        head = {"S": lambda_.FilterRule.is_equal(contract.HEAD_SORT_KEY)}
        function.add_event_source(
            sources.DynamoEventSource(
                storage.checkpoints,
                starting_position=lambda_.StartingPosition.TRIM_HORIZON,
                batch_size=100,
                max_batching_window=Duration.seconds(0),
                bisect_batch_on_error=True,
                parallelization_factor=1,
                filters=[lambda_.FilterCriteria.filter({"dynamodb": {"Keys": {"sk": head}}})],
            )
        )
        function.add_environment(contract.EVENT_BUS_NAME, bus)
        stack = Stack.of(self)
        bus_arn = (
            bus
            if bus.startswith("arn:")
            else stack.format_arn(service="events", resource="event-bus", resource_name=bus)
        )
        iam.Grant.add_to_principal(
            grantee=function, actions=["events:PutEvents"], resource_arns=[bus_arn]
        )

    def _grant_blobs(self, lambdas: Functions, storage: Storage) -> None:
        """The step stores and reads large tool outputs: objects under the blob prefix only,
        get and put only (blobs are never listed, overwritten with other bytes or deleted).
        The functions of `READS_BLOBS` only get them."""
        objects = storage.blobs.arn_for_objects(f"{contract.BLOB_PREFIX}*")
        grants = {"step": ["s3:GetObject", "s3:PutObject"]}
        grants |= {name: ["s3:GetObject"] for name in READS_BLOBS}
        grants |= {name: ["s3:GetObject", "s3:PutObject"] for name in STORES_BLOBS}
        bucket = Stack.of(self).get_logical_id(cast(CfnElement, storage.blobs.node.default_child))
        for name, actions in grants.items():
            lambdas[name].add_to_role_policy(
                iam.PolicyStatement(actions=actions, resources=[objects])
            )
            acknowledge(
                lambdas.roles[name],
                f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/{contract.BLOB_PREFIX}*]",
                "Blob keys are content hashes (blobs/<sha256>), unknown at deploy time; the "
                f"statement allows only {' and '.join(a.split(':')[1] for a in actions)} "
                "under that prefix.",
            )


class RatchetStack(Stack):
    """A stack holding one `RatchetAgents` and nothing else: the repository's own app
    (`cdk/app.py`), and a project that wants no more.

    `project`, `asl_path` and the settings (`rollover_after=...`) go to the construct, every
    other keyword to `Stack` (`description`, `env`, `stack_name`, ...)."""

    agents: RatchetAgents

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        project: str | Path | None = None,
        asl_path: Path | None = None,
        **kwargs: Any,
    ) -> None:
        props = {name: kwargs.pop(name) for name in PROPS if name in kwargs}
        super().__init__(scope, construct_id, **kwargs)
        # "Default" is the one id CDK leaves out of logical ids: every resource keeps the id it
        # had when the stack built them itself, so a deployed stack replaces none of them.
        self.agents = RatchetAgents(self, "Default", project=project, asl_path=asl_path, **props)
