"""`ratchet deliveries [RUN]`: the webhooks sent or owed (RATCHET_WEBHOOKS, an agent's
`webhooks`), each delivery's id, its change, where it went, how it went, and when it is tried
again. The sender that `ratchet serve`, `ratchet worker` and `ratchet run` start is
`ratchet.cli.foreground.webhook_sender`, which loads no typer."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from ratchet.cli.context import load_head, open_runtime, print_json, require_local_store
from ratchet.cli.options import JsonOption
from ratchet.untrusted import for_terminal

MAX_ROWS = 1000


def deliveries(
    run_id: Annotated[
        str | None, typer.Argument(metavar="[RUN]", help="Only this run's deliveries.")
    ] = None,
    as_json: JsonOption = False,
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=1, max=MAX_ROWS, help="The N latest.")
    ] = 50,
) -> None:
    """The webhook deliveries sent or owed (RATCHET_WEBHOOKS, an agent's), newest first: each
    one's id, the change it carries, its URL, state (pending, delivered, failed), attempts and
    last error."""
    require_local_store("deliveries")
    runtime = open_runtime(create=False)
    try:
        rows = [_row(d) for d in runtime.deliveries.listed(run_id, limit=limit)]
        if run_id is not None and not rows:
            # None for a typo'd id reads as a run that sent nothing: refused, as every other
            # command about one run refuses it (a run's deliveries are listed without its head,
            # which is read only when there are none).
            load_head(runtime, run_id)
    finally:
        runtime.close()
    if as_json:
        print_json({"deliveries": rows})
        return
    if not rows:
        sys.stdout.write("No webhook deliveries (workers send them: RATCHET_WEBHOOKS).\n")
        return
    for row in rows:
        again = f", next try {row['next_at']}" if row["state"] == "pending" else ""
        error = f", last error: {row['last_error']}" if row["last_error"] else ""
        sys.stdout.write(
            for_terminal(
                f"{row['id']}  {row['status']:<9} {row['state']:<9} {row['attempts']} "
                f"attempt(s) to {row['url']}{again}{error}"
            )
            + "\n"
        )


def _row(delivery: Any) -> dict[str, Any]:
    import json

    body = json.loads(delivery.body)
    return {
        "id": delivery.delivery_id,
        "change": delivery.change_id,
        "run_id": delivery.run_id,
        "status": body.get("status"),
        "url": delivery.url,
        "state": delivery.state,
        "attempts": delivery.attempts,
        "created_at": _when(delivery.created_at),
        "next_at": _when(delivery.next_at),
        "answered_at": _when(delivery.answered_at) if delivery.answered_at else None,
        "last_error": delivery.last_error,
    }


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
