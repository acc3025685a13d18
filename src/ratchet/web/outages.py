"""What the public routes answer when the store cannot be reached or turns a request away: the
approval pages, the dashboard and the webhooks, each in its own envelope (an HTML page, or the
hooks' JSON refusal), all in one way (`answer_outages`).

A database that restarted cut every connection its pool held, and the pool learns that of each
only as it is next used: the store's adapter drops them all when the first fails
(`PostgresDatabase._lost`). So a page (a GET, which writes nothing) reads once more, on a fresh
connection, and the person who clicked their link sees it rather than an error. A POST is
never sent again here: it is answered 503 with Retry-After, and its sender sends it again. That
is safe for each: a decision is one write conditional on the request being pending (sent twice,
the second finds it decided and says so), and a hook's delivery is kept once per delivery id
(sent twice, the second is a duplicate). A store still out of reach is a 503 too, saying so and
to try again in a moment; serve logs one line for it, never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware

from ratchet.errors import StoreBusy, StoreDamaged, StoreUnavailable, StoreUnreachable

RETRY_AFTER_SECONDS = 5
"""What a 503 asks the sender to wait: a restarted database answers within seconds."""
READS = frozenset({"GET", "HEAD"})
"""The methods whose routes only read, and so are asked of the store once more."""

Outage = StoreBusy | StoreUnavailable
"""A store out of reach (`StoreUnreachable`), busy for now (`StoreBusy`) or not opened
(`StoreUnavailable`); a damaged one (`StoreDamaged`) is none: trying again mends nothing."""

_log = logging.getLogger("ratchet.serve")


def answer_outages(
    app: APIGatewayRestResolver,
    routes: str,
    refusal: Callable[[Outage], Response[str]],
    logger: Callable[[], Any],
) -> None:
    """Answer a request to `app` (named `routes` in the log) that meets the store out of
    reach with `refusal`'s 503, after a second try of a read; `logger` gives the app's logger
    (None: serve's)."""

    def outages(app: APIGatewayRestResolver, next_middleware: NextMiddleware) -> Response[Any]:
        tries = 2 if app.current_event.http_method in READS else 1
        for _ in range(tries):
            try:
                return next_middleware(app)
            except StoreDamaged:
                raise  # the app's own answer, or its 500: no second try mends it
            except (StoreBusy, StoreUnavailable) as error:
                failed: Outage = error
        (logger() or _log).warning(
            f"store out of reach: {routes} answered 503 ({failed})",
            extra={"status": 503, "method": app.current_event.http_method, "tries": tries},
        )
        answer = refusal(failed)
        answer.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return answer

    app.use(middlewares=[outages])


def outage_words(error: Outage) -> tuple[str, str]:
    """A page's title and message for `error`: a store out of reach, or one busy for now."""
    if isinstance(error, StoreBusy) and not isinstance(error, StoreUnreachable):
        return "Busy, please try again", "Ratchet is busy for the moment: try again in a moment."
    return (
        "The store is unreachable",
        "Ratchet's store did not answer: try again in a moment.",
    )
