"""The `ratchet` command: start runs, work them, inspect them, decide on them, run the demo.

Bad input never ends in a traceback or a changed store: it is one line on stderr and exit
code 2. Read commands print one JSON object with `--json`.

The store is a local SQLite file (`sqlite:///path.db`, the default) or, for the read commands
(`status`, `history`, `show`, `verify`), the tables of a deployed stack:
`dynamodb://<checkpoints table>?ledger=<idempotency table>&app=<app table>&region=<region>`,
plus `&endpoint=<url>` for DynamoDB Local or moto. Runs on AWS start and are decided through
the stack's API, so the commands that write refuse a `dynamodb://` store.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console

# Typer vendors click; its usage errors are only importable from the vendored package.
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from ratchet.errors import (
    AbandonedCallRunning,
    ImportInterrupted,
    InvalidInput,
    RatchetError,
    RunNotFound,
)

if TYPE_CHECKING:
    from ratchet.state import RunState

# The bounds the options check, as the modules that own them define them (a unit test holds
# them equal). Importing those modules here would load the SQLite adapter, the engine and the
# scripted model before `--help` or any command could answer.
MIN_LEASE_SECONDS = 0.1  # ratchet.adapters.sqlite.leases
MAX_LEASE_SECONDS = 3600.0  # ratchet.adapters.sqlite.leases
MAX_STEPS = 10_000  # ratchet.runs
MAX_TOOL_LATENCY_MS = 30_000  # ratchet.runs
MAX_BATCHES = 500  # ratchet.scenarios.migration_data
MAX_ROWS = 100_000
"""The most rows `list --limit` and `history --last` may ask for."""


def check_run_id(run_id: str) -> str:
    """`ratchet.runs.check_run_id`, imported when a command first needs it."""
    from ratchet.runs import check_run_id as check

    return check(run_id)


app = typer.Typer(
    name="ratchet",
    help="Run long LLM agents that survive crashes, deploys and week-long waits for a person.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

_Text = TypeVar("_Text", str, list[str], None)


def _not_empty(value: _Text) -> _Text:
    """An option given as "" is refused, never taken for the option left out."""
    values = value if isinstance(value, list) else [value]
    if any(v is not None and not v.strip() for v in values):
        raise typer.BadParameter("must not be empty")
    return value


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        callback=_not_empty,
        envvar="RATCHET_STORE",
        help="Store URL. Default: sqlite:///.ratchet/ratchet.db. Read commands also take "
        "dynamodb://TABLE?ledger=TABLE&app=TABLE&region=REGION[&endpoint=URL].",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run id.")]


class _Globals:
    store: str | None = None


@app.callback()
def _global_options(store: StoreOption = None) -> None:
    _Globals.store = store
    # A run started with `--agent my_module:agent` is later worked and verified by other
    # `ratchet` processes; the console script does not put the current directory on the path.
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def _settings(store: str | None = None) -> Any:
    from ratchet.runtime.local import LocalSettings

    settings = LocalSettings.from_env()
    chosen = store or _Globals.store
    return settings.model_copy(update={"store": chosen}) if chosen else settings


def _runtime(*, create: bool, store: str | None = None) -> Any:
    from ratchet.runtime import runtime_for

    return runtime_for(_settings(store), create=create)


def _client(*, create: bool, worker_id: str | None = None, logs: bool = True) -> Any:
    """The Python client the commands act through, on the store the options name. A read
    command (`logs=False`) logs nothing, and so skips loading the JSON logger."""
    from ratchet.client import Client
    from ratchet.faults import FaultPlan
    from ratchet.runtime import runtime_for

    settings = _settings()
    return Client(
        runtime_for(settings, create=create),
        worker_id=worker_id or _cli_worker_id(),
        logger=_logger() if logs else None,
        faults=FaultPlan.parse(settings.fault),
        channel="cli",
    )


_ON_AWS = {
    "start": "runs on AWS start through the stack's API",
    "run": "runs on AWS start through the stack's API, and the state machine works them",
    "worker": "on AWS the state machine works runs; there is no worker to start",
    "approve": "on AWS a person decides through the emailed link or Slack, and a program "
    "through POST /runs/RUN/approve on the stack's API",
    "reject": "on AWS a person decides through the emailed link or Slack, and a program "
    "through POST /runs/RUN/reject on the stack's API",
    "demo": "the demo runs on a local store of its own",
    "link": "on AWS approval links are sent by email or Slack when a run parks",
    "serve": "on AWS the stack's API serves the approval pages",
    # On AWS a steered run needs its execution started or stopped, which only the API does.
    "retry": "on AWS use POST /runs/RUN/retry on the stack's API, which also starts a new "
    "execution",
    "cancel": "on AWS use POST /runs/RUN/cancel on the stack's API, which also stops the execution",
    "fork": "on AWS use POST /runs/RUN/fork on the stack's API, which also starts the fork's "
    "execution",
    "migrate": "there a head is upgraded when a step loads it, and stored anew by its next commit",
    "gc": "there the tables' TTL expires old records",
}


def _require_local_store(command: str) -> None:
    """The commands that write, or work on the store itself, take a local store only: refuse
    a dynamodb:// one before touching anything, saying what to do on AWS instead."""
    from ratchet.runtime import DYNAMODB_SCHEME

    if _settings().store.startswith(DYNAMODB_SCHEME):
        raise InvalidInput(
            f"ratchet {command} needs a local sqlite:// store, not a dynamodb:// one: "
            f"{_ON_AWS[command]}"
        )


def _head(runtime: Any, run_id: str) -> RunState:
    state: RunState | None = runtime.store.load_head(check_run_id(run_id))
    if state is None:
        raise RunNotFound(run_id)
    return state


def _print_json(payload: Any) -> None:
    from ratchet.cli.readout import json_text

    sys.stdout.write(json_text(payload))


# --- starting and working --------------------------------------------------------------------


def _new_run(
    *,
    goal: str | None,
    scenario: str | None,
    agent_ref: str | None,
    run_id: str | None,
    model: str | None,
    max_steps: int | None,
    input_json: str | None,
    params: list[str] | None,
    batches: int | None,
    tool_latency_ms: int | None,
    notify: list[str] | None = None,
    notify_slack: str | None = None,
) -> RunState:
    """Validate everything about a new run before anything touches the store. Refusals
    name the CLI's flags (the API names the same fields as JSON fields)."""
    from pydantic import ValidationError

    from ratchet.runs import RunRequest, RunRequestInvalid, cli_flag, new_run, request_problems

    if run_id is not None:
        check_run_id(run_id)
    try:
        request = RunRequest(
            run_id=run_id,
            scenario=scenario,
            agent=agent_ref,
            goal=goal,
            model=model,
            max_steps=max_steps,
            input=_run_input(input_json, params),
            batches=batches,
            tool_latency_ms=tool_latency_ms,
            notify={"email": notify or [], "slack_channel": notify_slack}
            if notify or notify_slack
            else None,
        )
    except ValidationError as error:
        field, message = request_problems(error)[0]
        raise InvalidInput(f"{cli_flag(field)}: {message}") from None
    try:
        return new_run(request, has_anthropic_key=_settings().anthropic_api_key is not None)
    except RunRequestInvalid as refused:
        raise InvalidInput(refused.for_cli()) from None


_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _run_input(input_json: str | None, params: list[str] | None) -> dict[str, Any] | None:
    """`--input '{"batches": 2}'` and `--param batches=2` (repeatable, later ones win) as one
    object. A `--param` value is read as JSON when it is JSON (`2`, `true`, `[1, 2]`, `"2"`),
    as text otherwise (`--param who=dana`). JSON nested too deep is refused before it is
    parsed, naming the flag."""
    from ratchet.errors import JsonOverLimit
    from ratchet.untrusted import loads

    if input_json is None and not params:
        return None
    given: dict[str, Any] = {}
    if input_json is not None:
        try:
            parsed = loads(input_json, field="--input")
        except JsonOverLimit:
            raise
        except ValueError as error:
            raise InvalidInput(f"--input is not JSON: {error}") from None
        if not isinstance(parsed, dict):
            raise InvalidInput(
                f"--input must be a JSON object, like '{{\"batches\": 2}}', not "
                f"{type(parsed).__name__}"
            )
        given.update(parsed)
    for param in params or []:
        name, equals, raw = param.partition("=")
        if not equals or not _PARAM_NAME.fullmatch(name):
            raise InvalidInput(f"--param {param!r}: use --param NAME=VALUE")
        try:
            given[name] = loads(raw, field=f"--param {name}")
        except JsonOverLimit:
            raise
        except ValueError:
            given[name] = raw
    return given


def _exists(run_id: str) -> bool:
    """Whether the store holds this run (no store yet: it does not)."""
    from ratchet.errors import StoreUnavailable

    check_run_id(run_id)
    try:
        runtime = _runtime(create=False)
    except StoreUnavailable:
        return False
    try:
        return runtime.store.load_head(run_id) is not None
    finally:
        runtime.close()


def _start(state: RunState) -> bool:
    client = _client(create=True)
    try:
        return bool(client.create(state).created)
    finally:
        client.close()


def _logger() -> Any:
    from ratchet.observability import json_logger

    return json_logger(sys.stderr, level=_settings().log_level)


def _cli_worker_id() -> str:
    from ratchet.runtime.local import default_worker_id

    return default_worker_id()


GoalOption = Annotated[str | None, typer.Option("--goal", help="What the agent should do.")]
ScenarioOption = Annotated[
    str | None,
    typer.Option("--scenario", callback=_not_empty, help="A built-in agent: migration, notebook."),
]
RunIdOption = Annotated[str | None, typer.Option("--run-id", help="A stable id for the run.")]
AgentOption = Annotated[
    str | None,
    typer.Option("--agent", callback=_not_empty, help="Your own agent, as module:attr."),
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        callback=_not_empty,
        help="'scripted' (offline), claude-… (with ANTHROPIC_API_KEY), bedrock:<model id> "
        "(AWS credentials), or your own Model as module:attr; default Claude when "
        "ANTHROPIC_API_KEY is set, else scripted.",
    ),
]
MaxStepsOption = Annotated[
    int | None,
    typer.Option("--max-steps", help="Step cap (default 60).", min=1, max=MAX_STEPS),
]
InputOption = Annotated[
    str | None,
    typer.Option(
        "--input",
        metavar="JSON",
        callback=_not_empty,
        help="The agent's input, a JSON object checked against its input model.",
    ),
]
ParamOption = Annotated[
    list[str] | None,
    typer.Option(
        "--param",
        metavar="NAME=VALUE",
        callback=_not_empty,
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
        callback=_not_empty,
        help="Who is asked when the run waits for a person (repeatable). Locally the message "
        "goes to the outbox beside the store.",
    ),
]
NotifySlackOption = Annotated[
    str | None,
    typer.Option(
        "--notify-slack",
        metavar="CHANNEL",
        callback=_not_empty,
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
        help="Seconds a person has to answer this run's requests; then a worker records "
        "the expiry and the run goes on (default: RATCHET_APPROVAL_TIMEOUT_SECONDS, 7 days).",
        min=1,
        max=365 * 24 * 3600,
    ),
]


def _with_approval_timeout(state: RunState, seconds: int | None) -> RunState:
    if seconds is None:
        return state
    options = state.options.model_copy(update={"approval_timeout_seconds": seconds})
    return state.model_copy(update={"options": options})


@app.command()
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
) -> None:
    """Start a run (a worker does the steps). Prints the run id."""
    _require_local_store("start")
    state = _new_run(
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
    )
    created = _start(_with_approval_timeout(state, approval_timeout))
    out.print(state.run_id)
    if not created:
        err.print(f"run {state.run_id} already exists; nothing changed")


ProgressJsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON object per step, then one for the run."),
]


def _progress_line(report: Any, printer: Any) -> None:
    from ratchet.cli.progress import line_of_state

    state = report.state
    printer.show(line_of_state(state, ms=report.ms, before=printer.before(state.run_id)))


def _work_showing_progress(client: Any, run_id: str, printer: Any) -> None:
    """`client.work`, printing a line per committed step (the worker's `on_step`). The run
    exists: `run` has just created it or found it."""
    client.runtime.work(
        run_id,
        worker_id=client.worker_id,
        logger=client.logger,
        faults=client.faults,
        on_step=lambda report: _progress_line(report, printer),
        on_wait=printer.say,
    )


@app.command()
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
    as_json: ProgressJsonOption = False,
) -> None:
    """Start a run and work it in the foreground until it is done, waiting or failed, with a
    line per step. With only --run-id, continue that run (after an approval, say)."""
    from ratchet.cli.progress import ProgressPrinter
    from ratchet.state import RunStatus

    _require_local_store("run")
    continuing = run_id is not None and goal is None and scenario is None and agent is None
    if continuing and run_id is not None and _exists(run_id):
        state = None
    else:
        state = _new_run(
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
        )
    client = _client(create=True)
    try:
        if state is not None:
            state = _with_approval_timeout(state, approval_timeout)
        if state is not None and not client.create(state).created:
            err.print(f"run {state.run_id} already exists; resuming it")
        worked_id = state.run_id if state is not None else run_id
        assert worked_id is not None
        with ProgressPrinter(as_json=as_json) as printer:
            _work_showing_progress(client, worked_id, printer)
        final = client.head(worked_id)
        link = (
            _approval_link(client.runtime, final.run_id)
            if final.status is RunStatus.WAITING
            else None
        )
    finally:
        client.close()
    if as_json:
        _print_json({**status_payload(final), "approval_link": link})
        if final.status is RunStatus.FAILED:
            raise typer.Exit(1)
        return
    _say(f"{final.run_id}: {_status_text(final)}")
    if final.summary:
        _say(final.summary, lines=True)
    if final.status is RunStatus.WAITING and final.waiting:
        _say(f"Waiting for a person: {final.waiting.request.prompt}")
        _say(f"Approve or reject at: {link}  (serve it with: ratchet serve)")
        _say(f"or decide here: ratchet approve {final.run_id}  /  ratchet reject {final.run_id}")
    if final.status is RunStatus.FAILED:
        _say(f"run failed: {final.error}", console=err)
        raise typer.Exit(1)


@app.command()
def worker(
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Exit 0 once no run is runnable.")
    ] = False,
    worker_id: Annotated[str | None, typer.Option("--worker-id", help="Default: host:pid.")] = None,
    lease_seconds: Annotated[
        float,
        typer.Option(
            "--lease-seconds",
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
    import signal

    from ratchet.adapters.sqlite.leases import check_lease_seconds
    from ratchet.cli.progress import ProgressPrinter
    from ratchet.faults import FaultPlan
    from ratchet.worker import Worker, check_worker_id

    _require_local_store("worker")
    # Before the store is opened (and made): a bad value must leave nothing behind.
    check_lease_seconds(lease_seconds, name="--lease-seconds")
    worker_id = check_worker_id(worker_id) if worker_id is not None else _cli_worker_id()
    runtime = _runtime(create=True)
    logger = _logger()
    engine = runtime.engine(
        worker_id=worker_id, logger=logger, faults=FaultPlan.parse(runtime.settings.fault)
    )

    printer = ProgressPrinter(as_json=as_json)

    def announce(run_id: str) -> None:
        printer.say(
            f"{run_id} waits for a person; approve or reject at: {_approval_link(runtime, run_id)}"
        )

    work = Worker(
        engine,
        runtime.leases,
        logger,
        lease_seconds=lease_seconds,
        on_park=announce,
        on_step=lambda report: _progress_line(report, printer),
        on_wait=printer.say,
        expire_approvals=runtime.approval_expiry(engine),
    )
    signal.signal(signal.SIGTERM, lambda *_: work.stop.set())
    try:
        with printer:
            work.run(until_idle=until_idle)
    except KeyboardInterrupt:
        work.stop.set()
    finally:
        runtime.close()
    logger.info("worker stopped", extra={"worker_id": work.worker_id})


# --- reading ---------------------------------------------------------------------------------


def _status_text(state: RunState) -> str:
    """`done at step 7`, `failed at step 3`, `stopped at step 60: Stopped at the cap...`."""
    from ratchet.state import RunStatus

    if state.status is RunStatus.FAILED:
        return f"failed at step {state.next_step}"
    said = f"{state.status.value} at step {state.step}"
    if state.status is RunStatus.STOPPED and state.summary:
        said += f": {state.summary}"
    return said


def status_payload(state: RunState) -> dict[str, Any]:
    """What `ratchet status --json` prints of `state`."""
    from ratchet.cli.readout import status_payload as payload_of

    return payload_of(state.model_dump(mode="json"))


# A SQLite store's read commands are answered by `ratchet.cli.quick` before this module loads;
# these answer for any store, through the same `ratchet.cli.readout`.


@app.command()
def status(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """Where a run stands, with its token usage and estimated cost."""
    from ratchet.cli.readout import json_text, status_text

    client = _client(create=False, logs=False)
    try:
        payload = status_payload(client.head(run_id))
    finally:
        client.close()
    sys.stdout.write(json_text(payload) if as_json else status_text(payload))


@app.command()
def history(
    run_id: RunArgument,
    as_json: JsonOption = False,
    after: Annotated[
        int,
        typer.Option(
            "--after", min=0, help="Only the checkpoints of a later version (the last you read)."
        ),
    ] = 0,
    last: Annotated[
        int | None,
        typer.Option("--last", min=1, max=MAX_ROWS, help="Only the last N checkpoints."),
    ] = None,
) -> None:
    """One row per checkpoint: what happened (in words), the tool, its arguments and result,
    who decided, worker, bytes, time, model tokens. Versions without a row are explained."""
    from ratchet.cli.readout import (
        history_payload,
        history_row,
        history_text,
        history_window,
        json_text,
        terminal_width,
    )

    client = _client(create=False, logs=False)
    try:
        every = [
            history_row(c.model_dump(mode="json")) for c in client.history(run_id, after=after)
        ]
        head_version = client.head(run_id).version
    finally:
        client.close()
    rows, first = history_window(every, after=after, last=last)
    if as_json:
        sys.stdout.write(json_text(history_payload(run_id, rows, head_version, first=first)))
    else:
        width = terminal_width()
        sys.stdout.write(history_text(rows, head_version, first=first, width=width))


@app.command("list")
def list_runs(
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            callback=_not_empty,
            help="Only runs in this status (running, waiting, done, failed, stopped, cancelled).",
        ),
    ] = None,
    as_json: JsonOption = False,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, max=MAX_ROWS, help="Only the N most recently updated."),
    ] = None,
) -> None:
    """Every run in the store, most recently updated first."""
    from ratchet.cli.readout import json_text, list_text, listed

    client = _client(create=False, logs=False)
    try:
        rows = [listed(r.model_dump(mode="json")) for r in client.runs(status=status)][:limit]
    finally:
        client.close()
    sys.stdout.write(json_text({"runs": rows}) if as_json else list_text(rows))


# --- following -------------------------------------------------------------------------------


@app.command()
def watch(
    run_id: RunArgument,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per checkpoint.")
    ] = False,
    interval: Annotated[
        float,
        typer.Option("--interval", help="Seconds between reads of the store.", min=0.01, max=60),
    ] = 0.2,
) -> None:
    """Follow a run: a line per checkpoint, from the first, until the run is done, stopped,
    cancelled, failed or waiting for a person. Exit 1 if it failed, else 0."""
    import time

    from ratchet.cli.progress import ProgressPrinter, line_of_checkpoint
    from ratchet.state import RunStatus

    client = _client(create=False, logs=False)
    printed = 0
    seen_version = 0
    try:
        with ProgressPrinter(as_json=as_json) as printer:
            while True:
                head = client.head(run_id)
                if head.version != seen_version:
                    # Only what was written since the last read: one range read a poll.
                    for checkpoint in client.history(run_id, after=printed):
                        before = printer.before(run_id)
                        params = head.options.params
                        printer.show(line_of_checkpoint(run_id, checkpoint, params, before))
                        printed = checkpoint.version
                    seen_version = head.version
                if head.status is not RunStatus.RUNNING:
                    break
                time.sleep(interval)
    finally:
        client.close()
    if head.status is RunStatus.FAILED:
        raise typer.Exit(1)


@app.command()
def show(
    run_id: RunArgument,
    step: Annotated[
        int | None,
        typer.Option("--step", help="Show the state as of this step.", min=0, max=MAX_STEPS),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The run's state, now or as of the checkpoint of an earlier step."""
    client = _client(create=False)
    try:
        state = client.head(run_id) if step is None else client.state_at(run_id, step=step)
    finally:
        client.close()
    payload = state.model_dump(mode="json")
    if as_json:
        _print_json(payload)
    else:
        from ratchet.untrusted import json_for_terminal

        # Rich writes JSON with text as it is; JSON escapes the C0 controls, and where the
        # state holds DEL, C1 or bidirectional controls, everything but ASCII is escaped.
        text = json.dumps(payload, ensure_ascii=False)
        out.print_json(data=payload, ensure_ascii=json_for_terminal(text) != text)


# --- deciding --------------------------------------------------------------------------------


def _decide(
    run_id: str, *, approved: bool, by: str, comment: str, answer: str | None = None
) -> None:
    """Decide through the run's open approval request, so its links and page show the
    decision; a run parked by a worker that died before opening one is decided directly."""
    from ratchet.approvals.answers import parse_answer_json

    client = _client(create=False)
    try:
        if approved:
            given = parse_answer_json(answer) if answer is not None else None
            client.approve(run_id, by=by, comment=comment, answer=given)
        else:
            client.reject(run_id, by=by, comment=comment)
    finally:
        client.close()


def _approval_link(runtime: Any, run_id: str) -> str:
    """The operator's own link to the run's approval page (opening the request, and writing
    its messages to the outbox, if no one has yet)."""
    desk = runtime.approval_desk(worker_id=_cli_worker_id(), logger=_logger())
    opened = desk.open(
        run_id,
        timeout_seconds=runtime.settings.approval_timeout_seconds,
        operator=_operator(),
    )
    return str(desk.link(opened.approval, _operator()))


def _operator() -> str:
    """Who runs this command, as the local approval links name them."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local operator"


ByOption = Annotated[
    str | None,
    typer.Option("--by", callback=_not_empty, help="Who decides (default: your user name)."),
]


@app.command()
def approve(
    run_id: RunArgument,
    comment: Annotated[str, typer.Option("--comment", help="A note for the record.")] = "",
    by: ByOption = None,
    answer: Annotated[
        str | None,
        typer.Option(
            "--answer",
            help='The answer, as a JSON object, when the run asks for one ({"amount": 120}).',
        ),
    ] = None,
) -> None:
    """Approve what a waiting run asked for; the next free worker resumes it."""
    _require_local_store("approve")
    _decide(run_id, approved=True, by=by or getpass.getuser(), comment=comment, answer=answer)
    out.print(f"{run_id}: approved; it resumes on the next free worker")


@app.command()
def reject(
    run_id: RunArgument,
    reason: Annotated[str, typer.Option("--reason", help="Why, for the record.")] = "",
    by: ByOption = None,
) -> None:
    """Reject what a waiting run asked for; the run goes on knowing the answer was no."""
    _require_local_store("reject")
    _decide(run_id, approved=False, by=by or getpass.getuser(), comment=reason)
    out.print(f"{run_id}: rejected; it resumes on the next free worker")


@app.command()
def link(run_id: RunArgument) -> None:
    """Print your approval link for a waiting run (open it with `ratchet serve` running)."""
    _require_local_store("link")
    runtime = _runtime(create=False)
    try:
        _head(runtime, run_id)
        out.print(_approval_link(runtime, run_id))
    finally:
        runtime.close()


@app.command()
def serve(
    port: Annotated[
        int, typer.Option("--port", help="Port (0: any free one).", min=0, max=65535)
    ] = 8765,
    host: Annotated[
        str, typer.Option("--host", callback=_not_empty, help="Interface to listen on.")
    ] = "127.0.0.1",
) -> None:
    """Serve the approval pages and the runs API locally (as the deployed API does), and the
    runs dashboard at /dashboard."""
    from ratchet.adapters.slack import SlackResponder
    from ratchet.runtime.local import LocalRuntime
    from ratchet.runtime.runs_api import local_runs_services
    from ratchet.web.approvals import ApprovalServices, build_app
    from ratchet.web.dashboard import local_app as dashboard_app
    from ratchet.web.runs import build_app as build_runs_app
    from ratchet.web.serve import server

    _require_local_store("serve")
    # The server runs the app on a thread of its own, one request at a time.
    runtime = LocalRuntime.open(_settings(), create=True, any_thread=True)
    logger = _logger()
    secret = runtime.settings.slack_signing_secret
    services = ApprovalServices(
        desk=runtime.approval_desk(worker_id=f"serve:{_cli_worker_id()}", logger=logger),
        slack_signing_secret=secret,
        slack_responder=SlackResponder() if secret else None,
        logger=logger,
    )
    approvals = build_app(lambda: services)
    runs = local_runs_services(runtime, worker_id=f"serve:{_cli_worker_id()}", logger=logger)
    routes = [
        ("/approvals/", approvals),
        ("/slack/", approvals),
        ("/runs", build_runs_app(lambda: runs)),
        ("/dashboard", dashboard_app(runs.client, services.desk, operator=_operator())),
    ]
    httpd = server(routes, host=host, port=port)
    out.print(f"Serving approvals on http://{host}:{httpd.server_port}")
    out.print(f"The runs dashboard: http://{host}:{httpd.server_port}/dashboard")
    out.print(f"Approval links point at {runtime.settings.public_url} (RATCHET_PUBLIC_URL)")
    import signal

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        runtime.close()


@app.command()
def verify(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """Check the run's invariants (for migration: rows, duplicates, emails). Exit 1 if not ok."""
    client = _client(create=False)
    try:
        payload: dict[str, Any] = {"run_id": run_id, **client.verify(run_id)}
    finally:
        client.close()
    if as_json:
        _print_json(payload)
    else:
        for name, value in payload.items():
            _say(f"{name:>16}  {value}")
    if not payload.get("ok"):
        raise typer.Exit(1)


# --- housekeeping ----------------------------------------------------------------------------

DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Report what would change; change nothing.")
]


def _local_store(command: str, *, write: bool) -> Any:
    """The local runtime of a command that works on the store itself. A missing store is an
    error, never made here; one an older Ratchet made gets today's tables before a write."""
    _require_local_store(command)
    runtime = _runtime(create=False)
    if write:
        runtime.close()
        runtime = _runtime(create=True)
    return runtime


@app.command()
def migrate(dry_run: DryRunOption = False, as_json: JsonOption = False) -> None:
    """Upgrade every stored head to the current state schema, each under its version check,
    and report per schema version. Exit 1 if a run cannot be read or upgraded."""
    from ratchet.adapters.sqlite.store import SqliteHousekeeping
    from ratchet.housekeeping import migrate as migrate_heads

    runtime = _local_store("migrate", write=not dry_run)
    try:
        report = migrate_heads(SqliteHousekeeping(runtime.db), dry_run=dry_run)
    finally:
        runtime.close()
    if as_json:
        _print_json(report.to_json())
    else:
        verb = "would upgrade" if dry_run else "upgraded"
        done = {"upgrade", "upgraded"}
        count = sum(run.outcome in done for run in report.runs)
        note = " (dry run: nothing changed)" if dry_run else ""
        out.print(
            f"{verb} {count} of {len(report.runs)} runs to schema {report.schema_version}{note}"
        )
        for version, outcomes in report.by_version().items():
            counts = ", ".join(f"{n} {name}" for name, n in outcomes.items() if name != "runs")
            out.print(f"  schema {version}: {outcomes['runs']} runs: {counts}")
        for run in report.runs:
            if run.outcome != "current":
                line = f"  {run.run_id}  schema {run.from_version or '?'}  {run.outcome}"
                _say(line + (f"  {run.reason}" if run.reason else ""))
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def gc(
    older_than: Annotated[
        int | None,
        typer.Option(
            "--older-than",
            min=0,
            max=36_500,
            metavar="DAYS",
            help="Required. Trim finished runs whose last change is older than this many days.",
            show_default=False,
        ),
    ] = None,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Delete the old step records and ledger entries of finished runs past the retention, and
    blobs nothing references. Running and waiting runs are never touched; a finished run keeps
    what loading it reads (its head and its window's records)."""
    from datetime import timedelta

    from ratchet.adapters.sqlite.store import SqliteHousekeeping
    from ratchet.housekeeping import collect_garbage
    from ratchet.state import utcnow

    if older_than is None:
        raise InvalidInput("ratchet gc needs --older-than DAYS (see: ratchet gc --help)")
    runtime = _local_store("gc", write=not dry_run)
    try:
        report = collect_garbage(
            SqliteHousekeeping(runtime.db),
            Path(f"{runtime.root}.blobs"),
            older_than=timedelta(days=older_than),
            now=utcnow(),
            dry_run=dry_run,
        )
    finally:
        runtime.close()
    payload = report.to_json()
    if as_json:
        _print_json(payload)
        return
    verb = "would delete" if dry_run else "deleted"
    out.print(
        f"{verb} {payload['records_deleted']} records and {payload['ledger_entries_deleted']} "
        f"ledger entries of {payload['runs_trimmed']} finished runs older than {older_than} "
        f"days, and {payload['blobs_deleted']} blobs ({payload['blob_bytes_deleted']:,} bytes)"
    )
    out.print(
        f"kept {payload['blobs_kept']} blobs; left {payload['live_runs']} running or waiting "
        f"runs and {payload['recent_runs']} recent finished runs untouched"
    )
    for run_id in report.skipped:
        out.print(f"  {run_id}  skipped: it changed while gc ran", markup=False)
    for run_id, reason in report.unreadable.items():
        _say(f"  {run_id}  unreadable, left as it is: {reason}")


@app.command()
def demo(
    batches: Annotated[
        int, typer.Option("--batches", min=24, max=MAX_BATCHES, help="Batches to copy.")
    ] = 40,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the demo's store and print where it is.")
    ] = False,
) -> None:
    """The offline demo: a migration agent survives SIGKILL mid-step and waits for approval."""
    from ratchet.cli.demo import run_demo

    _require_local_store("demo")
    raise typer.Exit(run_demo(out, batches=batches, keep=keep))


# --- steering: retry, cancel, fork, replay -----------------------------------------------------

WhoOption = Annotated[
    str | None,
    typer.Option("--by", callback=_not_empty, help="Who does it (default: your user name)."),
]


@app.command()
def retry(run_id: RunArgument, by: WhoOption = None) -> None:
    """Give a failed run fresh attempts at the step that failed, from its last checkpoint."""
    _require_local_store("retry")
    client = _client(create=False)
    try:
        run = client.retry(run_id, by=by or _operator())
    finally:
        client.close()
    out.print(
        f"{run.run_id}: retried at step {run.step + 1}; the next free worker takes it "
        f"(or: ratchet run --run-id {run.run_id})",
        markup=False,
    )


@app.command()
def cancel(
    run_id: RunArgument,
    reason: Annotated[str, typer.Option("--reason", help="Why, for the record.")] = "",
    by: WhoOption = None,
) -> None:
    """End a running or waiting run as cancelled, keeping its checkpoints."""
    _require_local_store("cancel")
    client = _client(create=False)
    try:
        run = client.cancel(run_id, reason=reason, by=by or _operator())
    finally:
        client.close()
    out.print(f"{run.run_id}: cancelled at step {run.step}", markup=False)


@app.command()
def fork(
    run_id: RunArgument,
    from_step: Annotated[
        int,
        typer.Option("--from-step", min=0, max=MAX_STEPS, help="The step to start from."),
    ],
    new_run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id", callback=_not_empty, help="The new run's id (default: RUN-fork-<random>)."
        ),
    ] = None,
) -> None:
    """Start a new run from the state of RUN as of a step; RUN is untouched."""
    _require_local_store("fork")
    client = _client(create=True)
    try:
        run = client.fork(run_id, from_step=from_step, run_id=new_run_id)
    finally:
        client.close()
    out.print(
        f"{run.run_id}: forked from {run_id} at step {from_step}, {run.status.value}; the next "
        f"free worker takes it (or: ratchet run --run-id {run.run_id})",
        markup=False,
    )


@app.command()
def replay(
    run_id: RunArgument,
    step: Annotated[
        int, typer.Option("--step", min=1, max=MAX_STEPS, help="The step whose prompt to show.")
    ],
    as_json: JsonOption = False,
) -> None:
    """Print the exact prompt a step's model saw, rendered from the recorded state."""
    client = _client(create=False)
    try:
        prompt = client.replay(run_id, step=step)
    finally:
        client.close()
    if as_json:
        _print_json({"run_id": run_id, "step": step, "prompt": prompt})
    else:
        from ratchet.untrusted import for_terminal

        shown = for_terminal(prompt, lines=True)
        sys.stdout.write(shown if shown.endswith("\n") else shown + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point. Bad input of any kind (a usage error, text that is not UTF-8, a value out
    of range, a store that is not Ratchet's) is one line on stderr and exit code 2; an agent
    module interrupted while it is imported is one line and exit code 130; a worker that must
    stop beside a call it abandoned (nothing the user typed was wrong) is one line and exit 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        _check_text(args)
        code = app(args=args, prog_name="ratchet", standalone_mode=False)
    except NoArgsIsHelpError as error:
        error.show()
        sys.exit(2)
    except UsageError as error:
        _refuse(_usage_line(error))
    except typer.Abort:
        _refuse("aborted", code=1)
    except ImportInterrupted as error:
        _refuse(str(error), code=130)
    except AbandonedCallRunning as error:
        _refuse(str(error), code=1)
    except RatchetError as error:
        _refuse(str(error))
    sys.exit(code if isinstance(code, int) else 0)


def _refuse(message: str, *, code: int = 2) -> NoReturn:
    _say(f"ratchet: {' '.join(message.split())}", console=err)
    sys.exit(code)


def _say(text: str, *, console: Console = out, lines: bool = False) -> None:
    """Print a line that may hold stored or tool-given text: never as rich markup, and with
    every control character escaped (`ratchet.untrusted.for_terminal`)."""
    from ratchet.untrusted import for_terminal

    console.print(for_terminal(text, lines=lines), markup=False)


_NOT_UTF8 = re.compile("[\ud800-\udfff]")


def _check_text(args: Sequence[str]) -> None:
    """Refuse an argument that is not UTF-8 before any command runs. Python decodes such
    bytes as lone surrogates, which no store, log line or terminal can take."""
    for index, arg in enumerate(args):
        if not _NOT_UTF8.search(arg):
            continue
        name, equals, value = arg.partition("=")
        if arg.startswith("--") and equals:
            what, arg = name, value
        elif index > 0 and args[index - 1].startswith("-") and "=" not in args[index - 1]:
            what = args[index - 1]
        else:
            what = f"argument {index + 1}"
        raise InvalidInput(f"{what} is not valid UTF-8: {os.fsencode(arg)!r}")


def _usage_line(error: UsageError) -> str:
    """Click's usage error in one line: what is wrong, the range of a number out of it, and
    where to read the usage."""
    message = error.format_message()
    param = getattr(error, "param", None)
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if low is not None and high is not None:
        kind = "a number" if isinstance(low, float) or isinstance(high, float) else "a whole number"
        hint = "/".join(getattr(param, "opts", [])) or getattr(param, "name", "the value")
        got = _bad_input(error)
        message = f"{hint} must be {kind} from {low:g} to {high:g}" + (
            f", not {got!r}" if got is not None else ""
        )
    command = error.ctx.command_path if error.ctx is not None else "ratchet"
    return f"{message} (see: {command} --help)"


def _bad_input(error: UsageError) -> Any:
    cause = error.__cause__
    errors = getattr(cause, "errors", None)
    if callable(errors):
        found = errors()
        if found and "input" in found[0]:
            return found[0]["input"]
    return None
