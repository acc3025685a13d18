"""What runs on this machine for a person to use: `serve` (the approval pages, the runs API and
the dashboard, as the deployed API serves them) and `demo` (the offline demo, which serves them
too)."""

from __future__ import annotations

import _thread
import re
import signal
import sys
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import typer

from ratchet.cli.context import (
    check_worker_settings,
    cli_logger,
    cli_worker_id,
    command,
    err,
    operator_name,
    out,
    require_local_store,
    say,
    settings,
)
from ratchet.cli.foreground import webhook_sender
from ratchet.cli.options import MAX_BATCHES, not_empty
from ratchet.errors import InvalidInput
from ratchet.store_urls import DYNAMODB_SCHEME

AGENT_FLAG = re.compile(r"^(?:(?P<name>[^=]+)=)?(?P<target>[^=]+)$")

GUARDED_ROUTES = ("/runs", "/schedules", "/dashboard")
"""What takes the bearer token off this machine: the runs API, the schedules and the dashboard
(whose pages carry the operator's own approval links). The approval pages, Slack's buttons
and the webhooks carry signatures of their own."""

NO_WORKER_RESUMES = (
    "No worker runs beside this server (ratchet serve --no-worker): run `ratchet worker` "
    "and the run resumes with your answer."
)


def serve(
    port: Annotated[
        int, typer.Option("--port", help="Port (0: any free one).", min=0, max=65535)
    ] = 8765,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            callback=not_empty,
            help="Interface to listen on. Any but 127.0.0.1, ::1 or localhost is reachable "
            "from elsewhere: the runs API and dashboard then take a bearer token.",
        ),
    ] = "127.0.0.1",
    work: Annotated[
        bool,
        typer.Option(
            "--worker/--no-worker",
            help="Work the runs in this process, as `ratchet worker` does (--no-worker: leave "
            "them to a `ratchet worker` of your own).",
        ),
    ] = True,
    agent: Annotated[
        list[str] | None,
        typer.Option(
            "--agent",
            metavar="[NAME=]MODULE:ATTR",
            callback=not_empty,
            help="An agent the runs API may start, by NAME (or by MODULE:ATTR itself); "
            "repeatable. The [tool.ratchet] agents of ./pyproject.toml are taken too.",
        ),
    ] = None,
) -> None:
    """Serve the approval pages, the runs API and webhooks (/hooks/) locally (as the deployed
    API does), and the runs dashboard at /dashboard; a worker in the same process works the
    runs. On a deployed stack's store (dynamodb://, its StoreUrl output): the dashboard and
    the runs API's reads, read-only, with your AWS credentials."""
    if settings().store.startswith(DYNAMODB_SCHEME):
        from ratchet.cli.serve_deployed import serve_deployed

        serve_deployed(host, port)
        return
    require_local_store("serve")
    # The web apps, waitress and the local runtime: loaded only to serve (see ratchet.cli.context).
    from ratchet.runtime import local_runtime
    from ratchet.web.serve import base_url, is_local, listen

    agents = _agents(agent or [])
    if work:
        check_worker_settings()  # its worker would refuse them later, on a thread of its own
    listening = listen(host, port)
    try:
        port = listening.getsockname()[1]
        # The links this server makes (and its worker's) point where it listens, unless
        # RATCHET_PUBLIC_URL says where people reach it.
        chosen = settings().serving_at(base_url(host, port))
        # The server runs the app on a thread of its own, one request at a time; the store is
        # a SQLite file or a Postgres database (whose pool serves any thread anyway).
        runtime = local_runtime(chosen, create=True, any_thread=True)
    except BaseException:
        listening.close()
        raise
    try:
        token = None if is_local(host) else runtime.serve_token()
        # The feeds and long polls read on their connections' threads, each thread with a
        # store connection of its own (`LocalRuntime.readers`).
        with runtime.readers() as readers, runtime.serving(chosen.public_url):
            _serve(
                runtime,
                listening,
                host=host,
                token=token,
                work=work,
                agents=agents,
                readers=readers,
            )
    finally:
        listening.close()  # served and closed by now, unless the token was refused
        runtime.close()


def _serve(
    runtime: Any,
    listening: Any,
    *,
    host: str,
    token: str | None,
    work: bool,
    agents: Any,
    readers: Any,
) -> None:
    from ratchet.approvals.pages import RESUMES
    from ratchet.runtime.hooks import local_hooks
    from ratchet.runtime.services import approval_services, local_runs_services
    from ratchet.runtime.serving import ServeWorker
    from ratchet.web.approvals import build_app
    from ratchet.web.dashboard import MAX_DELIVERY_ROWS
    from ratchet.web.dashboard import local_app as dashboard_app
    from ratchet.web.feed import FeedStreams, HistoryWaits
    from ratchet.web.hooks import BODY_LIMIT, Throttle
    from ratchet.web.hooks import build_app as build_hooks_app
    from ratchet.web.runs import build_app as build_runs_app
    from ratchet.web.serve import BearerToken, OffThread, listening_url, serve_on

    logger = cli_logger()
    services = approval_services(
        runtime.approval_desk(worker_id=f"serve:{cli_worker_id()}", logger=logger),
        slack_signing_secret=runtime.settings.slack_signing_secret,
        logger=logger,
        resumes=RESUMES if work else NO_WORKER_RESUMES,
    )
    approvals = build_app(lambda: services)
    runs = local_runs_services(
        runtime, worker_id=f"serve:{cli_worker_id()}", logger=logger, agents=agents
    )
    runs_app = build_runs_app(lambda: runs)
    # The webhooks' deliveries, which a run's page lists: asked for when a run's page is first
    # shown, not at start, which needs none of them.
    book = cache(lambda: runtime.deliveries)
    routes = [
        ("/approvals/", approvals),
        ("/slack/", approvals),
        ("/runs", runs_app),
        ("/schedules", runs_app),
        (
            "/dashboard",
            dashboard_app(
                runs.client,
                services.desk,
                operator=operator_name(),
                mailbox=runtime.mailbox,
                deliveries=lambda run_id: book().listed(run_id, limit=MAX_DELIVERY_ROWS),
            ),
        ),
    ]
    # Webhooks: serve has no throttle of its own, so the hook route brings one (for the
    # refused deliveries of each address; a signed delivery is never throttled).
    hook_desk = runtime.event_desk(
        runtime.engine(worker_id=f"serve:{cli_worker_id()}", logger=logger)
    )
    hooks = local_hooks(runtime).services(hook_desk, logger=logger, throttle=Throttle())
    routes.append(("/hooks/", build_hooks_app(lambda: hooks)))
    bearer = BearerToken(token, GUARDED_ROUTES) if token is not None else None
    off_thread: list[OffThread] = [FeedStreams(readers.store), HistoryWaits(readers.store)]
    httpd = serve_on(
        listening, routes, body_limits=[BODY_LIMIT], bearer=bearer, off_thread=off_thread
    )
    base = listening_url(host, httpd.server_port)
    out.print(f"Serving approvals on {base}")
    out.print(f"The runs dashboard: {base}/dashboard")
    where = "RATCHET_PUBLIC_URL" if runtime.settings.public_url_set else "set RATCHET_PUBLIC_URL"
    out.print(f"Approval links point at {runtime.settings.public_url} ({where} to change it)")
    say(f"The runs API starts these agents: {', '.join(agents.names)}")
    if token is not None:
        err.print(
            f"Warning: {host} is reachable from the network; the runs API, /schedules and "
            "/dashboard take Authorization: Bearer <token>",
            markup=False,
        )
        say(f"The token is in {runtime.serve_token_file} (owner-only; kept for the next start)")
    sender = webhook_sender(runtime)
    stopped: list[BaseException | None] = []

    def on_stopped(failure: BaseException | None) -> None:
        stopped.append(failure)
        _thread.interrupt_main()  # the server stops with its worker

    worker = (
        ServeWorker(
            runtime.settings,
            worker_id=cli_worker_id(),
            logger=logger,
            on_park=_announce,
            on_stopped=on_stopped,
        )
        if work
        else None
    )
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        if sender is not None:
            sender.start()
        if worker is not None:
            worker.start()
            say(
                f"A worker ({worker.worker_id}) works the runs in this process, as `ratchet worker`"
            )
        else:
            say(f"No worker here (--no-worker): run `{command('worker')}` for runs to move on")
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        if sender is not None:
            sender.stop()
        if worker is not None and not worker.stop():
            say(
                "A step was still running: its lease lapses and the next worker resumes the "
                "run from its last checkpoint",
                console=err,
            )
    if stopped:
        reason = f"{type(stopped[0]).__name__}: {stopped[0]}" if stopped[0] else "it stopped"
        say(f"ratchet serve stops: its worker stopped ({reason})", console=err)
        raise typer.Exit(1)


def _announce(runtime: Any, run_id: str) -> None:
    """What `ratchet worker` prints when a run parks (and the request it opens)."""
    from ratchet.cli.foreground import parked_line

    said = parked_line(runtime, run_id)
    if said is not None:
        say(said)


def _agents(flags: list[str]) -> Any:
    """The agents the runs API starts by name: the built-in ones, the project's (`[tool.ratchet]
    agents` in ./pyproject.toml or ./ratchet.toml, as the stack reads them, its `source`
    folders put on the import path) and those named with `--agent`."""
    from ratchet.agents import AgentRegistry, project_agents

    project = project_agents(Path.cwd())
    for folder in project.source:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    named: dict[str, str] = {}
    for flag in flags:
        matched = AGENT_FLAG.fullmatch(flag)
        if matched is None:
            raise InvalidInput(f"--agent {flag!r}: use --agent NAME=module:attr or module:attr")
        target = matched["target"]
        named[matched["name"] or target] = target
    try:
        AgentRegistry().with_agents(named)
    except ValueError as error:
        raise InvalidInput(f"--agent: {error}") from None
    try:
        return AgentRegistry().with_agents({**project.agents, **named}, project.models)
    except ValueError as error:
        raise InvalidInput(f"{project.config_file}: {error}") from None


def demo(
    batches: Annotated[
        int, typer.Option("--batches", min=24, max=MAX_BATCHES, help="Batches to copy.")
    ] = 40,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the demo's store and print where it is.")
    ] = False,
) -> None:
    """The offline demo: a migration agent survives SIGKILL mid-step and waits for approval."""
    from ratchet.cli.demo import run_demo  # it loads the local runtime (see ratchet.cli.context)

    require_local_store("demo")
    raise typer.Exit(run_demo(out, batches=batches, keep=keep))
