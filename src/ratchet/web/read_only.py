"""`ratchet serve` on a deployed stack's tables: the dashboard and the runs API's reads, and
nothing that writes.

The refusal is made here, in front of every route, on the request's method alone: anything
but a `GET` (a `POST`, `PUT`, `PATCH`, `DELETE`; a `HEAD`, which no route answers) never
reaches an app, so no route (one added later included) can
write to the stack's tables from a laptop. Runs are started, decided and steered on the stack
itself: its API, its signed links, Slack.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.wrappers import Response

READ_METHODS = frozenset({"GET"})

WsgiApp = Callable[[dict[str, Any], Any], Iterable[bytes]]


def read_only(application: WsgiApp, *, api: str) -> WsgiApp:
    """`application`, with every method but GET refused (405, JSON, `Allow: GET`) before it
    is read further; `api` names where such a request goes instead."""

    def answer(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET").upper() in READ_METHODS:
            return application(environ, start_response)
        error = (
            "this server reads a deployed stack's tables and changes nothing: send "
            f"{environ.get('REQUEST_METHOD')} requests to {api}"
        )
        refusal = Response(
            json.dumps({"error": error, "problems": []}),
            status=405,
            content_type="application/json",
            headers={"Allow": "GET", "Cache-Control": "no-store"},
        )
        return refusal(environ, start_response)

    return answer
