"""`ratchet doctor`: whether a deployed stack is whole and answers, checked from its store URL
(the stack's `StoreUrl` output) with the caller's credentials, one check at a time.

The URL names the tables and the state machine; the state machine's definition names the
functions it invokes, and their environments (the stack's contract with the handlers,
`ratchet.runtime.aws_settings.ENVIRONMENT`) name the secrets they read and the API's base URL.
So one URL finds everything, as the functions themselves find it.

A URL that names no Ratchet stack (no checkpoints table of that name, or a table of another
shape) is bad input, as a SQLite file that is not Ratchet's is: `StackUnreachable` or
`InvalidInput` before any check is reported. Everything past that is a check, failed or not.
Only `run` writes: it starts a run through the API and follows it to its end.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ratchet.adapters.deployed import DeployedStack, TableShape
from ratchet.adapters.dynamodb.items import TABLES, TableSpec
from ratchet.errors import InvalidInput, StackPartUnreadable
from ratchet.runtime import DynamoDbStoreUrl
from ratchet.runtime.aws_settings import ENVIRONMENT

SECRET_VARIABLES = tuple(
    ENVIRONMENT[name] for name in sorted(ENVIRONMENT) if name.endswith("_secret_arn")
)
"""The variables by which the stack tells a function which Secrets Manager secret to read."""
PROJECT_SECRETS = ENVIRONMENT["secrets"]
"""The project's own secrets (`[tool.ratchet] secrets`): name -> `secretsmanager:ARN` or
`ssm:NAME`, on the step function."""
PUBLIC_URL = ENVIRONMENT["public_url"]
ENDED = frozenset({"done", "failed", "cancelled", "stopped"})
DOCTOR_GOAL = "ratchet doctor: a scripted run started through the API, followed to its end"
DEFAULT_RUN_TIMEOUT_SECONDS = 300
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, whether it holds (None: not checked), and
    what was found."""

    name: str
    ok: bool | None
    detail: str


@dataclass(frozen=True)
class RunWanted:
    """The run `--run` starts: the built-in notebook scenario (it writes one note and is done),
    or an agent the deployment registers, with its input."""

    agent: str | None = None
    input: Mapping[str, Any] | None = None
    timeout_seconds: float = DEFAULT_RUN_TIMEOUT_SECONDS


def check_stack(
    url: str,
    *,
    run: RunWanted | None,
    connect: Callable[[str | None, str | None], DeployedStack] = DeployedStack.connect,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Check]:
    """The checks of the stack `url` names, each as it is made. Raises before the first if
    the URL names no Ratchet stack the caller can read."""
    store = DynamoDbStoreUrl.parse(url)
    if store.machine is None:
        raise InvalidInput(
            "ratchet doctor needs the stack's StoreUrl output whole: this URL names no state "
            "machine (&machine=ARN)"
        )
    stack = connect(store.region, store.endpoint)
    checkpoints = stack.table(store.checkpoints)
    spec = TABLES["checkpoints"]
    if checkpoints is None:
        raise InvalidInput(
            f"no table {store.checkpoints!r} in {stack.region}: give the stack's StoreUrl output "
            "as --store"
        )
    if checkpoints.keys != (spec.partition_key, spec.sort_key):
        raise InvalidInput(
            f"table {store.checkpoints!r} is not a Ratchet checkpoints table: its keys are "
            f"{_keys(checkpoints.keys)}, not {_keys((spec.partition_key, spec.sort_key))}"
        )
    yield _table_check("checkpoints", store.checkpoints, checkpoints)
    for role, name in (("idempotency", store.ledger), ("app", store.app)):
        yield _guarded(f"table {name}", functools.partial(_read_table, stack, role, name))
    environments: dict[str, Mapping[str, str]] = {}
    yield _guarded(
        f"state machine {_short(store.machine)}",
        lambda: _machine_check(stack, store.machine or "", environments),
    )
    if not environments:
        # The functions name the secrets and the API: a failure above is the one to fix.
        unread = "not checked: the state machine's functions, which name it, were not read"
        yield Check("secrets", None, unread)
        yield Check("API", None, unread)
        yield Check("run", None, unread)
        return
    yield from _secret_checks(stack, environments)
    api = next((env[PUBLIC_URL] for env in environments.values() if env.get(PUBLIC_URL)), None)
    runs_url = f"{api.rstrip('/')}/runs" if api else None
    yield _guarded("API", lambda: _api_check(stack, runs_url))
    if run is None:
        yield Check("run", None, "not started: --run starts one through the API (it writes a run)")
        return
    yield _guarded("run", lambda: _run_check(stack, runs_url, run, clock))


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    try:
        return check()
    except StackPartUnreadable as error:
        return Check(name, False, f"cannot be read: {error}")


def _read_table(stack: DeployedStack, role: str, name: str) -> Check:
    return _table_check(role, name, stack.table(name))


def _table_check(role: str, name: str, table: TableShape | None) -> Check:
    label = f"table {name}"
    if table is None:
        return Check(label, False, f"missing: the {role} table of the StoreUrl is not there")
    spec: TableSpec = TABLES[role]
    problems = []
    wanted = (spec.partition_key, spec.sort_key)
    if table.keys != wanted:
        problems.append(f"its keys are {_keys(table.keys)}, not {_keys(wanted)}")
    problems += [
        f"key {key} is of type {table.key_types.get(key)}, not S (a string)"
        for key in filter(None, wanted)
        if table.keys == wanted and table.key_types.get(key) != "S"
    ]
    if table.status not in ("ACTIVE", "UPDATING"):
        problems.append(f"it is {table.status or 'of no status'}, not ACTIVE")
    for index in spec.indexes:
        found = table.indexes.get(index.name)
        if found is None:
            problems.append(f"it has no index {index.name}")
        elif found != (index.partition_key, index.sort_key):
            problems.append(
                f"index {index.name}'s keys are {_keys(found)}, not "
                f"{_keys((index.partition_key, index.sort_key))}"
            )
        elif table.index_status.get(index.name) != "ACTIVE":
            problems.append(f"index {index.name} is {table.index_status.get(index.name)}")
    if spec.ttl_attribute is not None and table.ttl_attribute != spec.ttl_attribute:
        problems.append(
            f"its TTL is {'on ' + table.ttl_attribute if table.ttl_attribute else 'off'}, not on "
            f"{spec.ttl_attribute} (old records would be kept for ever)"
        )
    if problems:
        return Check(label, False, "; ".join(problems))
    shown = [f"keys {_keys(wanted)}"]
    if spec.indexes:
        shown.append("indexes " + ", ".join(i.name for i in spec.indexes))
    if spec.ttl_attribute:
        shown.append(f"TTL on {spec.ttl_attribute}")
    return Check(label, True, "; ".join(shown))


def _machine_check(
    stack: DeployedStack, arn: str, environments: dict[str, Mapping[str, str]]
) -> Check:
    """The state machine and each function it invokes; their environments go to
    `environments` for the checks that follow."""
    label = f"state machine {_short(arn)}"
    machine = stack.state_machine(arn)
    if machine is None:
        return Check(label, False, "missing: the StoreUrl's machine is not there")
    problems = [] if machine.status == "ACTIVE" else [f"it is {machine.status}, not ACTIVE"]
    if not machine.functions:
        problems.append("its definition invokes no function (not Ratchet's?)")
    for function in machine.functions:
        environment = stack.function_environment(function)
        if environment is None:
            problems.append(f"function {_short(function)} is missing")
        else:
            environments[function] = environment
    if problems:
        return Check(label, False, "; ".join(problems))
    return Check(label, True, f"ACTIVE; its {len(machine.functions)} functions are there")


def _secret_checks(
    stack: DeployedStack, environments: Mapping[str, Mapping[str, str]]
) -> Iterator[Check]:
    """One check per secret a function of the state machine is told to read."""
    named: dict[str, str] = {}
    for environment in environments.values():
        for variable in SECRET_VARIABLES:
            if environment.get(variable):
                named.setdefault(environment[variable], variable)
        try:
            project = json.loads(environment.get(PROJECT_SECRETS) or "{}")
        except ValueError:
            project = {}
        for name, reference in dict(project).items():
            named.setdefault(str(reference), f"{PROJECT_SECRETS} {name}")
    if not named:
        yield Check("secrets", False, "the functions name no secret (the link key is missing)")
    for reference, variable in sorted(named.items(), key=lambda item: item[1]):
        label = f"secret {variable}"

        def exists(reference: str = reference, label: str = label) -> Check:
            if stack.secret_exists(reference):
                return Check(label, True, f"{_short(reference)} is there")
            return Check(label, False, f"{_short(reference)} is missing (or deleted)")

        yield _guarded(label, exists)


def _api_check(stack: DeployedStack, runs_url: str | None) -> Check:
    if runs_url is None:
        return Check("API", False, f"not found: no function names its URL ({PUBLIC_URL})")
    answer = stack.api("GET", f"{runs_url}?limit=1")
    if answer.status == 200 and isinstance(answer.body, dict) and "runs" in answer.body:
        return Check("API", True, f"GET {runs_url} answers 200")
    return Check("API", False, f"GET {runs_url} answers {answer.status}{_why(answer.body)}")


def _run_check(
    stack: DeployedStack, runs_url: str | None, wanted: RunWanted, clock: Callable[[], float]
) -> Check:
    if runs_url is None:
        return Check("run", False, "not started: the API's URL was not found")
    run_id = f"doctor-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
    body: dict[str, Any] = {"run_id": run_id, "model": "scripted"}
    if wanted.agent is None:
        body.update(scenario="notebook", goal=DOCTOR_GOAL)
    else:
        body.update(agent=wanted.agent, input=dict(wanted.input or {}))
    began = clock()
    started = stack.api("POST", runs_url, body)
    if started.status not in (200, 201):
        return Check("run", False, f"POST {runs_url} answers {started.status}{_why(started.body)}")
    deadline = began + wanted.timeout_seconds
    while True:
        answer = stack.api("GET", f"{runs_url}/{run_id}")
        if answer.status != 200 or not isinstance(answer.body, dict):
            return Check("run", False, f"GET {runs_url}/{run_id} answers {answer.status}")
        status, step = answer.body.get("status"), answer.body.get("step")
        took = clock() - began
        if status == "done":
            done = f"{run_id} started through the API, done at step {step} in {took:.1f} s"
            return Check("run", True, done)
        if status in ENDED:
            why = answer.body.get("error") or answer.body.get("summary") or ""
            ended = f"{run_id} ended {status} at step {step}"
            return Check("run", False, f"{ended}: {why}" if why else ended)
        if status == "waiting":
            return Check(
                "run",
                False,
                f"{run_id} waits for a person at step {step}: start one that needs no approval "
                "(--agent, --input)",
            )
        if clock() >= deadline:
            return Check(
                "run",
                False,
                f"{run_id} not done after {wanted.timeout_seconds:g} s: {status} at step {step}",
            )
        time.sleep(POLL_SECONDS)


def _why(body: Any) -> str:
    if isinstance(body, dict) and body.get("error"):
        return f": {body['error']}"
    return ""


def _keys(keys: tuple[str | None, str | None]) -> str:
    return " and ".join(k for k in keys if k) or "none"


def _short(reference: str) -> str:
    """The name an ARN ends in (a function's, a state machine's, a secret's), or a
    parameter's name (`ssm:/a/b`: `/a/b`)."""
    arn = reference.removeprefix("secretsmanager:").removeprefix("ssm:")
    return arn.rsplit(":", 1)[-1] if arn.startswith("arn:") else arn
