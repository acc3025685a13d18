"""The `ratchet` command: start runs, work them, inspect them, decide on them, run the demo.

Bad input never ends in a traceback or a changed store: it is one line on stderr and exit
code 2. Read commands print one JSON object with `--json`.
"""

from __future__ import annotations

import getpass
import json
import sqlite3
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ratchet.errors import InvalidInput, RatchetError, RunNotFound
from ratchet.state import MAX_GOAL_BYTES, RUN_ID_PATTERN, RunOptions, RunState, RunStatus

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

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="RATCHET_STORE",
        help="Store URL. Default: sqlite:///.ratchet/ratchet.db",
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

    return LocalRuntime.open(_settings(store), create=create)


def _check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.fullmatch(run_id):
        raise InvalidInput(
            f"malformed run id {run_id!r}: use 1-128 letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit"
        )
    return run_id


def _head(runtime: Any, run_id: str) -> RunState:
    state: RunState | None = runtime.store.load_head(_check_run_id(run_id))
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
) -> RunState:
    """Validate everything about a new run before anything touches the store."""
    from ratchet.local.runtime import SCRIPTED, build_model
    from ratchet.scenarios import load_agent

    if scenario and agent_ref:
        raise InvalidInput("give --scenario or --agent, not both")
    if goal is None and scenario is None and agent_ref is None:
        raise InvalidInput("give --goal TEXT or --scenario NAME (or --agent module:attr)")
    if goal is not None:
        if not goal.strip():
            raise InvalidInput("the goal is empty")
        if len(goal.encode("utf-8")) > MAX_GOAL_BYTES:
            raise InvalidInput(f"the goal is over {MAX_GOAL_BYTES // 1024} KB")
    reference = agent_ref or scenario or "notebook"
    agent = load_agent(reference)
    settings = _settings()
    chosen_model = model or (
        "claude-sonnet-4-5" if settings.anthropic_api_key is not None else SCRIPTED
    )
    params: dict[str, Any] = dict(agent.default_params)
    if batches is not None:
        params["batches"] = batches
    try:
        options = RunOptions(
            model=chosen_model,
            max_steps=max_steps if max_steps is not None else RunOptions().max_steps,
            tool_latency_ms=tool_latency_ms or 0,
            params=params,
        )
    except ValueError as error:
        raise InvalidInput(f"bad option: {error}") from None
    # Fails now, not in a worker later, if the model cannot be built (no key, no policy).
    build_model(agent, chosen_model, settings)
    if goal is None and not agent.goal:
        raise InvalidInput(f"agent {agent.name!r} has no default goal: give --goal TEXT")
    return RunState(
        run_id=_check_run_id(run_id) if run_id is not None else f"run-{uuid.uuid4().hex[:12]}",
        agent=reference,
        goal=goal if goal is not None else agent.goal_for(params),
        options=options,
    )


def _start(state: RunState) -> bool:
    from ratchet.scenarios import load_agent

    runtime = _runtime(create=True)
    try:
        if runtime.store.load_head(state.run_id) is not None:
            return False
        agent = load_agent(state.agent)
        if agent.prepare:
            agent.prepare(runtime.context(state.run_id, state.options))
        engine = runtime.engine(worker_id=_cli_worker_id(), logger=_logger())
        return bool(engine.start(state))
    finally:
        runtime.close()


def _logger() -> Any:
    from ratchet.observability import json_logger

    return json_logger(sys.stderr, level=_settings().log_level)


def _cli_worker_id() -> str:
    from ratchet.local.runtime import default_worker_id

    return default_worker_id()


GoalOption = Annotated[str | None, typer.Option("--goal", help="What the agent should do.")]
ScenarioOption = Annotated[
    str | None, typer.Option("--scenario", help="A built-in agent: migration, notebook.")
]
RunIdOption = Annotated[str | None, typer.Option("--run-id", help="A stable id for the run.")]
AgentOption = Annotated[str | None, typer.Option("--agent", help="Your own agent, as module:attr.")]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="'scripted' (offline) or a Claude model; default Claude when ANTHROPIC_API_KEY "
        "is set, else scripted.",
    ),
]
MaxStepsOption = Annotated[
    int | None, typer.Option("--max-steps", help="Step cap (default 60).", min=1)
]
BatchesOption = Annotated[
    int | None, typer.Option("--batches", help="Migration: number of 1,000-row batches.", min=1)
]
LatencyOption = Annotated[
    int | None, typer.Option("--tool-latency-ms", help="Slow every tool call down.", min=0)
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
) -> None:
    """Start a run (a worker does the steps). Prints the run id."""
    state = _new_run(
        goal=goal,
        scenario=scenario,
        agent_ref=agent,
        run_id=run_id,
        model=model,
        max_steps=max_steps,
        batches=batches,
        tool_latency_ms=tool_latency_ms,
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
) -> None:
    """Start a run and work it in the foreground until it is done, waiting or failed."""
    from ratchet.faults import FaultPlan
    from ratchet.local.worker import Worker

    state = _new_run(
        goal=goal,
        scenario=scenario,
        agent_ref=agent,
        run_id=run_id,
        model=model,
        max_steps=max_steps,
        batches=batches,
        tool_latency_ms=tool_latency_ms,
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
    finally:
        runtime.close()
    out.print(f"{final.run_id}: {final.status.value} at step {final.step}")
    if final.summary:
        out.print(final.summary)
    if final.status is RunStatus.WAITING and final.waiting:
        out.print(f"Waiting for a person: {final.waiting.request.prompt}")
        out.print(f"Decide with: ratchet approve {final.run_id}  or  ratchet reject {final.run_id}")
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
        float, typer.Option("--lease-seconds", help="Lease length.", min=0.1)
    ] = 30.0,
) -> None:
    """Claim runnable runs and advance them; SIGTERM stops after the current step."""
    import signal

    from ratchet.faults import FaultPlan
    from ratchet.local.worker import Worker

    runtime = _runtime(create=True)
    logger = _logger()
    engine = runtime.engine(
        worker_id=worker_id or _cli_worker_id(),
        logger=logger,
        faults=FaultPlan.parse(runtime.settings.fault),
    )
    work = Worker(engine, runtime.leases, logger, lease_seconds=lease_seconds)
    signal.signal(signal.SIGTERM, lambda *_: work.stop.set())
    logger.info("worker started", extra={"worker_id": work.worker_id})
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
        int | None, typer.Option("--step", help="Show the state as of this step.", min=0)
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
    runtime = _runtime(create=False)
    try:
        _head(runtime, run_id)
        engine = runtime.engine(worker_id=_cli_worker_id(), logger=_logger())
        state: RunState = engine.decide_waiting(run_id, approved=approved, by=by, comment=comment)
        return state
    finally:
        runtime.close()


ByOption = Annotated[
    str | None, typer.Option("--by", help="Who decides (default: your user name).")
]


@app.command()
def approve(
    run_id: RunArgument,
    comment: Annotated[str, typer.Option("--comment", help="A note for the record.")] = "",
    by: ByOption = None,
) -> None:
    """Approve what a waiting run asked for; the next free worker resumes it."""
    state = _decide(run_id, approved=True, by=by or getpass.getuser(), comment=comment)
    out.print(f"{state.run_id}: approved; it resumes on the next free worker")


@app.command()
def reject(
    run_id: RunArgument,
    reason: Annotated[str, typer.Option("--reason", help="Why, for the record.")] = "",
    by: ByOption = None,
) -> None:
    """Reject what a waiting run asked for; the run goes on knowing the answer was no."""
    state = _decide(run_id, approved=False, by=by or getpass.getuser(), comment=reason)
    out.print(f"{state.run_id}: rejected; it resumes on the next free worker")


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
            payload = agent.verify(runtime.context(run_id, state.options), state)
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
    batches: Annotated[int, typer.Option("--batches", min=24, help="Batches to copy.")] = 40,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the demo's store and print where it is.")
    ] = False,
) -> None:
    """The offline demo: a migration agent survives SIGKILL mid-step and waits for approval."""
    from ratchet.local.demo import run_demo

    raise typer.Exit(run_demo(out, batches=batches, keep=keep))


def main() -> None:
    """Entry point: typer handles usage errors (exit 2); Ratchet's own errors end here."""
    try:
        app()
    except RatchetError as error:
        err.print(f"ratchet: {error}", markup=False)
        sys.exit(2)
    except sqlite3.DatabaseError as error:
        err.print(f"ratchet: the store cannot be read: {error}", markup=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
