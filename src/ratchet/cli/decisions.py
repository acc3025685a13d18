"""Deciding on runs: `approve` or `reject` what a waiting run asked for, and `link` to its
approval page; steering them: `retry` a failed run, `resume` one on AWS that no execution
works, `cancel` one, `fork` a new run from a step."""

from __future__ import annotations

from typing import Annotated

import typer

from ratchet.cli.context import (
    approval_link,
    load_head,
    open_client,
    open_runtime,
    operator_name,
    out,
    refuse,
    require_local_store,
)
from ratchet.cli.options import MAX_STEPS, RunArgument, not_empty
from ratchet.cli.writes import approve_run, reject_run

ByOption = Annotated[
    str | None,
    typer.Option(
        "--by", metavar="NAME", callback=not_empty, help="Who decides (default: your user name)."
    ),
]

WhoOption = Annotated[
    str | None,
    typer.Option(
        "--by", metavar="NAME", callback=not_empty, help="Who does it (default: your user name)."
    ),
]


def approve(
    run_id: RunArgument,
    comment: Annotated[
        str,
        typer.Option(
            "--comment", "--reason", metavar="TEXT", help="A note for the record (or --reason)."
        ),
    ] = "",
    by: ByOption = None,
    answer: Annotated[
        str | None,
        typer.Option(
            "--answer",
            metavar="JSON",
            help='The answer, as a JSON object, when the run asks for one ({"amount": 120}).',
        ),
    ] = None,
) -> None:
    """Approve what a waiting run asked for; the next free worker resumes it."""
    from ratchet.errors import AnswerInvalid

    try:
        approve_run(run_id, comment=comment, by=by, answer=answer)
    except AnswerInvalid as refused:
        refuse(refused.for_cli())  # how to give the answer: this command's --answer


def reject(
    run_id: RunArgument,
    reason: Annotated[
        str,
        typer.Option(
            "--reason", "--comment", metavar="TEXT", help="Why, for the record (or --comment)."
        ),
    ] = "",
    by: ByOption = None,
) -> None:
    """Reject what a waiting run asked for; the run goes on knowing the answer was no."""
    reject_run(run_id, reason=reason, by=by)


def link(run_id: RunArgument) -> None:
    """Print your approval link for a waiting run (open it with `ratchet serve` running)."""
    require_local_store("link")
    runtime = open_runtime(create=False)
    try:
        load_head(runtime, run_id)
        out.print(approval_link(runtime, run_id))
    finally:
        runtime.close()


def retry(run_id: RunArgument, by: WhoOption = None) -> None:
    """Give a failed run fresh attempts at the step that failed, from its last checkpoint."""
    require_local_store("retry")
    client = open_client(create=False)
    try:
        run = client.retry(run_id, by=by or operator_name())
    finally:
        client.close()
    out.print(
        f"{run.run_id}: retried at step {run.step + 1}; the next free worker takes it "
        f"(or: ratchet run --run-id {run.run_id})",
        markup=False,
    )


def resume(run_id: RunArgument) -> None:
    """Start the next execution of a run on AWS that none works (one ended on a bundle
    that could not load its agent)."""
    client = open_client(create=False)
    try:
        resumed = client.resume(run_id)
    finally:
        client.close()
    if resumed.execution is None:
        said = "no execution works a run on a local store: the next free worker takes it"
    elif resumed.started:
        said = f"started execution {resumed.execution}"
    else:
        said = f"execution {resumed.execution} was started already, by another resume"
    out.print(f"{resumed.run_id}: {said}", markup=False)


def cancel(
    run_id: RunArgument,
    reason: Annotated[
        str, typer.Option("--reason", metavar="TEXT", help="Why, for the record.")
    ] = "",
    by: WhoOption = None,
) -> None:
    """End a running or waiting run as cancelled, keeping its checkpoints."""
    require_local_store("cancel")
    client = open_client(create=False)
    try:
        run = client.cancel(run_id, reason=reason, by=by or operator_name())
    finally:
        client.close()
    out.print(f"{run.run_id}: cancelled at step {run.step}", markup=False)


def fork(
    run_id: RunArgument,
    from_step: Annotated[
        int,
        typer.Option(
            "--from-step", metavar="N", min=0, max=MAX_STEPS, help="The step to start from."
        ),
    ],
    new_run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id",
            metavar="NEW",
            callback=not_empty,
            help="The new run's id (default: RUN-fork-<random>).",
        ),
    ] = None,
) -> None:
    """Start a new run from the state of RUN as of a step; RUN is untouched."""
    require_local_store("fork")
    client = open_client(create=True)
    try:
        run = client.fork(run_id, from_step=from_step, run_id=new_run_id)
    finally:
        client.close()
    out.print(
        f"{run.run_id}: forked from {run_id} at step {from_step}, {run.status.value}; the next "
        f"free worker takes it (or: ratchet run --run-id {run.run_id})",
        markup=False,
    )
