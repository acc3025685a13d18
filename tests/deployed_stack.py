"""A deployed stack's tables on a moto server, for `ratchet serve --store dynamodb://...` run as
a process of its own (issue 40): every DynamoDB request that reaches the server is counted,
with the read units DynamoDB would bill for it.

The runs are made in this process through the adapters (the engine and `AwsRuntime`, as the
step Lambda makes them), one in every status, one waiting for a person with its request open,
a damaged head, a long run and enough small ones for the runs page to have a second page. This
process's own requests carry a user agent of their own and are not counted.

Read units are DynamoDB's billing rule applied to what each response returned: a Query or
GetItem costs the size of the items it read, rounded up to 4 KB, one unit per 4 KB when
strongly consistent and half a unit when eventually consistent (every Query of an index).
The size of an item is DynamoDB's: each attribute's name and value (strings and binary their
bytes, a number about one byte per two digits and one more, a list or map 3 bytes and one per
element plus its elements).
"""

from __future__ import annotations

import io
import json
import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from ratchet.adapters.dynamodb.items import text_attribute
from ratchet.adapters.dynamodb.store import created_head_item
from ratchet.engine import Outcome
from ratchet.runtime.aws import AwsRuntime
from ratchet.scenarios import migration
from ratchet.state import PersonDecided, RunOptions, RunState, RunStatus
from ratchet.waits import Approval
from tests.dynamodb_seed import _run_items, _step_records, _write, seed_runs
from tests.dynamodb_support import (
    REGION,
    SETTINGS,
    make_tables,
    reset_moto,
    scan,
    server_store_url,
)
from tests.processes import RATCHET, Served, serving
from tests.support import LOG

STACK = "MyAgents"
ACCOUNT = "123456789012"  # moto's
SEEDER = "ratchet-test-seeder"
"""The user agent of this process's own requests, which are not counted."""
SMALL_RUNS = 110
"""More than a runs page shows (100): the list has a second page."""
LONG_STEPS = 650
"""More step records than a run's page reads (500)."""
APPROVAL_ID = "appr0000000000000001"
DAMAGED = "damaged-1"
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
}
SCRUBBED_PREFIXES = ("AWS_", "RATCHET_", "ANTHROPIC_")


@dataclass(frozen=True)
class Call:
    """One DynamoDB request the server answered."""

    operation: str
    table: str
    index: str | None
    items: int
    units: float


@dataclass
class Calls:
    """Every request but this process's own, from the server's side of the wire."""

    seen: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> list[Call]:
        with self.lock:
            taken, self.seen = self.seen, []
        return taken


def counting(app: Any, calls: Calls) -> Any:
    """The moto server's WSGI app, recording each DynamoDB request and what it read."""

    def answer(environ: dict[str, Any], start_response: Any) -> Any:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if not target.startswith("DynamoDB_") or SEEDER in environ.get("HTTP_USER_AGENT", ""):
            return app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        environ["wsgi.input"] = io.BytesIO(body)
        asked = json.loads(body or b"{}")
        answered = b"".join(app(environ, start_response))
        operation = target.split(".", 1)[1]
        try:
            returned = json.loads(answered or b"{}")
        except ValueError:
            returned = {}  # a refusal moto words in XML (an IAM check)
        items = returned.get("Items", [returned["Item"]] if "Item" in returned else [])
        index = asked.get("IndexName")
        units = 0.0
        if operation in ("Query", "GetItem", "Scan"):
            consistent = bool(asked.get("ConsistentRead")) and index is None
            blocks = max(1, math.ceil(sum(item_size(i) for i in items) / 4096))
            units = blocks * (1.0 if consistent else 0.5)
        with calls.lock:
            calls.seen.append(Call(operation, asked.get("TableName", ""), index, len(items), units))
        return [answered]

    return answer


def item_size(item: dict[str, Any]) -> int:
    return sum(len(name.encode()) + _value_size(value) for name, value in item.items())


def _value_size(value: dict[str, Any]) -> int:
    (kind, data), *_ = value.items()
    if kind == "S":
        return len(data.encode())
    if kind == "N":
        return math.ceil(len(data.lstrip("-").replace(".", "").lstrip("0") or "0") / 2) + 1
    if kind == "B":
        return len(data) * 3 // 4
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(1 + _value_size(v) for v in data)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + _value_size(v) for k, v in data.items())
    return sum(len(str(v)) for v in data)  # SS, NS, BS


@contextmanager
def counting_moto() -> Iterator[tuple[str, Calls]]:
    """moto as an HTTP server on a free local port, counting what reaches it."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    calls = Calls()
    app = counting(DomainDispatcherApplication(create_backend_app), calls)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    reset_moto(endpoint)
    try:
        yield endpoint, calls
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Stack:
    endpoint: str
    client: Any
    runtime: AwsRuntime
    calls: Calls

    def url(self, **overrides: str) -> str:
        return server_store_url(self.endpoint, **overrides)

    def everything(self) -> dict[str, list[dict[str, Any]]]:
        tables = (SETTINGS.checkpoints_table, SETTINGS.idempotency_table, SETTINGS.app_table)
        return {table: scan(self.client, table) for table in tables}


def env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
    return (
        clean
        | FAKE_CREDENTIALS
        | {
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "PYTHONUNBUFFERED": "1",
        }
        | extra
    )


def _start(runtime: AwsRuntime, run_id: str, *, max_steps: int | None = None) -> None:
    params = {**migration.agent.default_params, "batches": 2}
    options = RunOptions(params=params, **({"max_steps": max_steps} if max_steps else {}))
    state = RunState(
        run_id=run_id, agent="migration", goal=migration.agent.goal_for(params), options=options
    )
    migration.prepare(runtime.context(run_id, state.options))
    assert runtime.engine(worker_id="api", logger=LOG).start(state)


def _work(runtime: AwsRuntime, run_id: str, *, steps: int = 30) -> Outcome:
    engine = runtime.engine(worker_id="step-lambda", logger=LOG)
    outcome = Outcome.CONTINUE
    for _ in range(steps):
        outcome = engine.advance(run_id).outcome
        if outcome is not Outcome.CONTINUE:
            return outcome
    return outcome


def make_runs(stack: Stack, *, many: bool) -> None:
    """A run in every status (`done-1`, `running-1`, `failed-1`, `stopped-1`, `cancelled-1`,
    `wait-1` waiting for a person with its request open) and a damaged head; with `many`, a
    long run (`long-1`) and `SMALL_RUNS` small ones too."""
    runtime, engine = stack.runtime, stack.runtime.engine(worker_id="api", logger=LOG)
    _start(runtime, "done-1")
    assert _work(runtime, "done-1") is Outcome.WAITING
    engine.decide_waiting("done-1", PersonDecided(approved=True, by="ops@example.com"))
    assert _work(runtime, "done-1") is Outcome.DONE
    _start(runtime, "running-1")
    assert _work(runtime, "running-1", steps=1) is Outcome.CONTINUE
    _start(runtime, "failed-1")
    engine.fail("failed-1", "the copy broke")
    _start(runtime, "stopped-1", max_steps=2)
    assert _work(runtime, "stopped-1") is Outcome.STOPPED
    _start(runtime, "cancelled-1")
    engine.cancel("cancelled-1", by="ops@example.com", reason="wrong table")
    _start(runtime, "wait-1")
    assert _work(runtime, "wait-1") is Outcome.WAITING
    head = runtime.store.load_head("wait-1")
    assert head is not None
    assert head.waiting is not None
    now = datetime.now(UTC)
    runtime.approvals().open(
        Approval(
            approval_id=APPROVAL_ID,
            run_id="wait-1",
            step=head.step,
            created_at=now,
            expires_at=now + timedelta(days=1),
            prompt=head.waiting.request.prompt,
        ),
        task_token="a-task-token",
    )
    # A head whose stored status no Ratchet writes: listed as damaged, its page says so.
    damaged = created_head_item(
        RunState(run_id=DAMAGED, agent="migration", goal="g", created_at=now, updated_at=now)
    )
    damaged["status"] = text_attribute("exploded")
    damaged["state"] = text_attribute("{not json")
    stack.client.put_item(TableName=SETTINGS.checkpoints_table, Item=damaged)
    statuses = {
        run_id: getattr(runtime.store.load_head(run_id), "status", None)
        for run_id in ("done-1", "running-1", "failed-1", "stopped-1", "cancelled-1", "wait-1")
    }
    assert set(statuses.values()) == set(RunStatus), statuses
    if not many:
        return
    seed_runs(
        stack.client,
        table=SETTINGS.checkpoints_table,
        runs=SMALL_RUNS,
        steps=2,
        now=now - timedelta(hours=1),
    )
    items = list(_run_items("long-1", 1, LONG_STEPS, _step_records("long-1", LONG_STEPS, now), now))
    for first in range(0, len(items), 25):
        _write(stack.client, SETTINGS.checkpoints_table, items[first : first + 25])


@contextmanager
def deployed_stack(*, many: bool = True) -> Iterator[Stack]:
    with counting_moto() as (endpoint, calls):
        client = boto3.client(
            "dynamodb",
            region_name=REGION,
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(user_agent_extra=SEEDER),
        )
        make_tables(client)
        arn = client.describe_table(TableName=SETTINGS.checkpoints_table)["Table"]["TableArn"]
        client.tag_resource(
            ResourceArn=arn, Tags=[{"Key": "aws:cloudformation:stack-name", "Value": STACK}]
        )
        stack = Stack(endpoint, client, AwsRuntime(SETTINGS, client), calls)
        make_runs(stack, many=many)
        calls.take()
        yield stack


@contextmanager
def serve(stack: Stack, log: Path, *args: str, **extra: str) -> Iterator[Served]:
    """`ratchet serve` on the stack's tables, as a process of its own in the log's folder;
    stopped on the way out. It works no runs, and says so last; `Served.base` is where its
    dashboard is."""
    argv = [*RATCHET, "--store", stack.url(), "serve", "--port", "0", *args]
    with serving(
        argv,
        log=log,
        env=env(**extra),
        cwd=log.parent,
        ready=r"^No worker here",
        address=r"The runs dashboard: (http://\S+)/dashboard",
    ) as served:
        yield served
