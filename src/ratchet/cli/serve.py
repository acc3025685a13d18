"""What runs on this machine for a person to use: `serve` (the approval pages, the runs API and
the dashboard, as the deployed API serves them) and `demo` (the offline demo, which serves them
too)."""

from __future__ import annotations

import signal
from typing import Annotated

import typer

from ratchet.cli.context import (
    cli_worker_id,
    operator_name,
    out,
    require_local_store,
    settings,
    stderr_logger,
)
from ratchet.cli.options import MAX_BATCHES, not_empty


def serve(
    port: Annotated[
        int, typer.Option("--port", help="Port (0: any free one).", min=0, max=65535)
    ] = 8765,
    host: Annotated[
        str, typer.Option("--host", callback=not_empty, help="Interface to listen on.")
    ] = "127.0.0.1",
) -> None:
    """Serve the approval pages, the runs API and webhooks (/hooks/) locally (as the deployed
    API does), and the runs dashboard at /dashboard."""
    # The web apps, waitress and the local runtime: loaded only to serve (see ratchet.cli.context).
    from ratchet.runtime.hooks import local_hooks
    from ratchet.runtime.local import LocalRuntime
    from ratchet.runtime.services import approval_services, local_runs_services
    from ratchet.web.approvals import build_app
    from ratchet.web.dashboard import local_app as dashboard_app
    from ratchet.web.hooks import BODY_LIMIT, Throttle
    from ratchet.web.hooks import build_app as build_hooks_app
    from ratchet.web.runs import build_app as build_runs_app
    from ratchet.web.serve import server

    require_local_store("serve")
    # The server runs the app on a thread of its own, one request at a time.
    runtime = LocalRuntime.open(settings(), create=True, any_thread=True)
    logger = stderr_logger()
    services = approval_services(
        runtime.approval_desk(worker_id=f"serve:{cli_worker_id()}", logger=logger),
        slack_signing_secret=runtime.settings.slack_signing_secret,
        logger=logger,
    )
    approvals = build_app(lambda: services)
    runs = local_runs_services(runtime, worker_id=f"serve:{cli_worker_id()}", logger=logger)
    runs_app = build_runs_app(lambda: runs)
    routes = [
        ("/approvals/", approvals),
        ("/slack/", approvals),
        ("/runs", runs_app),
        ("/schedules", runs_app),
        (
            "/dashboard",
            dashboard_app(
                runs.client, services.desk, operator=operator_name(), mailbox=runtime.mailbox
            ),
        ),
    ]
    # Webhooks: serve has no throttle of its own, so the hook route brings one (per hook).
    hook_desk = runtime.event_desk(
        runtime.engine(worker_id=f"serve:{cli_worker_id()}", logger=logger)
    )
    hooks = local_hooks(runtime).services(hook_desk, logger=logger, throttle=Throttle())
    routes.append(("/hooks/", build_hooks_app(lambda: hooks)))
    httpd = server(routes, host=host, port=port, body_limits=[BODY_LIMIT])
    out.print(f"Serving approvals on http://{host}:{httpd.server_port}")
    out.print(f"The runs dashboard: http://{host}:{httpd.server_port}/dashboard")
    out.print(f"Approval links point at {runtime.settings.public_url} (RATCHET_PUBLIC_URL)")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        runtime.close()


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
