"""What the commands that write do once their options are read, without typer: `start` a run,
`approve` or `reject` what a waiting run asked for.

The full CLI's commands (`ratchet.cli.runs.start`, `ratchet.cli.decisions.approve` and
`reject`) call these with the options typer read; the entry point calls the same ones with the
options it read itself (`ratchet.cli.quick_writes`), for the command lines it is sure of, so that
a write does not wait for typer to load and build its options. Either way the same code
validates, writes and says what it did.
"""

from __future__ import annotations

import getpass
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ratchet.cli.context import (
    check_run_id,
    open_client,
    require_local_store,
    say_line,
    settings,
    store_named,
)
from ratchet.errors import InvalidInput, JsonOverLimit
from ratchet.untrusted import loads

if TYPE_CHECKING:
    from ratchet.state import RunState


@dataclass(frozen=True)
class NewRun:
    """What `ratchet start` and `ratchet run` are told of the run to start, as the command
    line gave it (None where it was not given): one value that both commands, on both paths
    (typer's and `ratchet.cli.quick_writes`), hand on whole, so an option added here reaches
    each of them. `validated_run` checks it."""

    goal: str | None = None
    scenario: str | None = None
    agent_ref: str | None = None
    run_id: str | None = None
    model: str | None = None
    max_steps: int | None = None
    input_json: str | None = None
    params: list[str] | None = None
    batches: int | None = None
    tool_latency_ms: int | None = None
    notify: list[str] | None = None
    notify_slack: str | None = None
    approval_timeout: int | None = None
    concurrency_key: str | None = None
    priority: int | None = None
    budget: str | None = None


def start_run(new: NewRun) -> None:
    """`ratchet start`: create the run (a worker does the steps) and print its id."""
    require_local_store("start")
    state = validated_run(new)
    say_if_paid(state.options.model, stderr=True)
    created = _create(with_approval_timeout(state, new.approval_timeout))
    say_line(state.run_id)
    if not created:
        say_line(f"run {state.run_id} already exists; nothing changed", stderr=True)
    else:
        say_line(
            f"run {state.run_id} started in store {store_named(settings().store)}", stderr=True
        )


def validated_run(new: NewRun) -> RunState:
    """Validate everything about a new run before anything touches the store. Refusals
    name the CLI's flags (the API names the same fields as JSON fields)."""
    # pydantic and the run models (see ratchet.cli.context).
    from pydantic import ValidationError

    from ratchet.runs import (
        RunRequest,
        RunRequestInvalid,
        check_concurrency_key,
        cli_flag,
        new_run,
        request_problems,
    )

    if new.run_id is not None:
        check_run_id(new.run_id)
    if new.concurrency_key is not None:
        check_concurrency_key(new.concurrency_key, "--key")
    try:
        request = RunRequest(
            run_id=new.run_id,
            scenario=new.scenario,
            agent=new.agent_ref,
            goal=new.goal,
            model=new.model,
            max_steps=new.max_steps,
            input=run_input(new.input_json, new.params),
            batches=new.batches,
            tool_latency_ms=new.tool_latency_ms,
            notify={"email": new.notify or [], "slack_channel": new.notify_slack}
            if new.notify or new.notify_slack
            else None,
            concurrency_key=new.concurrency_key,
            priority=new.priority,
            # As text: the model reads it as a number, and says the same line whichever path
            # (this CLI's option or the quick one) read it.
            budget_usd=new.budget,
        )
    except ValidationError as error:
        field, message = request_problems(error)[0]
        raise InvalidInput(f"{cli_flag(field)}: {message}") from None
    try:
        return new_run(request, has_anthropic_key=settings().anthropic_api_key is not None)
    except RunRequestInvalid as refused:
        raise InvalidInput(as_given(refused.for_cli(), refused.fields, new.params)) from None


def as_given(said: str, fields: tuple[str, ...], params: list[str] | None) -> str:
    """`said` naming the flag an input field came in: `--param cents` for one a --param set,
    `--input field cents` for one that came in --input (or is missing from it)."""
    by_param = {p.partition("=")[0] for p in params or []}
    for field in fields:
        name = field.removeprefix("input.")
        if field.startswith("input.") and name not in by_param:
            said = said.replace(f"(--param {name})", f"(--input field {name})")
    return said


_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def input_object(text: str) -> dict[str, Any]:
    """`--input` as a JSON object; refused, naming the flag, if it is not one (or is nested
    too deep to be parsed)."""
    try:
        parsed = loads(text, field="--input")
    except JsonOverLimit:
        raise
    except ValueError as error:
        raise InvalidInput(f"--input is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise InvalidInput(
            f"--input must be a JSON object, like '{{\"batches\": 2}}', not {type(parsed).__name__}"
        )
    return parsed


def run_input(input_json: str | None, params: list[str] | None) -> dict[str, Any] | None:
    """`--input '{"batches": 2}'` and `--param batches=2` (repeatable, later ones win) as one
    object. A `--param` value is read as JSON when it is JSON (`2`, `true`, `[1, 2]`, `"2"`),
    as text otherwise (`--param who=dana`). JSON nested too deep is refused before it is
    parsed, naming the flag."""
    if input_json is None and not params:
        return None
    given: dict[str, Any] = input_object(input_json) if input_json is not None else {}
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


def _create(state: RunState) -> bool:
    from ratchet.runs import RunRequestInvalid

    client = open_client(create=True)
    try:
        return bool(client.create(state).created)
    except RunRequestInvalid as refused:  # a taken id under another request
        raise InvalidInput(refused.for_cli()) from None
    finally:
        client.close()


def with_approval_timeout(state: RunState, seconds: int | None) -> RunState:
    if seconds is None:
        return state
    options = state.options.model_copy(update={"approval_timeout_seconds": seconds})
    return state.model_copy(update={"options": options})


def say_if_paid(model: str, *, stderr: bool) -> None:
    """`model: claude-sonnet-4-6` first, for a run whose model calls are billed: a run never
    spends without saying so before its first step."""
    from ratchet.model_names import ModelKind, model_kind

    if model_kind(model) in (ModelKind.ANTHROPIC, ModelKind.BEDROCK):
        say_line(f"model: {model}", stderr=stderr)


def approve_run(run_id: str, *, comment: str, by: str | None, answer: str | None) -> None:
    """`ratchet approve`: the next free worker resumes the run."""
    require_local_store("approve")
    _decide(run_id, approved=True, by=by or getpass.getuser(), comment=comment, answer=answer)
    say_line(f"{run_id}: approved; it resumes on the next free worker")


def reject_run(run_id: str, *, reason: str, by: str | None) -> None:
    """`ratchet reject`: the run goes on knowing the answer was no."""
    require_local_store("reject")
    _decide(run_id, approved=False, by=by or getpass.getuser(), comment=reason)
    say_line(f"{run_id}: rejected; it resumes on the next free worker")


def _decide(
    run_id: str, *, approved: bool, by: str, comment: str, answer: str | None = None
) -> None:
    """Decide through the run's open approval request, so its links and page show the
    decision; a run parked by a worker that died before opening one is decided directly."""
    from ratchet.approvals.answers import parse_answer_json  # the run models (see context)
    from ratchet.errors import ApprovalDecided

    client = open_client(create=False)
    try:
        if approved:
            given = parse_answer_json(answer) if answer is not None else None
            client.approve(run_id, by=by, comment=comment, answer=given)
        else:
            client.reject(run_id, by=by, comment=comment)
    except ApprovalDecided as decided:
        raise ApprovalDecided(f"{run_id} was already {decided}; nothing changed") from None
    finally:
        client.close()
