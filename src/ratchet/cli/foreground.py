"""What `ratchet run` does once its options are read, without typer: start a run (or find it)
and work it in the foreground, a line per step, then say where it stands; and the parts the
worker and `ratchet serve` share with it (the webhook sender, the line said of a run that
parks).

The full CLI's `run` (`ratchet.cli.runs.run`) calls `run_in_foreground` with the options typer
read; the entry point calls it with the options it read itself (`ratchet.cli.quick_writes`), so
that `run` does not wait for typer and every other command to load before its first step
(issue 36). Nothing here loads typer, nor rich before a line is said through it.

tests/integration/test_quick_writes.py holds both paths' output, exit codes and stores equal.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratchet.cli import context, readout
from ratchet.cli.context import (
    approval_link,
    check_run_id,
    check_worker_settings,
    command,
    logs_on_terminal,
    open_client,
    open_runtime,
    print_json,
    prints_links,
    require_local_store,
    say,
    settings,
    store_named,
)
from ratchet.cli.progress import ProgressPrinter, line_of_state, model_retries_said
from ratchet.cli.writes import NewRun, say_if_paid, validated_run, with_approval_timeout
from ratchet.errors import StoreUnavailable

if TYPE_CHECKING:
    from ratchet.state import RunState


def run_in_foreground(new: NewRun, *, as_json: bool = False) -> None:
    """`ratchet run`: start a run and work it in the foreground until it is done, waiting or
    failed, with a line per step. With only a run id, continue that run (after an approval,
    say). Exits 1 if the run failed, 130 on Ctrl-C."""
    from ratchet.state import RunStatus  # the run models (see ratchet.cli.context)

    require_local_store("run")
    check_worker_settings()
    run_id = new.run_id
    # A run id with no goal, scenario or agent, of a run that exists: go on with that run.
    named_only = new.goal is None and new.scenario is None and new.agent_ref is None
    continuing = run_id is not None and named_only and _exists(run_id)
    state = None if continuing else validated_run(new)
    client = open_client(create=True)
    # Started before the run is created: on a store's first sender, a run made earlier is not
    # owed (the book of deliveries' `prepare`, SQLite's or Postgres's).
    reference = state.agent if state is not None else client.head(str(run_id)).agent
    sender = webhook_sender(client.runtime, agent_urls=agent_webhooks(reference), stderr=True)
    if sender is not None:
        sender.start()
    try:
        if state is not None:
            state = with_approval_timeout(state, new.approval_timeout)
        created = state is not None and client.create(state).created
        if state is not None and not created:
            context.err.print(f"run {state.run_id} already exists; resuming it")
        worked_id = state.run_id if state is not None else run_id
        assert worked_id is not None
        if not as_json:
            say_if_paid(client.head(worked_id).options.model, stderr=False)

        try:
            with (
                ProgressPrinter(as_json=as_json, live=not logs_on_terminal()) as printer,
                model_retries_said(printer),
            ):
                work_showing_progress(client, worked_id, printer)
        except KeyboardInterrupt:
            _say_interrupted(client.head(worked_id))
            sys.exit(130)
        if sender is not None:
            # The run has ended or parked here, in the foreground: its changes are sent before
            # the command exits (bounded), or stay owed in the store for the next sender.
            say_still_owed(sender.drain(worked_id))
        final = client.head(worked_id)
        waits_for_person = (
            final.status is RunStatus.WAITING
            and final.waiting is not None
            and final.waiting.kind == "person"
        )
        link = approval_link(client.runtime, final.run_id) if waits_for_person else None
        shown = link if as_json or prints_links(client.runtime) else None
    finally:
        if sender is not None:
            sender.stop()
        client.close()
    _say_where_it_stands(final, shown, as_json=as_json, store=store_named(settings().store))


def _exists(run_id: str) -> bool:
    """Whether the store holds this run (no store yet: it does not)."""
    check_run_id(run_id)
    try:
        runtime = open_runtime(create=False)
    except StoreUnavailable:
        return False
    try:
        return runtime.store.load_head(run_id) is not None
    finally:
        runtime.close()


def _say_interrupted(state: RunState) -> None:
    """Where a run worked in the foreground stands after Ctrl-C, and how to go on."""
    say(
        f"interrupted: {state.run_id} is {state.status.value} at step {state.step} (a step "
        f"under way resumes from there); go on with: {command('run', '--run-id', state.run_id)}",
        console=context.err,
    )


def progress_line(report: Any, printer: Any) -> None:
    """The line of a committed step (the worker's `on_step`)."""
    state = report.state
    printer.show(line_of_state(state, ms=report.ms, before=printer.before(state.run_id)))


def work_showing_progress(client: Any, run_id: str, printer: Any) -> None:
    """`client.work`, printing a line per committed step (the worker's `on_step`). The run
    exists: `run` has just created it or found it."""
    client.runtime.work(
        run_id,
        worker_id=client.worker_id,
        logger=client.logger,
        faults=client.faults,
        on_step=lambda report: progress_line(report, printer),
        on_wait=printer.say,
        # The operator's own request (the link it prints after the run parks is theirs).
        on_park=lambda parked: parked_line(client.runtime, parked),
    )


def _say_where_it_stands(final: RunState, link: str | None, *, as_json: bool, store: str) -> None:
    """What `run` prints once the run is done, waiting or failed (exit 1 if it failed), and
    which store it is in."""
    from ratchet.state import RunStatus  # the run models (see ratchet.cli.context)

    if as_json:
        print_json({**readout.status_payload(final.model_dump(mode="json")), "approval_link": link})
        if final.status is RunStatus.FAILED:
            sys.exit(1)
        return
    say(f"{final.run_id}: {_status_text(final)}")
    if final.summary:
        say(final.summary, lines=True)
    if final.status is RunStatus.WAITING and final.waiting and final.waiting.kind == "person":
        say(f"Waiting for a person: {final.waiting.request.prompt}")
        if link is None:  # not printed here (see prints_links)
            say(f"Approve or reject: {command('link', final.run_id)} prints a link to decide it")
        else:
            say(f"Approve or reject at: {link}  (serve it with: {command('serve')})")
        say(
            f"or decide here: {command('approve', final.run_id)}  /  "
            f"{command('reject', final.run_id)}"
        )
    elif final.status is RunStatus.WAITING and final.waiting:
        wait = readout.wait_of(final.waiting.model_dump(mode="json"))
        say(readout.wait_announcement(final.run_id, wait))
    say(f"(the run is in store {store})")
    if final.status is RunStatus.FAILED:
        say(f"run failed: {final.error}", console=context.err)
        sys.exit(1)


def _status_text(state: RunState) -> str:
    """`done at step 7`, `failed at step 3`, `stopped at step 60: Stopped at the cap...`."""
    from ratchet.state import RunStatus  # the run models (see ratchet.cli.context)

    if state.status is RunStatus.FAILED:
        return f"failed at step {state.next_step}"
    said = f"{state.status.value} at step {state.step}"
    if state.status is RunStatus.STOPPED and state.summary:
        said += f": {state.summary}"
    return said


def parked_line(runtime: Any, run_id: str) -> str | None:
    """What the worker (and `ratchet run`) says of a run it just parked: for a person, the
    operator's approval link (opening the request if no one has); for an event, how to send
    it; for a time, when it wakes. None if the run no longer waits (settled meanwhile)."""
    head: RunState | None = runtime.store.load_head(run_id)
    if head is None or head.waiting is None or head.status.value != "waiting":
        return None
    if head.waiting.kind == "person":
        link = approval_link(runtime, run_id)  # opens the request, printed or not
        if not prints_links(runtime):
            return (
                f"{run_id} waits for a person: the request went to whom the run notifies "
                f"({command('link', run_id)} prints a link to decide it)"
            )
        return f"{run_id} waits for a person; approve or reject at: {link}"
    wait = readout.wait_of(head.waiting.model_dump(mode="json"))
    said = readout.wait_announcement(run_id, wait)
    request = head.waiting.request
    if getattr(request, "webhook", False):
        from ratchet.runtime.hooks import hook_url

        # The URL only: `ratchet hook RUN NAME` shows its secret to whoever asks for it.
        name = str(getattr(request, "name", ""))
        url = hook_url(runtime, run_id, name)
        said += f"; or deliver it to {url} (ratchet hook {run_id} {name})"
    return said


def webhook_sender(runtime: Any, *, agent_urls: Sequence[str] = (), stderr: bool = False) -> Any:
    """The (unstarted) sender of this process's webhooks, said on stdout (`stderr`: on
    stderr): those of RATCHET_WEBHOOKS, and `agent_urls` (the webhooks of the agent
    `ratchet run` works); None if there are neither. Every process with RATCHET_WEBHOOKS
    sends: the store's claims keep two senders from sending one delivery at once."""
    from ratchet.runtime.webhooks import open_sender, webhook_secret_file

    urls = [*runtime.settings.webhooks, *agent_urls]
    if not urls:
        return None
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
        console=context.err if stderr else context.out,
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
            console=context.err,
        )
