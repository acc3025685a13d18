"""`ratchet deliveries [RUN]`: the webhooks sent or owed (RATCHET_WEBHOOKS, an agent's
`webhooks`), each delivery's id, its change, where it went, how it went, and when it is tried
again; and the sender that `ratchet serve`, `ratchet worker` and `ratchet run` start."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from ratchet.cli.context import err, open_runtime, out, print_json, require_local_store, say
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


def webhook_sender(runtime: Any, *, agent_urls: Sequence[str] = (), console: Any = out) -> Any:
    """The (unstarted) sender of this process's webhooks, said on `console`: those of
    RATCHET_WEBHOOKS, and `agent_urls` (the webhooks of the agent `ratchet run` works); None if
    there are neither. Every process with RATCHET_WEBHOOKS sends: the store's claims keep two
    senders from sending one delivery at once."""
    from ratchet.runtime.webhooks import open_sender, webhook_secret_file

    urls = [*runtime.settings.webhooks, *agent_urls]
    if not urls:
        return None
    # A store without a book of deliveries (a postgresql:// one, as yet) refuses here, in one
    # line, before any run is worked whose changes it could not send.
    runtime.deliveries  # noqa: B018
    sender = open_sender(runtime)
    secret = (
        "RATCHET_WEBHOOK_SECRET"
        if runtime.settings.webhook_secret
        else str(webhook_secret_file(runtime))
    )
    say(
        f"Webhooks: each change of a run's status is POSTed to {', '.join(urls)} (and to the "
        f"URLs its agent declares), signed with the secret in {secret} (ratchet deliveries "
        "lists them)",
        console=console,
    )
    return sender


def agent_webhooks(reference: str) -> tuple[str, ...]:
    """The webhooks the agent declares (`Agent.webhooks`); none if it does not load here (the
    run's own commands then say why)."""
    from ratchet.agents import load_agent
    from ratchet.errors import RatchetError

    try:
        return tuple(load_agent(reference).webhooks)
    except RatchetError:
        return ()


def say_still_owed(owed: int | None) -> None:
    """What a process that exits says of the deliveries it could not send in time."""
    if owed:
        say(
            f"{owed} webhook deliveries are still owed: the next worker or ratchet serve with "
            "RATCHET_WEBHOOKS sends them (ratchet deliveries lists them)",
            console=err,
        )
