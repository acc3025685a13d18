"""`ratchet serve --store dynamodb://...`: the runs dashboard and the runs API's reads of a
deployed stack, served on this machine with the caller's own AWS credentials.

Read-only end to end: no worker (the stack's state machine works its runs), no approval desk
(a waiting run names the stack's own approval route; nothing here signs a link), and every
request but a GET or HEAD refused before any route sees it (`ratchet.web.read_only`). The
tables are asked once, before anything listens, whose they are and whether the caller may read
them (`AwsRuntime.tables_seen`): a missing table, no credentials or no read rights is one line
and exit 2. Off localhost the dashboard and the runs API take the bearer token, as a local
store's serve does, kept in `.ratchet/<table>.serve-token`.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from ratchet.cli.context import cli_logger, err, out, say, settings

DEPLOYED_ROUTES = ("/runs", "/dashboard")
"""What a deployed stack's serve answers: the runs API's reads and the dashboard."""


def serve_deployed(host: str, port: int) -> None:
    from ratchet.approvals.links import token_file
    from ratchet.runtime import runtime_for
    from ratchet.runtime.services import deployed_read_services
    from ratchet.web.dashboard import deployed_app
    from ratchet.web.read_only import read_only
    from ratchet.web.runs import build_app as build_runs_app
    from ratchet.web.serve import (
        IDLE_SECONDS,
        BearerToken,
        LocalServer,
        is_local,
        listen,
        listening_url,
        wsgi_app,
    )

    chosen = settings()
    runtime: Any = runtime_for(chosen, create=False)
    seen = runtime.tables_seen()  # before anything listens: a refusal is one line, exit 2
    api_url = chosen.public_url if chosen.public_url_set else None
    runs, deployed = deployed_read_services(runtime, seen, logger=cli_logger(), api_url=api_url)
    runs_app = build_runs_app(lambda: runs)
    dashboard = deployed_app(runs.client, deployed, mailbox=runtime.mailbox())
    routes = [("/runs", runs_app), ("/dashboard", dashboard)]
    token_path = Path(".ratchet") / f"{seen.table}.serve-token"
    token = None if is_local(host) else token_file(token_path)
    bearer = BearerToken(token, DEPLOYED_ROUTES) if token is not None else None
    listening = listen(host, port)
    try:
        application = read_only(
            wsgi_app(routes, bearer=bearer), api=api_url or "the stack's API (its RunsUrl output)"
        )
        httpd = LocalServer(application, listening, IDLE_SECONDS)
    except BaseException:
        listening.close()
        raise
    base = listening_url(host, httpd.server_port)
    stack = seen.stack or "(stack unnamed: its tags cannot be read)"
    say(f"Reading stack {stack}, account {seen.account}, {seen.region}: table {seen.table}")
    out.print(f"The runs dashboard: {base}/dashboard (read-only)")
    out.print(f"The runs API's reads: {base}/runs (GET only; POST, PUT and DELETE answer 405)")
    if token is not None:
        err.print(
            f"Warning: {host} is reachable from the network; /runs and /dashboard take "
            "Authorization: Bearer <token>",
            markup=False,
        )
        say(f"The token is in {token_path} (owner-only; kept for the next start)")
    out.print("No worker here: the stack's state machine works its runs")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
