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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar
from urllib.parse import parse_qs, urlsplit

import typer
from rich.console import Console
from rich.table import Table

# Typer vendors click; its usage errors are only importable from the vendored package.
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from ratchet.errors import InvalidInput, RatchetError, RunNotFound
from ratchet.local.leases import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from ratchet.runs import MAX_BATCHES, MAX_STEPS, MAX_TOOL_LATENCY_MS, check_run_id
from ratchet.state import RunState, RunStatus

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
    from ratchet.local.runtime import LocalSettings

    settings = LocalSettings.from_env()
    chosen = store or _Globals.store
    return settings.model_copy(update={"store": chosen}) if chosen else settings


def _runtime(*, create: bool, store: str | None = None) -> Any:
    from ratchet.local.runtime import LocalRuntime

    settings = _settings(store)
    if settings.store.startswith(DYNAMODB_SCHEME):
        return _aws_runtime(DynamoDbStore.parse(settings.store))
    return LocalRuntime.open(settings, create=create)


# --- the tables of a deployed stack ------------------------------------------------------------

DYNAMODB_SCHEME = "dynamodb://"
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_DYNAMODB_PARAMETERS = {"ledger", "app", "region", "endpoint"}
_DYNAMODB_FORM = "dynamodb://TABLE?ledger=TABLE&app=TABLE&region=REGION[&endpoint=URL]"


@dataclass(frozen=True)
class DynamoDbStore:
    """A `dynamodb://` store URL, parsed and checked before any client is made."""

    checkpoints: str
    ledger: str
    app: str
    region: str | None = None
    endpoint: str | None = None

    @classmethod
    def parse(cls, url: str) -> DynamoDbStore:
        parts = urlsplit(url)
        try:
            query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError:
            raise InvalidInput(f"malformed store URL {url!r}: use {_DYNAMODB_FORM}") from None
        unknown = sorted(set(query) - _DYNAMODB_PARAMETERS)
        if unknown:
            raise InvalidInput(
                f"unknown parameter {unknown[0]!r} in store URL {url!r}: use {_DYNAMODB_FORM}"
            )
        repeated = sorted(name for name, values in query.items() if len(values) > 1)
        if repeated:
            raise InvalidInput(f"parameter {repeated[0]!r} is given twice in store URL {url!r}")
        values = {name: found[0] for name, found in query.items()}
        tables = {
            "checkpoints table (dynamodb://TABLE)": parts.netloc,
            "ledger table (ledger=TABLE)": values.get("ledger", ""),
            "app table (app=TABLE)": values.get("app", ""),
        }
        for name, table in tables.items():
            if not _TABLE_NAME.fullmatch(table):
                raise InvalidInput(
                    f"store URL {url!r} needs a valid {name} (3-255 letters, digits, '_', '-' "
                    f"or '.'): use {_DYNAMODB_FORM}"
                )
        region = values.get("region") or None
        if region is not None and not _REGION.fullmatch(region):
            raise InvalidInput(f"malformed region {region!r} in store URL {url!r}")
        endpoint = values.get("endpoint") or None
        if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
            raise InvalidInput(f"the endpoint in store URL {url!r} must be an http(s) URL")
        if parts.path not in ("", "/") or parts.fragment:
            raise InvalidInput(f"malformed store URL {url!r}: use {_DYNAMODB_FORM}")
        return cls(parts.netloc, values["ledger"], values["app"], region, endpoint)


def _aws_runtime(store: DynamoDbStore) -> Any:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    from ratchet.aws.runtime import AwsRuntime
    from ratchet.aws.settings import AwsSettings

    # A person is waiting on the command: a few quick retries, then a clear error.
    config = Config(
        retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=20
    )
    try:
        client = boto3.client(
            "dynamodb", region_name=store.region, endpoint_url=store.endpoint, config=config
        )
    except NoRegionError:
        raise InvalidInput(
            "the dynamodb:// store needs a region: add &region=REGION to the URL or set AWS_REGION"
        ) from None
    settings = AwsSettings(
        checkpoints_table=store.checkpoints, idempotency_table=store.ledger, app_table=store.app
    )
    return AwsRuntime(settings, client)


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
}


def _require_local_store(command: str) -> None:
    """The commands that write work on a local store only; refuse before touching anything."""
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
    sys.stdout.write(json.dumps(payload, default=str, ensure_ascii=False) + "\n")


# --- starting and working --------------------------------------------------------------------


def _new_run(
    *,
    goal: str | None,
    scenario: str | None,
    agent_ref: str | None,
    run_id: str | None,
    model: str | None,
    max_steps: int | None,
    batches: int | None,
    tool_latency_ms: int | None,
    notify: list[str] | None = None,
    notify_slack: str | None = None,
) -> RunState:
    """Validate everything about a new run before anything touches the store. Refusals
    name the CLI's flags (the API names the same fields as JSON fields)."""
    from pydantic import ValidationError

    from ratchet.runs import (
        CLI_FLAGS,
        RunRequest,
        RunRequestInvalid,
        check_run_id,
        new_run,
        request_problems,
    )

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
            batches=batches,
            tool_latency_ms=tool_latency_ms,
            notify={"email": notify or [], "slack_channel": notify_slack}
            if notify or notify_slack
            else None,
        )
    except ValidationError as error:
        field, message = request_problems(error)[0]
        flag = CLI_FLAGS.get(field) or CLI_FLAGS.get(field.rsplit(".", 1)[0], field)
        raise InvalidInput(f"{flag}: {message}") from None
    try:
        return new_run(request, has_anthropic_key=_settings().anthropic_api_key is not None)
    except RunRequestInvalid as refused:
        raise InvalidInput(refused.for_cli()) from None


def _start(state: RunState) -> bool:
    from ratchet.runs import create_run

    runtime = _runtime(create=True)

    def prepare_locked(agent: str, hook: str, call: Callable[[], None]) -> None:
        # Take the store's write lock once before prepare writes the run's data: a store that
        # another process holds refuses the start here, with nothing written. The run does
        # not exist yet: a prepare that fails leaves no run behind (whatever it wrote in the
        # run's data folder before failing stays; prepare is idempotent).
        with runtime.db.write():
            pass
        _call_hook(agent, hook, call)

    try:
        return create_run(
            runtime,
            state,
            worker_id=_cli_worker_id(),
            logger=_logger(),
            run_hook=prepare_locked,
        )
    finally:
        runtime.close()


_Result = TypeVar("_Result")


def _call_hook(agent: str, hook: str, call: Callable[[], _Result]) -> _Result:
    """Run an agent's own code: whatever it raises (even `sys.exit`) is one line naming the
    agent and the hook, not a traceback."""
    try:
        return call()
    except RatchetError:
        raise
    except (Exception, SystemExit) as error:
        reason = " ".join(str(error).split())
        raise RatchetError(
            f"agent {agent!r}: its {hook} hook failed: {type(error).__name__}: {reason}"
        ) from None


def _logger() -> Any:
    from ratchet.observability import json_logger

    return json_logger(sys.stderr, level=_settings().log_level)


def _cli_worker_id() -> str:
    from ratchet.local.runtime import default_worker_id

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
        help="'scripted' (offline) or a Claude model; default Claude when ANTHROPIC_API_KEY "
        "is set, else scripted.",
    ),
]
MaxStepsOption = Annotated[
    int | None,
    typer.Option("--max-steps", help="Step cap (default 60).", min=1, max=MAX_STEPS),
]
BatchesOption = Annotated[
    int | None,
    typer.Option(
        "--batches", help="Migration: number of 1,000-row batches.", min=1, max=MAX_BATCHES
    ),
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
    typer.Option(
        "--tool-latency-ms",
        help="Slow every tool call down.",
        min=0,
        max=MAX_TOOL_LATENCY_MS,
    ),
]


@app.command()
def start(
    goal: GoalOption = None,
    scenario: ScenarioOption = None,
    run_id: RunIdOption = None,
    agent: AgentOption = None,
    model: ModelOption = None,
    max_steps: MaxStepsOption = None,
    batches: BatchesOption = None,
    tool_latency_ms: LatencyOption = None,
    notify: NotifyOption = None,
    notify_slack: NotifySlackOption = None,
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
        batches=batches,
        tool_latency_ms=tool_latency_ms,
        notify=notify,
        notify_slack=notify_slack,
    )
    created = _start(state)
    out.print(state.run_id)
    if not created:
        err.print(f"run {state.run_id} already exists; nothing changed")


@app.command()
def run(
    goal: GoalOption = None,
    scenario: ScenarioOption = None,
    run_id: RunIdOption = None,
    agent: AgentOption = None,
    model: ModelOption = None,
    max_steps: MaxStepsOption = None,
    batches: BatchesOption = None,
    tool_latency_ms: LatencyOption = None,
    notify: NotifyOption = None,
    notify_slack: NotifySlackOption = None,
) -> None:
    """Start a run and work it in the foreground until it is done, waiting or failed."""
    from ratchet.faults import FaultPlan
    from ratchet.local.worker import Worker

    _require_local_store("run")
    state = _new_run(
        goal=goal,
        scenario=scenario,
        agent_ref=agent,
        run_id=run_id,
        model=model,
        max_steps=max_steps,
        batches=batches,
        tool_latency_ms=tool_latency_ms,
        notify=notify,
        notify_slack=notify_slack,
    )
    if not _start(state):
        err.print(f"run {state.run_id} already exists; resuming it")
    runtime = _runtime(create=True)
    try:
        engine = runtime.engine(
            worker_id=_cli_worker_id(),
            logger=_logger(),
            faults=FaultPlan.parse(runtime.settings.fault),
        )
        Worker(engine, runtime.leases, _logger()).run(until_idle=True, run_id=state.run_id)
        final = _head(runtime, state.run_id)
        link = _approval_link(runtime, final.run_id) if final.status is RunStatus.WAITING else None
    finally:
        runtime.close()
    out.print(f"{final.run_id}: {final.status.value} at step {final.step}")
    if final.summary:
        out.print(final.summary)
    if final.status is RunStatus.WAITING and final.waiting:
        out.print(f"Waiting for a person: {final.waiting.request.prompt}")
        out.print(f"Approve or reject at: {link}  (serve it with: ratchet serve)")
        out.print(
            f"or decide here: ratchet approve {final.run_id}  /  ratchet reject {final.run_id}"
        )
    if final.status is RunStatus.FAILED:
        err.print(f"run failed: {final.error}")
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
) -> None:
    """Claim runnable runs and advance them; SIGTERM stops after the current step."""
    import signal

    from ratchet.faults import FaultPlan
    from ratchet.local.leases import check_lease_seconds
    from ratchet.local.worker import Worker, check_worker_id

    _require_local_store("worker")
    # Before the store is opened (and made): a bad value must leave nothing behind.
    check_lease_seconds(lease_seconds, name="--lease-seconds")
    worker_id = check_worker_id(worker_id) if worker_id is not None else _cli_worker_id()
    runtime = _runtime(create=True)
    logger = _logger()
    engine = runtime.engine(
        worker_id=worker_id, logger=logger, faults=FaultPlan.parse(runtime.settings.fault)
    )

    def announce(run_id: str) -> None:
        out.print(
            f"{run_id} waits for a person; approve or reject at: {_approval_link(runtime, run_id)}"
        )

    work = Worker(engine, runtime.leases, logger, lease_seconds=lease_seconds, on_park=announce)
    signal.signal(signal.SIGTERM, lambda *_: work.stop.set())
    try:
        work.run(until_idle=until_idle)
    except KeyboardInterrupt:
        work.stop.set()
    finally:
        runtime.close()
    logger.info("worker stopped", extra={"worker_id": work.worker_id})


# --- reading ---------------------------------------------------------------------------------


def status_payload(state: RunState) -> dict[str, Any]:
    return {
        "run_id": state.run_id,
        "status": state.status.value,
        "step": state.step,
        "version": state.version,
        "attempts": state.attempts,
        "summary": state.summary,
        "error": state.error,
        "agent": state.agent,
        "model": state.options.model,
        "max_steps": state.options.max_steps,
        "waiting": state.waiting.request.prompt if state.waiting else None,
        "updated_at": state.updated_at.isoformat(),
    }


@app.command()
def status(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """Where a run stands."""
    runtime = _runtime(create=False)
    try:
        payload = status_payload(_head(runtime, run_id))
    finally:
        runtime.close()
    if as_json:
        _print_json(payload)
        return
    for name, value in payload.items():
        if value is not None:
            out.print(f"{name:>10}  {value}")


@app.command()
def history(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """One row per checkpoint: version, step, status, worker, bytes, time."""
    runtime = _runtime(create=False)
    try:
        _head(runtime, run_id)
        checkpoints = runtime.store.list_checkpoints(run_id)
    finally:
        runtime.close()
    rows = [
        {
            "version": c.version,
            "step": c.step,
            "status": c.status.value,
            "event": c.event.kind,
            "worker": c.worker_id,
            "bytes": c.size,
            "time": c.created_at.isoformat(),
        }
        for c in checkpoints
    ]
    if as_json:
        _print_json({"run_id": run_id, "checkpoints": rows})
        return
    table = Table("version", "step", "status", "event", "worker", "bytes", "time")
    for row in rows:
        table.add_row(*(str(row[k]) for k in row))
    out.print(table)


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
    from ratchet.engine.transitions import replay

    runtime = _runtime(create=False)
    try:
        state = _head(runtime, run_id)
        if step is not None:
            checkpoints = runtime.store.list_checkpoints(run_id)
            last = max((c.version for c in checkpoints if c.step == step), default=None)
            if last is None:
                raise InvalidInput(f"run {run_id} has no checkpoint at step {step}")
            rebuilt = replay(c for c in checkpoints if c.version <= last)
            assert rebuilt is not None
            state = rebuilt
    finally:
        runtime.close()
    payload = state.model_dump(mode="json")
    if as_json:
        _print_json(payload)
    else:
        out.print_json(data=payload)


# --- deciding --------------------------------------------------------------------------------


def _decide(run_id: str, *, approved: bool, by: str, comment: str) -> RunState:
    """Decide through the run's open approval request, so its links and page show the
    decision; a run parked by a worker that died before opening one is decided directly."""
    from ratchet.approvals.model import Verdict
    from ratchet.errors import ApprovalNotFound

    runtime = _runtime(create=False)
    try:
        _head(runtime, run_id)
        try:
            verdict = Verdict(approved=approved, by=by, comment=comment)
        except ValueError as error:
            raise InvalidInput(f"bad decision: {_first_problem(error)}") from None
        desk = runtime.approval_desk(worker_id=_cli_worker_id(), logger=_logger())
        try:
            desk.decide_run(run_id, verdict, channel="cli")
        except ApprovalNotFound:
            engine = runtime.engine(worker_id=_cli_worker_id(), logger=_logger())
            engine.decide_waiting(run_id, approved=approved, by=by, comment=comment)
        return _head(runtime, run_id)
    finally:
        runtime.close()


def _first_problem(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(error)


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
) -> None:
    """Approve what a waiting run asked for; the next free worker resumes it."""
    _require_local_store("approve")
    state = _decide(run_id, approved=True, by=by or getpass.getuser(), comment=comment)
    out.print(f"{state.run_id}: approved; it resumes on the next free worker")


@app.command()
def reject(
    run_id: RunArgument,
    reason: Annotated[str, typer.Option("--reason", help="Why, for the record.")] = "",
    by: ByOption = None,
) -> None:
    """Reject what a waiting run asked for; the run goes on knowing the answer was no."""
    _require_local_store("reject")
    state = _decide(run_id, approved=False, by=by or getpass.getuser(), comment=reason)
    out.print(f"{state.run_id}: rejected; it resumes on the next free worker")


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
    """Serve the approval pages and the runs API locally (as the deployed API does)."""
    from ratchet.adapters.slack import SlackResponder
    from ratchet.handlers.api import build_app as build_runs_app
    from ratchet.handlers.approvals import ApprovalServices, build_app
    from ratchet.local.runs_api import local_runs_services
    from ratchet.local.serve import server

    _require_local_store("serve")
    runtime = _runtime(create=True)
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
    ]
    httpd = server(routes, host=host, port=port)
    out.print(f"Serving approvals on http://{host}:{httpd.server_port}")
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
    from ratchet.scenarios import load_agent

    runtime = _runtime(create=False)
    try:
        state = _head(runtime, run_id)
        agent = load_agent(state.agent)
        if agent.verify is None:
            payload: dict[str, Any] = {"ok": True, "note": f"agent {agent.name} has no checks"}
        else:
            context = runtime.context(run_id, state.options)
            check = agent.verify
            payload = _call_hook(agent.name, "verify", lambda: check(context, state))
            if not isinstance(payload, dict):
                raise RatchetError(
                    f"agent {agent.name!r}: its verify hook returned "
                    f"{type(payload).__name__}, not a dict"
                )
    finally:
        runtime.close()
    payload = {"run_id": run_id, **payload}
    if as_json:
        _print_json(payload)
    else:
        for name, value in payload.items():
            out.print(f"{name:>16}  {value}")
    if not payload.get("ok"):
        raise typer.Exit(1)


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
    from ratchet.local.demo import run_demo

    _require_local_store("demo")
    raise typer.Exit(run_demo(out, batches=batches, keep=keep))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point. Bad input of any kind (a usage error, text that is not UTF-8, a value out
    of range, a store that is not Ratchet's) is one line on stderr and exit code 2."""
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
    except RatchetError as error:
        _refuse(str(error))
    except Exception as error:
        if not _is_aws_error(error):
            raise
        _refuse(f"the store cannot be read: {error}")
    sys.exit(code if isinstance(code, int) else 0)


def _refuse(message: str, *, code: int = 2) -> NoReturn:
    err.print(f"ratchet: {' '.join(message.split())}", markup=False)
    sys.exit(code)


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


def _is_aws_error(error: Exception) -> bool:
    """A failure talking to AWS (missing table, no credentials, no connection). botocore is
    looked up, not imported: if no command imported it, the error cannot be one of its."""
    exceptions = sys.modules.get("botocore.exceptions")
    return exceptions is not None and isinstance(
        error, exceptions.BotoCoreError | exceptions.ClientError
    )


if __name__ == "__main__":
    main()
