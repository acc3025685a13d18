"""Starting and working runs: `start` (a worker does the steps), `run` (started and worked in
the foreground, a line per step) and `worker` (claims runnable runs and advances them)."""

from __future__ import annotations

import signal
from typing import Annotated

import typer

from ratchet.cli.context import (
    check_worker_settings,
    cli_logger,
    cli_worker_id,
    command,
    err,
    logs_on_terminal,
    open_runtime,
    require_local_store,
    say,
)
from ratchet.cli.foreground import (
    parked_line,
    progress_line,
    run_in_foreground,
    say_still_owed,
    webhook_sender,
)
from ratchet.cli.options import (
    MAX_APPROVAL_TIMEOUT_SECONDS,
    MAX_BATCHES,
    MAX_LEASE_SECONDS,
    MAX_PRIORITY,
    MAX_STEPS,
    MAX_TOOL_LATENCY_MS,
    MIN_LEASE_SECONDS,
    not_empty,
)
from ratchet.cli.progress import ProgressPrinter, model_retries_said
from ratchet.cli.writes import NewRun, start_run
from ratchet.errors import StoreMissing

GoalOption = Annotated[
    str | None, typer.Option("--goal", metavar="TEXT", help="What the agent should do.")
]
ScenarioOption = Annotated[
    str | None,
    typer.Option(
        "--scenario",
        metavar="NAME",
        callback=not_empty,
        help="A built-in agent: migration, notebook.",
    ),
]
RunIdOption = Annotated[
    str | None, typer.Option("--run-id", metavar="ID", help="A stable id for the run.")
]
AgentOption = Annotated[
    str | None,
    typer.Option(
        "--agent", metavar="MODULE:ATTR", callback=not_empty, help="Your own agent, as module:attr."
    ),
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        metavar="MODEL",
        callback=not_empty,
        help="'scripted' (offline), claude-… (with ANTHROPIC_API_KEY), bedrock:<model id> "
        "(AWS credentials), or your own Model as module:attr; default the agent's scripted "
        "policy, or Claude (with ANTHROPIC_API_KEY) for an agent without one.",
    ),
]
MaxStepsOption = Annotated[
    int | None,
    typer.Option("--max-steps", metavar="N", help="Step cap (default 60).", min=1, max=MAX_STEPS),
]
InputOption = Annotated[
    str | None,
    typer.Option(
        "--input",
        metavar="JSON",
        callback=not_empty,
        help="The agent's input, a JSON object checked against its input model.",
    ),
]
ParamOption = Annotated[
    list[str] | None,
    typer.Option(
        "--param",
        metavar="NAME=VALUE",
        callback=not_empty,
        help="One input field (repeatable; wins over --input). VALUE is read as JSON if it "
        "is JSON, else as text: --param batches=2.",
    ),
]
# Older spellings, kept for the scripts that use them and hidden from --help: `--batches N` is
# `--param batches=N` (the migration's input); `--tool-latency-ms` slows every tool call down.
BatchesOption = Annotated[
    int | None,
    typer.Option("--batches", hidden=True, min=1, max=MAX_BATCHES),
]
NotifyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--notify",
        metavar="EMAIL",
        callback=not_empty,
        help="Who is asked when the run waits for a person (repeatable). Locally the message "
        "goes to the outbox beside the store.",
    ),
]
NotifySlackOption = Annotated[
    str | None,
    typer.Option(
        "--notify-slack",
        metavar="CHANNEL",
        callback=not_empty,
        help="A Slack channel to ask instead.",
    ),
]
LatencyOption = Annotated[
    int | None,
    typer.Option("--tool-latency-ms", hidden=True, min=0, max=MAX_TOOL_LATENCY_MS),
]
ApprovalTimeoutOption = Annotated[
    int | None,
    typer.Option(
        "--approval-timeout",
        metavar="SECONDS",
        help="Seconds a person has to answer this run's requests; then a worker records "
        "the expiry and the run goes on (default: RATCHET_APPROVAL_TIMEOUT_SECONDS, 7 days).",
        min=1,
        max=MAX_APPROVAL_TIMEOUT_SECONDS,
    ),
]
KeyOption = Annotated[
    str | None,
    typer.Option(
        "--key",
        metavar="KEY",
        callback=not_empty,
        help="The tenant the run works for (1-64 of A-Z a-z 0-9 . _ : @ -): at most the "
        "agent's max_concurrent_per_key runs of one key work a step at once.",
    ),
]
PriorityOption = Annotated[
    int | None,
    typer.Option(
        "--priority",
        metavar="N",
        help="0 (default) to 9: of the runs waiting for a slot, the higher goes first.",
        min=0,
        max=MAX_PRIORITY,
    ),
]
BudgetOption = Annotated[
    str | None,
    typer.Option(
        "--budget",
        metavar="USD",
        help="The run's budget in US dollars, above 0 and at most 10,000 (default: the "
        "agent's max_cost_usd); past it the run waits for a person to raise it.",
    ),
]
ProgressJsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON object per step, then one for the run."),
]


def start(
    goal: GoalOption = None,
    scenario: ScenarioOption = None,
    run_id: RunIdOption = None,
    agent: AgentOption = None,
    model: ModelOption = None,
    max_steps: MaxStepsOption = None,
    input_json: InputOption = None,
    param: ParamOption = None,
    batches: BatchesOption = None,
    tool_latency_ms: LatencyOption = None,
    notify: NotifyOption = None,
    notify_slack: NotifySlackOption = None,
    approval_timeout: ApprovalTimeoutOption = None,
    key: KeyOption = None,
    priority: PriorityOption = None,
    budget: BudgetOption = None,
) -> None:
    """Start a run (a worker does the steps). Prints the run id."""
    start_run(
        NewRun(
            goal=goal,
            scenario=scenario,
            agent_ref=agent,
            run_id=run_id,
            model=model,
            max_steps=max_steps,
            input_json=input_json,
            params=param,
            batches=batches,
            tool_latency_ms=tool_latency_ms,
            notify=notify,
            notify_slack=notify_slack,
            approval_timeout=approval_timeout,
            concurrency_key=key,
            priority=priority,
            budget=budget,
        )
    )


def run(
    goal: GoalOption = None,
    scenario: ScenarioOption = None,
    run_id: RunIdOption = None,
    agent: AgentOption = None,
    model: ModelOption = None,
    max_steps: MaxStepsOption = None,
    input_json: InputOption = None,
    param: ParamOption = None,
    batches: BatchesOption = None,
    tool_latency_ms: LatencyOption = None,
    notify: NotifyOption = None,
    notify_slack: NotifySlackOption = None,
    approval_timeout: ApprovalTimeoutOption = None,
    key: KeyOption = None,
    priority: PriorityOption = None,
    budget: BudgetOption = None,
    as_json: ProgressJsonOption = False,
) -> None:
    """Start a run and work it in the foreground until it is done, waiting or failed, with a
    line per step. With only --run-id, continue that run (after an approval, say)."""
    run_in_foreground(
        NewRun(
            goal=goal,
            scenario=scenario,
            run_id=run_id,
            agent_ref=agent,
            model=model,
            max_steps=max_steps,
            input_json=input_json,
            params=param,
            batches=batches,
            tool_latency_ms=tool_latency_ms,
            notify=notify,
            notify_slack=notify_slack,
            approval_timeout=approval_timeout,
            concurrency_key=key,
            priority=priority,
            budget=budget,
        ),
        as_json=as_json,
    )


def worker(
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Exit 0 once no run is runnable.")
    ] = False,
    worker_id: Annotated[
        str | None, typer.Option("--worker-id", metavar="ID", help="Default: host:pid.")
    ] = None,
    lease_seconds: Annotated[
        float,
        typer.Option(
            "--lease-seconds",
            metavar="S",
            help="Lease length.",
            min=MIN_LEASE_SECONDS,
            max=MAX_LEASE_SECONDS,
        ),
    ] = 30.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per step.")
    ] = False,
) -> None:
    """Claim runnable runs and advance them, with a line per step; SIGTERM stops after the
    current step."""
    # The SQLite adapter and the engine, built on the run models (see ratchet.cli.context).
    from ratchet.ports import check_lease_seconds
    from ratchet.worker import check_worker_id

    require_local_store("worker")
    # Before the store is opened (and made): a bad value must leave nothing behind.
    check_lease_seconds(lease_seconds, name="--lease-seconds")
    worker_id = check_worker_id(worker_id) if worker_id is not None else cli_worker_id()
    check_worker_settings()
    try:
        # Only a worker that waits for runs makes a store; one that stops when idle has
        # nothing to do where there is none, and leaves no file behind.
        runtime = open_runtime(create=not until_idle)
    except StoreMissing as missing:
        err.print(f"nothing to work: {missing}")
        return
    logger = cli_logger()
    printer = ProgressPrinter(as_json=as_json, live=not logs_on_terminal())

    def announce(run_id: str) -> None:
        said = parked_line(runtime, run_id)
        if said is not None:
            printer.say(said)

    work = runtime.worker(
        worker_id=worker_id,
        logger=logger,
        lease_seconds=lease_seconds,
        on_park=announce,
        on_step=lambda report: progress_line(report, printer),
        on_wait=printer.say,
    )
    sender = webhook_sender(runtime, stderr=True)
    signal.signal(signal.SIGTERM, lambda *_: work.stop.set())
    interrupted = False
    try:
        if sender is not None:
            sender.start()
        with printer, model_retries_said(printer):
            work.run(until_idle=until_idle)
        if sender is not None and until_idle:
            # A worker that exits once idle sends what it committed first (bounded): no other
            # sender may be running to send it.
            say_still_owed(sender.drain())
    except KeyboardInterrupt:
        work.stop.set()
        interrupted = True
    finally:
        if sender is not None:
            sender.stop()
        runtime.close()
    logger.info("worker stopped", extra={"worker_id": work.worker_id})
    if interrupted:
        # Whatever step it was in did not commit: its run goes on from its last checkpoint
        # with the next worker (its lease was given back as the worker let go of it).
        say(
            "worker interrupted: a step it was taking resumes from its run's last checkpoint "
            f"with the next worker ({command('worker')})",
            console=err,
        )
        raise typer.Exit(130)
    if work.unloadable:
        left = ", ".join(sorted(work.unloadable))
        err.print(f"left runs whose agent this worker cannot load: {left}", markup=False)
        raise typer.Exit(1)
