"""The AWS runtime: the engine wired to DynamoDB (checkpoints, ledger, agent data) and S3 blobs,
and the approval desk wired to the approvals kept beside each run's checkpoints, SES and Slack.

What `LocalRuntime` is to a worker process, this is to the Lambda functions (and to the CLI's
read commands on deployed tables). It is built once per cold start from `AwsSettings`, and the
clients and secrets the caller read (`ratchet.handlers._wiring`); it creates no client of its
own but the optional S3 and SES ones, and reads nothing from the environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from ratchet.adapters.dynamodb.approvals import AwsApprovals
from ratchet.adapters.dynamodb.daily_spend import DynamoDbDailySpend
from ratchet.adapters.dynamodb.data import DynamoDbRunData
from ratchet.adapters.dynamodb.ledger import DynamoDbLedger
from ratchet.adapters.dynamodb.mailbox import DynamoMailbox
from ratchet.adapters.dynamodb.rate import DynamoDbRateLimit
from ratchet.adapters.dynamodb.slots import DynamoDbSlots
from ratchet.adapters.dynamodb.store import DynamoDbCheckpointStore
from ratchet.adapters.dynamodb.stream import EventBridgeEvents, HeadChange, head_change
from ratchet.adapters.dynamodb.tables import TablesSeen, describe_tables
from ratchet.adapters.dynamodb.waits import AwsWaitTokens
from ratchet.adapters.payload_keys import payload_codec
from ratchet.adapters.s3_blobs import NoBlobStore, S3BlobStore
from ratchet.adapters.secrets import AwsSecrets
from ratchet.adapters.ses import SesNotifier
from ratchet.adapters.slack import SlackNotifier
from ratchet.adapters.stepfunctions import (
    ExecutionInput,
    StepFunctionsNudge,
    StepFunctionsResumer,
    execution_name,
    first_generation,
    generation_of,
    latest_execution,
    start_execution,
)
from ratchet.agents import AgentRegistry, declared_events
from ratchet.approvals.desk import ApprovalDesk
from ratchet.approvals.links import LinkSigner
from ratchet.children import ChildRunDesk
from ratchet.engine import Binding, Engine, Outcome
from ratchet.errors import (
    InvalidInput,
    NotResumable,
    StaleVersion,
    StepAttemptFailed,
    StoreBusy,
)
from ratchet.faults import NO_FAULTS, FaultPlan
from ratchet.feed import feed_event
from ratchet.limits import ConcurrencyLimits, resolve_overrides
from ratchet.model_names import BEDROCK_PREFIX
from ratchet.ports import BlobStore, Notifier
from ratchet.pushes import DETAIL_TYPE, SOURCE, StatusChange
from ratchet.runs import AgentNotRunnable, ModelNotGranted, RunRequest, new_run
from ratchet.runtime.aws_settings import AwsSettings
from ratchet.runtime.models import Bindings
from ratchet.sealing import PayloadCodec
from ratchet.state import NotifyTargets, Retried, RunOptions, RunState, utcnow
from ratchet.tools import Agent, RunContext
from ratchet.waiting.desk import EventDesk, Nudge
from ratchet.waiting.wakes import WakeSweep
from ratchet.waits import Verdict

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_stepfunctions import SFNClient

    from ratchet.adapters.sqlite.reencrypt import Reencryption
    from ratchet.runtime.hooks import Hooks

SCRATCH = Path("/tmp/ratchet-scratch")
"""Lambda's only writable disk, and the container's alone: never a place for agent data."""
RETRY_PAUSE_SECONDS = 0.05
MAX_RETRY_PAUSE_SECONDS = 2.0
"""In-process work (`AwsRuntime.work`) waits this long after a failed attempt, doubling."""
MAX_BINDINGS = 64
MAX_NAME_PROBES = 100
"""Retry slots tried past the counted one when a name is taken (see `AwsRuntime.launch`)."""
"""Runs whose agent stays bound in a warm container; one container serves many runs in turn."""


class AwsRuntime:
    def __init__(
        self,
        settings: AwsSettings,
        dynamodb: DynamoDBClient,
        *,
        s3: Any = None,
        anthropic_api_key: SecretStr | None = None,
        stepfunctions: Callable[[], SFNClient] | None = None,
        hook_key: Callable[[], SecretStr] | None = None,
        codec: PayloadCodec | None = None,
        kms: Callable[[], Any] | None = None,
    ) -> None:
        """`s3` is a boto3 S3 client for the blob bucket; if the settings name a bucket and
        none is given, a default one is made here. Without a bucket, a tool output that needs
        a blob fails its step with a clear error. `stepfunctions` makes the client that
        answers a run parked by the state machine (`decide`), when one is needed; `hook_key`
        reads the key webhooks derive from, when a hook is first opened (`hooks`); `codec`
        seals what runs' records and blobs say of the world (`RATCHET_PAYLOAD_KEY`); without
        one, the codec the settings name (`payload_key`, which the stack sets on every
        function when the deployment seals payloads), a KMS one with the client `kms`
        makes."""
        if codec is None:
            codec = payload_codec(settings.payload_key, beside=None, kms=kms)
        self.settings = settings
        self.dynamodb = dynamodb
        self._stepfunctions = stepfunctions
        self._hook_key = hook_key
        self._codec = codec
        self._s3 = s3
        self.anthropic_configured = anthropic_api_key is not None
        self.store = DynamoDbCheckpointStore(
            dynamodb,
            table=settings.checkpoints_table,
            ledger_table=settings.idempotency_table,
            retention_days=settings.checkpoint_retention_days,
            codec=codec,
        )
        self.ledger = DynamoDbLedger(
            dynamodb,
            table=settings.idempotency_table,
            retention_days=settings.checkpoint_retention_days,
            codec=codec,
        )
        self.blobs: BlobStore = NoBlobStore()
        if settings.blob_bucket:
            if s3 is None:
                import boto3

                s3 = boto3.client("s3")
            self.blobs = S3BlobStore(s3, settings.blob_bucket, codec)
        self._bindings = Bindings(
            self.context, anthropic_api_key=anthropic_api_key, limit=MAX_BINDINGS
        )
        # Only the step function has overrides. At its cold start each must name an agent as
        # the API starts it (a name the deployment registers), else every step fails saying
        # which, rather than run under a bound that holds nothing.
        overrides = settings.max_concurrent
        self._limits = ConcurrencyLimits(
            AgentRegistry.local(), resolve_overrides(overrides, self._agents()) if overrides else {}
        )
        self._secrets = AwsSecrets(
            settings.secrets, secretsmanager=_client("secretsmanager"), ssm=_client("ssm")
        )

    def context(self, run_id: str, options: RunOptions) -> RunContext:
        """The agent's data lives in the app table (`data`, and `services` for an agent with
        its own layout there), never on the function's disk: the workdir is scratch space in
        /tmp, gone with the container."""
        return RunContext(
            run_id=run_id,
            options=options,
            workdir=SCRATCH / run_id,
            services={"dynamodb": self.dynamodb, "app_table": self.settings.app_table},
            data=DynamoDbRunData(self.dynamodb, self.settings.app_table, run_id, codec=self._codec),
            secrets=self._secrets,
        )

    def bind(self, state: RunState) -> Binding:
        """The run's agent, model and opened resources, built once per container and run."""
        return self._bindings(state)

    @property
    def daily_spend(self) -> DynamoDbDailySpend:
        """The agents' daily spend, one counter per agent and day for every step here."""
        return DynamoDbDailySpend(self.dynamodb, self.settings.checkpoints_table)

    def engine(self, *, worker_id: str, logger: Any, faults: FaultPlan = NO_FAULTS) -> Engine:
        engine = Engine(
            store=self.store,
            ledger=self.ledger,
            blobs=self.blobs,
            bind=self.bind,
            unbind=self._bindings.forget,
            worker_id=worker_id,
            logger=logger,
            faults=faults,
            slots=DynamoDbSlots(self.dynamodb, self.settings.checkpoints_table),
            limits=self._limits,
            rate=DynamoDbRateLimit(self.dynamodb, self.settings.checkpoints_table),
            requests_per_minute=self.settings.requests_per_minute,
            daily_spend=self.daily_spend,
        )
        engine.attach_children(self.child_runs(engine, worker_id=worker_id, logger=logger))
        return engine

    def child_runs(self, engine: Engine, *, worker_id: str, logger: Any) -> ChildRunDesk:
        """The runs a run's step starts (`start_runs`): checked as the API checks a start
        (the deployment's agents, by name; import paths too where no deployment says, on a
        laptop), created, and each started in an execution of the state machine named
        after its id; their ends settled with `engine`, the parked parent's token answered;
        cancelled with their parent through `cancel` (by whoever cancels it: the API)."""
        from ratchet.client import Client

        agents = self._agents()

        def check(request: RunRequest) -> RunState:
            return new_run(request, has_anthropic_key=self.anthropic_configured, agents=agents)

        def create(state: RunState) -> None:
            Client(self, agents=agents, worker_id=worker_id, logger=logger).create(state)
            if self.settings.state_machine_arn and self._stepfunctions is not None:
                self.start_execution(state.run_id, logger=logger)

        def cancel(run_id: str, by: str, reason: str) -> RunState:
            return self.cancel(run_id, by=by, reason=reason, worker_id=worker_id, logger=logger)

        return ChildRunDesk(
            store=self.store,
            engine=engine,
            new_run=check,
            create=create,
            cancel=cancel,
            nudge=self.nudge() if self._stepfunctions is not None else None,
            logger=logger,
            faults=engine.faults,
        )

    def _agents(self) -> AgentRegistry:
        """The agents a run may name: the deployment's, by name; import paths too where no
        deployment says (on a laptop)."""
        if self.settings.agents:
            return AgentRegistry.deployment(self.settings.agents, self.settings.models)
        return AgentRegistry.local()

    def before_prepare(self) -> None:
        """Nothing to take: DynamoDB has no store-wide lock."""

    def check_agent(self, agent: Agent) -> None:
        if agent.needs_local_disk:
            raise AgentNotRunnable(
                f"agent {agent.name!r} keeps its data on a local disk (needs_local_disk), "
                "which a Lambda function does not keep between steps: it runs locally only. "
                "Keep its data in RunContext.data to run it on AWS"
            )
        stdio = [server.name for server in agent.mcp if server.stdio]
        if stdio:
            raise AgentNotRunnable(
                f"agent {agent.name!r} takes tools from a stdio MCP server ({stdio[0]}), "
                "which a Lambda function cannot start: on AWS give it the server's URL "
                "(McpServer(url=...))"
            )

    def check_model(self, model: str) -> None:
        granted = self.settings.bedrock_models
        if granted is None or not model.startswith(BEDROCK_PREFIX):
            return
        if model.removeprefix(BEDROCK_PREFIX) not in granted:
            raise ModelNotGranted(granted)

    def approvals(self) -> AwsApprovals:
        """The approval book, in the checkpoints table: it keeps each parked execution's task
        token until the decision."""
        return AwsApprovals(
            self.dynamodb,
            self.settings.checkpoints_table,
            retention_days=self.settings.checkpoint_retention_days,
            codec=self._codec,
        )

    def mailbox(self) -> DynamoMailbox:
        """The events sent to runs, in the checkpoints table beside each run's checkpoints:
        the commit that settles a wait with one consumes it (`Commit.consumes`)."""
        return DynamoMailbox(
            self.dynamodb,
            self.settings.checkpoints_table,
            retention_days=self.settings.checkpoint_retention_days,
            codec=self._codec,
        )

    def hooks(self, agents: AgentRegistry) -> Hooks:
        """The deployment's webhooks (`POST /runs/{id}/hooks/{name}`), reached on the stack's
        API (`RATCHET_PUBLIC_URL`); `InvalidInput` if this runtime was given no hook key (a
        `dynamodb://` store opened by the CLI or `ratchet.connect`: the stack gives the key to
        the api function only)."""
        from ratchet.runtime.hooks import aws_hooks

        if self._hook_key is None:
            raise InvalidInput(
                "webhooks need the stack's hook key (RATCHET_HOOK_KEY_SECRET_ARN): open a "
                "run's hook through the stack's runs API, POST /runs/{id}/hooks/{name}"
            )
        return aws_hooks(self, key=self._hook_key(), agents=agents)

    def event_desk(self, engine: Engine, nudge: Nudge | None = None) -> EventDesk:
        """Events sent to runs (the runs API, webhooks, `ratchet send` on deployed tables),
        settled with `engine`; `nudge` wakes the execution parked on a wait the desk settled.
        By default, with a Step Functions client, this runtime's own (`nudge()`), so every
        sender wakes the execution, whoever built the desk; it finds nothing to wake for a
        run worked in process, which reads its head again by itself. Without a client, none."""
        if nudge is None and self._stepfunctions is not None:
            nudge = self.nudge()
        return EventDesk(
            store=self.store,
            mailbox=self.mailbox(),
            blobs=self.blobs,
            engine=engine,
            events_of=declared_events,
            nudge=nudge,
            faults=engine.faults,
        )

    def wake_sweep(self, engine: Engine, *, logger: Any) -> WakeSweep:
        """The sweep of the wakes owed (`ratchet.waiting.wakes`), settling with `engine`
        where a waker died before its settling write."""
        from ratchet.adapters.dynamodb.approvals import APPROVAL_PREFIX
        from ratchet.adapters.dynamodb.waits import wait_step
        from ratchet.adapters.dynamodb.wakes import AwsOwedWakes

        book = self.approvals()
        children = self.child_runs(engine, worker_id=engine.worker_id, logger=logger)
        return WakeSweep(
            owed=AwsOwedWakes(self.dynamodb, self.settings.checkpoints_table),
            store=self.store,
            nudge=self.nudge(),
            deliver=self.event_desk(engine).deliver,
            settle_children=children.settle,
            relaunch=self.relaunch,
            approvals=book,
            resumer=self.resumer(book),
            wait_step=wait_step,
            approval_id=lambda sk: (
                sk.removeprefix(APPROVAL_PREFIX) if sk.startswith(APPROVAL_PREFIX) else None
            ),
            logger=logger,
        )

    def resumer(self, book: AwsApprovals) -> StepFunctionsResumer:
        """What answers a parked execution with the token `book` keeps for it."""
        return StepFunctionsResumer(book, self._stepfunctions() if self._stepfunctions else None)

    def wait_tokens(self) -> AwsWaitTokens:
        """The tokens of executions parked on an event wait, in the checkpoints table."""
        return AwsWaitTokens(
            self.dynamodb,
            self.settings.checkpoints_table,
            retention_days=self.settings.checkpoint_retention_days,
        )

    def nudge(self) -> StepFunctionsNudge:
        """What wakes a parked execution once the event desk settled its run's wait: the
        token of an event wait answered, a sleeping run's execution restarted."""
        return StepFunctionsNudge(
            self.wait_tokens(),
            self._stepfunctions() if self._stepfunctions else None,
            relaunch=self.relaunch,
        )

    def relaunch(self, run_id: str) -> str | None:
        """Restart the execution of a run woken from a sleep: start its successor, which takes
        the run's next step at once, then stop the sleeper. A `Wait` state cannot be cut
        short, and the sleeper would otherwise wake only at its time.

        The successor's generation follows the highest running one, as a rollover's would
        (the sleeper has not rolled over, so that name is free; if another waker took it, the
        successor runs already). Started first, so a start that fails leaves the sleeper to
        find the run woken when its park ends, not a run that nothing works. A sleeper that
        has just woken by itself and is in its next step meanwhile loses the run to the
        successor by the store's conditional writes. Returns the successor's name, or None
        when no execution works the run (it is worked in process, or by nothing: a woken run
        is runnable for whoever works it next)."""
        machine = self.settings.state_machine_arn
        if not machine or self._stepfunctions is None:
            return None
        sfn = self._stepfunctions()
        running = self._running_executions(sfn, machine, run_id)
        if not running:
            return None
        generation = max(g for g, _ in running) + 1
        execution = ExecutionInput(
            run_id=run_id,
            generation=generation,
            iteration=0,
            approval_timeout_seconds=self.settings.approval_timeout_seconds,
        )
        start_execution(sfn, machine, execution)
        for _, arn in running:
            # Closed meanwhile (it found the run woken and rolled over or ended): nothing to stop.
            with suppress(sfn.exceptions.ExecutionDoesNotExist):
                sfn.stop_execution(
                    executionArn=arn, error="Woken", cause="woken early: a successor goes on"
                )
        return execution_name(run_id, generation)

    def resume(self, run_id: str, *, logger: Any) -> tuple[str, bool]:
        """Start the next execution of a run that no execution works any more (its last one
        ended on a bundle that could not load its agent: docs/deploy.md), and return its name
        and whether this call started it (False: another resume took the name first).

        The next is the run's latest execution's generation + 1, as its rollover would have
        named it; a run with none gets generation 0, a start's. `NotResumable` naming the
        latest if it is running: two executions of one run would only race for its steps."""
        machine = self.settings.state_machine_arn
        if not machine or self._stepfunctions is None:
            raise InvalidInput(
                "resume starts the run's next execution on the stack's state machine, which "
                "this store URL does not name: add &machine= with the stack's StateMachineArn, "
                "as its StoreUrl output does"
            )
        sfn = self._stepfunctions()
        latest = latest_execution(sfn, machine, run_id)
        timeout = self.settings.approval_timeout_seconds
        generation = 0
        if latest is not None:
            found, described = latest
            if described["status"] == "RUNNING":
                raise NotResumable(
                    run_id,
                    f"is worked by its running execution {execution_name(run_id, found)}: "
                    "there is nothing to resume",
                )
            # The stack's own wait (its input carries ratchet:approvalTimeoutSeconds), not
            # this runtime's default.
            timeout = ExecutionInput.model_validate_json(
                described["input"]
            ).approval_timeout_seconds
            generation = found + 1
        execution = ExecutionInput(
            run_id=run_id, generation=generation, iteration=0, approval_timeout_seconds=timeout
        )
        started = start_execution(sfn, machine, execution)
        name = execution_name(run_id, generation)
        logger.info(
            "execution started" if started else "execution exists",
            extra={"run_id": run_id, "execution": name},
        )
        return name, started

    @staticmethod
    def _running_executions(sfn: SFNClient, machine: str, run_id: str) -> list[tuple[int, str]]:
        """The run's running executions: (generation, ARN)."""
        found: list[tuple[int, str]] = []
        pages = sfn.get_paginator("list_executions").paginate(
            stateMachineArn=machine, statusFilter="RUNNING"
        )
        for page in pages:
            for execution in page["executions"]:
                generation = generation_of(execution["name"], run_id)
                if generation is not None:
                    found.append((generation, execution["executionArn"]))
        return found

    def approval_desk(
        self,
        *,
        link_key: SecretStr,
        ses: Any = None,
        slack_bot_token: SecretStr | None = None,
        faults: FaultPlan = NO_FAULTS,
    ) -> ApprovalDesk:
        """The desk that opens approval requests and takes decisions, its links signed with
        `link_key`, with the notifiers the deployment configured (SES, Slack; none is an error
        only for who expected a message). `ses` is a boto3 SES v2 client, made here if the
        settings name a sender and none is given; Slack needs its `slack_bot_token`."""
        config = self.settings
        notifiers: list[Notifier] = []
        if config.email_sender:
            if ses is None:
                import boto3

                ses = boto3.client("sesv2")
            notifiers.append(SesNotifier(ses, sender=config.email_sender))
        if slack_bot_token is not None:
            notifiers.append(SlackNotifier(slack_bot_token, api_url=config.slack_api_url))
        book = self.approvals()
        return ApprovalDesk(
            book=book,
            resumer=self.resumer(book),
            store=self.store,
            signer=LinkSigner(link_key.get_secret_value().encode("utf-8")),
            public_url=config.required_for_approvals("public_url"),
            notifiers=notifiers,
            default_targets=NotifyTargets(
                email=config.notify_emails, slack_channel=config.notify_slack_channel
            ),
            faults=faults,
        )

    def start_execution(self, run_id: str, *, logger: Any) -> str:
        """Start the execution that works a new run (generation 0) and return its name. One
        that runs or ran already keeps it: a repeated start is a no-op."""
        name = execution_name(run_id, 0)
        if not self._start_execution(run_id, 0):
            logger.info("execution exists", extra={"run_id": run_id, "execution": name})
        return name

    def launch(self, run_id: str, *, logger: Any) -> str:
        """Start the execution of a run just forked (generation 0, as a start) or retried,
        and return its name.

        A retried run's executions take the generations set aside for its retry
        (`first_generation`), the retry counted from its `Retried` records, so no name repeats
        one of its earlier executions. Those records expire with the checkpoints while names
        stay taken for 90 days: a name found taken by a closed execution moves on to the next
        slot."""
        retries = sum(isinstance(c.event, Retried) for c in self.store.list_checkpoints(run_id))
        if retries == 0:
            return self.start_execution(run_id, logger=logger)
        return self._start_in_a_free_slot(run_id, retries, logger=logger)

    def _start_in_a_free_slot(self, run_id: str, first: int, *, logger: Any) -> str:
        """Start an execution of the run in the first slot of generations (`first_generation`)
        from `first` whose name is free, and return its name."""
        for retry in range(first, first + MAX_NAME_PROBES):
            generation = first_generation(retry)
            if self._start_execution(run_id, generation):
                name = execution_name(run_id, generation)
                logger.info("execution started", extra={"run_id": run_id, "execution": name})
                return name
        raise RuntimeError(
            f"no free execution name for run {run_id!r} after {MAX_NAME_PROBES} tries"
        )

    def _start_execution(self, run_id: str, generation: int) -> bool:
        machine = self.settings.state_machine_arn
        if not machine:
            raise RuntimeError("RATCHET_STATE_MACHINE_ARN is not set: the API cannot start runs")
        if self._stepfunctions is None:
            raise RuntimeError("this runtime was built without a Step Functions client")
        execution = ExecutionInput(
            run_id=run_id,
            generation=generation,
            iteration=0,
            approval_timeout_seconds=self.settings.approval_timeout_seconds,
        )
        return start_execution(self._stepfunctions(), machine, execution)

    def work(
        self, run_id: str, *, worker_id: str, logger: Any, faults: FaultPlan = NO_FAULTS
    ) -> None:
        """Work the run in this process, where no state machine does (a script, a test):
        step after step until it is done, waiting or failed. A failed attempt is counted by
        the engine and retried after a pause; the third ends the run, and a step queued for
        its agent's slot is tried again after one. A stale write means another process
        advanced the run: it is read again."""
        engine = self.engine(worker_id=worker_id, logger=logger, faults=faults)
        pause = RETRY_PAUSE_SECONDS
        while True:
            try:
                taken = engine.advance(run_id)
            except StaleVersion:
                continue
            except StepAttemptFailed as failed:
                # The engine recorded when the next attempt may start (its backoff).
                if failed.not_before is not None:
                    time.sleep(max(0.0, (failed.not_before - utcnow()).total_seconds()))
                else:
                    time.sleep(pause)
                    pause = min(pause * 2, MAX_RETRY_PAUSE_SECONDS)
                continue
            except StoreBusy:
                time.sleep(pause)
                pause = min(pause * 2, MAX_RETRY_PAUSE_SECONDS)
                continue
            if taken.outcome is Outcome.QUEUED:  # no slot, or no model call left this minute
                time.sleep(taken.retry_after or pause)
                pause = min(pause * 2, MAX_RETRY_PAUSE_SECONDS)
                continue
            if taken.outcome is not Outcome.CONTINUE:
                if taken.outcome is Outcome.WAITING and taken.bytes_written:
                    self._ask_for(run_id, logger=logger)
                return

    def _ask_for(self, run_id: str, *, logger: Any) -> None:
        """A run this process has just parked for a person is handed to the deployment's
        state machine, whose approval task opens the request and notifies, as for a run worked
        there: links are signed with the stack's key, which no laptop holds, and sent through
        its SES and Slack. Its execution then works the run on from the decision. Another wait
        needs nobody; a runtime that knows no state machine can ask nobody, and says so."""
        head = self.store.load_head(run_id)
        if head is None or head.waiting is None or head.waiting.kind != "person":
            return
        if not self.settings.state_machine_arn or self._stepfunctions is None:
            logger.warning(
                "the run waits for a person, but nobody is asked: this store URL names no state "
                "machine (add &machine= with the stack's StateMachineArn, as its StoreUrl "
                "output does)",
                extra={"run_id": run_id},
            )
            return
        # Its own slot of generations, as a retry's: the names of the run's earlier executions
        # (the API's start, a retry) and of their successors stay theirs. The execution finds
        # the run parked with no request open, so it parks and asks (`_stop_if_parked_elsewhere`).
        name = self._start_in_a_free_slot(run_id, 0, logger=logger)
        logger.info(
            "the run waits for a person: its execution asks them",
            extra={"run_id": run_id, "execution": name},
        )

    def decide(
        self, run_id: str, verdict: Verdict, *, channel: str, worker_id: str, logger: Any
    ) -> None:
        """A run parked by the state machine has an open request holding its task token: the
        decision answers that execution, as a link would. A run worked in process has none:
        the decision is recorded on the run directly."""
        from ratchet.approvals.desk import Decider

        engine = self.engine(worker_id=worker_id, logger=logger)
        book = self.approvals()
        Decider(book, self.resumer(book), self.store, faults=engine.faults).decide_or_record(
            run_id,
            verdict,
            channel=channel,
            engine=engine,
        )

    def cancel(self, run_id: str, *, by: str, reason: str, worker_id: str, logger: Any) -> RunState:
        """Cancel the run (and, through its engine, the child runs it started that have not
        ended, each through this method), close its pending approval requests (dropping the
        parked task's token, so no link can answer it) and drop an event wait's token, then
        stop its running execution, if this runtime knows the state machine and has a Step
        Functions client. If the stop fails, the run is cancelled all the same: the
        execution's next step finds it so and ends."""
        from ratchet.waits import ApprovalStatus

        head = self.engine(worker_id=worker_id, logger=logger).cancel(run_id, by=by, reason=reason)
        self.approvals().close(run_id, head.step, ApprovalStatus.CLOSED, at=utcnow())
        self.wait_tokens().drop(run_id, head.step)
        machine = self.settings.state_machine_arn
        if machine and self._stepfunctions is not None:
            self._stop_executions(self._stepfunctions(), machine, run_id, head.summary or "")
        return head

    @staticmethod
    def _stop_executions(sfn: SFNClient, machine: str, run_id: str, cause: str) -> None:
        from ratchet.adapters.stepfunctions import is_execution_of

        pages = sfn.get_paginator("list_executions").paginate(
            stateMachineArn=machine, statusFilter="RUNNING"
        )
        for page in pages:
            for execution in page["executions"]:
                if not is_execution_of(execution["name"], run_id):
                    continue
                # Closed meanwhile (it found the run cancelled and ended): nothing to stop.
                with suppress(sfn.exceptions.ExecutionDoesNotExist):
                    sfn.stop_execution(
                        executionArn=execution["executionArn"], error="Cancelled", cause=cause
                    )

    def tables_seen(self) -> TablesSeen:
        """Whose checkpoints table this is (account, region, stack), asked of DynamoDB;
        `StoreUnavailable` if it is missing or the caller may not read it."""
        return describe_tables(self.dynamodb, self.settings.checkpoints_table)

    def status_events(self, events: Any) -> Callable[[Sequence[Mapping[str, Any]]], int]:
        """What the status-events function does with a batch of the checkpoints table's
        stream (`ratchet.adapters.dynamodb.stream`): put an event for each change of a run's
        status among its records, in order, on the deployment's bus; the number put.
        `EventsNotPut` (or a store error) leaves the batch to be read again."""
        bus = EventBridgeEvents(
            events, bus=self.settings.event_bus_name, source=SOURCE, detail_type=DETAIL_TYPE
        )

        def put(records: Sequence[Mapping[str, Any]]) -> int:
            changes = [self._status_change(c) for r in records if (c := head_change(r))]
            bus.put([change.body().decode() for change in changes])
            return len(changes)

        return put

    def _status_change(self, change: HeadChange) -> StatusChange:
        # The commit that changed the head wrote its record in the same transaction: read it
        # for what the change was (what the run waits for, its summary or error).
        records = self.store.list_checkpoints(change.run_id, after=change.version - 1)
        record = next((r for r in records if r.version == change.version), None)
        if record is not None:
            return StatusChange.of(change.agent, change.previous, feed_event(record))
        # Expired already (a stream read a day late): what the head says.
        return StatusChange(
            id=f"{change.run_id}:{change.version}",
            run_id=change.run_id,
            agent=change.agent,
            status=change.status,
            previous=change.previous,
            version=change.version,
            step=change.step,
            at=change.updated_at,
            event=change.status.value,
        )

    def reencrypt(self, *, dry_run: bool, bucket: str | None = None) -> Reencryption:
        """`ratchet migrate --reencrypt`: every sealed attribute of the stack's items and every
        blob of its bucket (`bucket`, else the settings') under the payload key's newest key
        (`ratchet.adapters.dynamodb.reencrypt`)."""
        from ratchet.adapters.dynamodb.reencrypt import StackStorage, reencrypt

        if self._codec is None:
            raise InvalidInput(
                "ratchet migrate --reencrypt seals under the payload key: set "
                "RATCHET_PAYLOAD_KEY (kms:<the new key>, or file:PATH with the new key first)"
            )
        bucket = bucket or self.settings.blob_bucket
        if not bucket:
            # Without it the blobs would stay under the old key, and removing the key would
            # lose them: refused rather than half done.
            raise InvalidInput(
                "ratchet migrate --reencrypt on a dynamodb:// store rewrites the blobs too: "
                "name the stack's bucket (its BlobBucket output) with --bucket or "
                "RATCHET_BLOB_BUCKET"
            )
        s3 = self._s3
        if s3 is None:
            import boto3

            s3 = boto3.client("s3", region_name=self.dynamodb.meta.region_name)
        tables = {
            "checkpoints": self.settings.checkpoints_table,
            "idempotency": self.settings.idempotency_table,
            "app": self.settings.app_table,
        }
        storage = StackStorage(self.dynamodb, tables, s3, bucket)
        return reencrypt(storage, self._codec, dry_run=dry_run)

    def close(self) -> None:
        """Nothing to release (the clients are the caller's); here so the CLI can treat both
        runtimes alike."""


def _client(service: str) -> Callable[[], Any]:
    """A boto3 client of `service`, made once, when a secret is first read."""
    made: list[Any] = []

    def client() -> Any:
        if not made:
            import boto3

            made.append(boto3.client(service))  # type: ignore[call-overload]
        return made[0]

    return client
