"""The services each app serves with, on either runtime: the client an HTTP API acts through,
the approval pages' services, and the runs API's (`ratchet serve` locally, the `api` function
on AWS).

The runs API has the same routes on both. On AWS starting a run creates it and starts the
execution that works it (`AwsRuntime.start_execution`); locally it creates it, and the next
free worker works it (there is no execution to start). Deciding goes through the runtime's
approval desk, so the run's links and pages show the decision too.
"""

from __future__ import annotations

import getpass
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from ratchet.adapters.slack import SlackResponder
from ratchet.agents import AgentRegistry
from ratchet.approvals.desk import ApprovalDesk
from ratchet.approvals.pages import RESUMES
from ratchet.client import Client, Runtime
from ratchet.errors import InvalidInput
from ratchet.runs import RunRequest
from ratchet.web.approvals import ApprovalServices
from ratchet.web.dashboard import Deployed
from ratchet.web.routes import RunsServices, RunStarted

if TYPE_CHECKING:
    from collections.abc import Callable

    from ratchet.adapters.dynamodb.tables import TablesSeen
    from ratchet.runtime.aws import AwsRuntime
    from ratchet.runtime.local import LocalRuntime


def api_client(runtime: Runtime, *, agents: AgentRegistry, worker_id: str, logger: Any) -> Client:
    """The client an HTTP API acts through: it starts only the agents `agents` names (a request
    never imports a module it names), and says the API made the decisions it records.
    `worker_id` names whoever writes through it."""
    return Client(runtime, agents=agents, worker_id=worker_id, logger=logger, channel="api")


def approval_services(
    desk: ApprovalDesk,
    *,
    slack_signing_secret: SecretStr | None,
    logger: Any,
    resumes: str = RESUMES,
) -> ApprovalServices:
    """What the approval pages use: the desk, and Slack's button presses, taken only with the
    secret that signs them. `resumes`: what the page says happens after a decision."""
    return ApprovalServices(
        desk=desk,
        slack_signing_secret=slack_signing_secret,
        slack_responder=SlackResponder() if slack_signing_secret else None,
        logger=logger,
        resumes=resumes,
    )


def local_runs_services(
    runtime: LocalRuntime,
    worker_id: str,
    logger: Any,
    *,
    agents: AgentRegistry | None = None,
    operator: str | None = None,
) -> RunsServices:
    """`agents`: which agents the API may start, by name (default: the built-in scenarios
    only; an HTTP request never imports a module it names). `operator`: who decides through
    the API, which locally is unsigned (default: the user running `ratchet serve`)."""
    client = api_client(
        runtime, agents=agents or AgentRegistry(), worker_id=worker_id, logger=logger
    )

    def start(request: RunRequest, *, request_id: str) -> RunStarted:
        started = client.submit(request)
        logger.info(
            "run created" if started.created else "run exists; start is a no-op",
            extra={"run_id": started.run.run_id, "request_id": request_id},
        )
        return RunStarted.of(started, execution_name=None)

    return RunsServices(
        client=client,
        desk=cache(lambda: runtime.approval_desk(worker_id=worker_id, logger=logger)),
        start=start,
        logger=logger,
        anonymous_caller=operator or _user(),
        # `ratchet serve` holds a long poll on the connection's thread before the app sees
        # it (`ratchet.web.feed.HistoryWaits`): the app's one thread never waits.
        holds_long_polls=False,
    )


def aws_runs_services(
    runtime: AwsRuntime,
    *,
    agents: AgentRegistry,
    desk: Callable[[], ApprovalDesk],
    logger: Any,
    metrics: Any,
) -> RunsServices:
    """The runs API's services on AWS: a start creates the run (through a client named after
    the request) and starts its execution; a retry or fork starts the run's next one. `desk`
    builds the approval desk when a decision first needs it; `metrics` are Powertools', which
    the handler flushes."""

    def start(request: RunRequest, *, request_id: str) -> RunStarted:
        client = api_client(runtime, agents=agents, worker_id=f"lambda:{request_id}", logger=logger)
        started = client.submit(request)
        name = runtime.start_execution(started.run.run_id, logger=logger)
        metrics.add_metric(
            name="RunsStarted" if started.created else "RepeatedStarts", unit="Count", value=1
        )
        logger.info(
            "run started" if started.created else "run exists; start is a no-op",
            extra={"run_id": started.run.run_id, "execution": name},
        )
        return RunStarted.of(started, execution_name=name)

    return RunsServices(
        client=api_client(runtime, agents=agents, worker_id="lambda:api", logger=logger),
        desk=desk,
        start=start,
        launch=lambda run_id: runtime.launch(run_id, logger=logger),
        logger=logger,
        metrics=metrics,
    )


def deployed_read_services(
    runtime: AwsRuntime, seen: TablesSeen, *, logger: Any, api_url: str | None
) -> tuple[RunsServices, Deployed]:
    """What `ratchet serve` reads a deployed stack's tables with, from a laptop: the runs
    API's services (its reads; every write is refused before a route sees it,
    `ratchet.web.read_only`, and these refuse too) and the dashboard's view of the stack."""
    client = api_client(runtime, agents=AgentRegistry(), worker_id="serve:read", logger=logger)
    where = api_url or "the stack's API"

    def no_desk() -> ApprovalDesk:
        raise InvalidInput(f"this server only reads: decide through {where}")

    def no_start(request: RunRequest, *, request_id: str) -> RunStarted:
        raise InvalidInput(f"this server only reads: start runs through {where}")

    services = RunsServices(client=client, desk=no_desk, start=no_start, logger=logger)
    deployed = Deployed(
        stack=seen.stack,
        account=seen.account,
        region=seen.region,
        table=seen.table,
        book=runtime.approvals(),
        api_url=api_url,
    )
    return services, deployed


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in this environment (a bare container)
        return "local"
