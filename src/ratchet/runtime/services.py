"""The runs API on the local runtime, for `ratchet serve`: the same routes as the deployed API
(`ratchet.handlers.api`), over the SQLite store. Starting a run creates it; the next free
worker works it (there is no execution to start). Deciding goes through the local approval
desk, so the run's links and pages show the decision too."""

from __future__ import annotations

import getpass
from functools import cache
from typing import Any

from ratchet.agents import AgentRegistry
from ratchet.client import Client
from ratchet.runs import RunRequest
from ratchet.runtime.local import LocalRuntime
from ratchet.web.runs import RunsServices, RunStarted


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
    client = Client(
        runtime, agents=agents or AgentRegistry(), worker_id=worker_id, logger=logger, channel="api"
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
    )


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in this environment (a bare container)
        return "local"
