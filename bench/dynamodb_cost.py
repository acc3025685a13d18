"""What one step costs on DynamoDB: requests by operation, request bytes, and capacity units.

`python -m bench.dynamodb_cost` runs the scripted agent of `bench.scripted_agent` (200 B of
arguments and a 1 KB result a step) in this process on moto's in-memory DynamoDB, through
`AwsRuntime`, the wiring the step Lambda uses, one `Engine.advance` per step, as a Lambda
invocation takes each of its steps (each counts its own attempt, an `UpdateItem`, as it begins;
`bench.aws_cost` counts whole invocations). A botocore
`before-send` hook on the runtime's client sees every HTTP request the client sends, retries
included, and the figures are printed for steps 10, 100 and 500. (The tests run the migration
scenario through the same code.)

Write units are computed from item sizes as DynamoDB bills them: a write costs one unit per
1 KB of the item (for an update, of the item as it ends up), twice that inside a transaction;
a strongly consistent read one unit per 4 KB read. Item sizes count attribute names and
values (UTF-8 strings; numbers as their digits).

- requests: by operation, and by the tables they touch: the engine's (checkpoints and
  idempotency) and the agent's (the app table, where the migration copies its rows);
- bytes: the request bodies as sent (DynamoDB JSON, UTF-8). They track, but are not, the item
  sizes DynamoDB bills: a write is billed per 1 KB of the whole item written (twice that in a
  transaction), an `UpdateItem` on the head for the whole head item.

What a step writes must not grow with the run: the engine's figures at step 500 match step 10
but for wider numbers. The app's figures are the scenario's own (a 1,000-row batch).

The run is made twice, with the payload codec off and then on (`RATCHET_PAYLOAD_KEY=kms:...`,
as a stack with `ratchet:payloadEncryption` gives its functions: `KmsCodec` on a key of moto's
KMS), and the engine's figures are printed side by side, with the KMS requests the codec made
(a data key is reused for five minutes, so a run of steps in one process asks for one).
`--clear-only` makes only the first.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from bench.scripted_agent import new_scripted_run
from ratchet.adapters.payload_keys import KmsCodec
from ratchet.engine import Outcome
from ratchet.runtime.aws import AwsRuntime
from ratchet.runtime.aws_settings import AwsSettings
from ratchet.scenarios import migration
from ratchet.state import RunOptions, RunState
from tests.dynamodb_support import create_tables

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

RUN_ID = "bench-run"
REGION = "us-east-1"
SETTINGS = AwsSettings(
    checkpoints_table="ratchet-checkpoints",
    idempotency_table="ratchet-idempotency",
    app_table="ratchet-app",
)
BATCHES = 520
STEPS_SHOWN = (10, 100, 500)
ENGINE, APP = "engine", "app"
LOG = logging.getLogger("ratchet.bench.dynamodb")
LOG.addHandler(logging.NullHandler())
LOG.propagate = False


# --- counting requests -------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    operation: str
    tables: frozenset[str]
    bytes: int
    payload: Mapping[str, Any] = field(default_factory=dict, compare=False)


class RequestMeter:
    """Records every request a DynamoDB client sends, from botocore's `before-send` event:
    once per HTTP attempt, after signing, with the body exactly as it goes on the wire."""

    def __init__(self, client: DynamoDBClient) -> None:
        self.requests: list[Request] = []
        client.meta.events.register("before-send.dynamodb", self._on_send)

    def _on_send(self, request: Any, **_: Any) -> None:
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode("utf-8")
        target = request.headers.get("X-Amz-Target", b"")
        if isinstance(target, bytes):
            target = target.decode()
        payload = json.loads(body) if body else {}
        operation = target.rpartition(".")[2]
        self.requests.append(Request(operation, _tables(payload), len(body), payload))

    def take(self) -> list[Request]:
        """The requests since the last `take`."""
        taken, self.requests = self.requests, []
        return taken


def _tables(payload: Mapping[str, Any]) -> frozenset[str]:
    names = set()
    if "TableName" in payload:
        names.add(payload["TableName"])
    for item in payload.get("TransactItems", []):
        names.update(part["TableName"] for part in item.values())
    names.update(payload.get("RequestItems", {}))
    return frozenset(names)


@dataclass(frozen=True)
class StepCost:
    step: int
    requests: list[Request] = field(default_factory=list)
    items_after: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def write_units(self, role: str | None = None) -> int:
        return sum(write_units(r, self.items_after) for r in self._of(role))

    def by_operation(self, role: str | None = None) -> Counter[str]:
        return Counter(r.operation for r in self._of(role))

    def write_units_by_operation(self, role: str | None = None) -> Counter[str]:
        units: Counter[str] = Counter()
        for request in self._of(role):
            units[request.operation] += write_units(request, self.items_after)
        return units

    def bytes(self, role: str | None = None) -> int:
        return sum(r.bytes for r in self._of(role))

    def _of(self, role: str | None) -> Iterator[Request]:
        for request in self.requests:
            touches_app = SETTINGS.app_table in request.tables
            if role is None or (role == APP) == touches_app:
                yield request


# --- capacity units from item sizes ------------------------------------------------------------


def item_size(item: Mapping[str, Any]) -> int:
    """An item's size as DynamoDB counts it: each attribute's name and value."""
    return sum(len(name.encode("utf-8")) + _value_size(value) for name, value in item.items())


def _value_size(value: Mapping[str, Any]) -> int:
    ((kind, data),) = value.items()
    if kind == "S":
        return len(str(data).encode("utf-8"))
    if kind == "N":
        return (len(str(data).lstrip("-").replace(".", "")) + 1) // 2 + 1
    if kind == "BOOL" or kind == "NULL":
        return 1
    if kind == "M":
        return 3 + item_size(data)
    if kind == "L":
        return 3 + sum(1 + _value_size(v) for v in data)
    return len(json.dumps(data))


def _units(size: int, unit: int) -> int:
    return max(1, -(-size // unit))


def write_units(request: Request, items_after: Mapping[tuple[str, str], int]) -> int:
    """What a write request costs, in write units: an update is billed on the item as it
    ends up (`items_after`: sizes by table and key, read after the step)."""
    payload = request.payload
    if request.operation == "PutItem":
        return _units(item_size(payload["Item"]), 1024)
    if request.operation == "UpdateItem":
        return _units(items_after[_key(payload)], 1024)
    if request.operation == "TransactWriteItems":
        total = 0
        for part in payload["TransactItems"]:
            ((kind, body),) = part.items()
            size = item_size(body["Item"]) if kind == "Put" else items_after[_key(body)]
            total += 2 * _units(size, 1024)
        return total
    return 0


def updated_keys(requests: list[Request]) -> set[tuple[str, str]]:
    """The items a step's updates wrote, to be read back for their sizes."""
    keys = set()
    for request in requests:
        if request.operation == "UpdateItem":
            keys.add(_key(request.payload))
        elif request.operation == "TransactWriteItems":
            for part in request.payload["TransactItems"]:
                ((kind, body),) = part.items()
                if kind == "Update":
                    keys.add(_key(body))
    return keys


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    return (body["TableName"], json.dumps(body["Key"], sort_keys=True))


# --- a run, stepped in this process ------------------------------------------------------------


class DynamoDbBenchRun:
    """A migration run on moto, advanced one `Engine.advance` at a time, metered.

    Starts moto's mock on entry; everything DynamoDB in this process goes to it until exit.
    """

    def __init__(
        self,
        *,
        batches: int,
        max_steps: int | None = None,
        scripted: bool = False,
        sealed: bool = False,
    ) -> None:
        """A migration of `batches` batches; with `scripted`, the scripted agent of
        `bench.scripted_agent`, for `batches` steps; with `sealed`, payloads sealed with data
        keys of a KMS key (as the stack's functions seal them)."""
        self.batches = batches
        self.max_steps = max_steps or batches + 10
        self.scripted = scripted
        self.sealed = sealed
        self.kms_requests: Counter[str] = Counter()

    def __enter__(self) -> DynamoDbBenchRun:
        import boto3
        from moto import mock_aws

        self._mock = mock_aws()
        self._mock.start()
        self.client: DynamoDBClient = boto3.client("dynamodb", region_name=REGION)
        create_tables(
            self.client,
            checkpoints=SETTINGS.checkpoints_table,
            idempotency=SETTINGS.idempotency_table,
            app=SETTINGS.app_table,
        )
        codec = None
        if self.sealed:
            kms = boto3.client("kms", region_name=REGION)
            key = kms.create_key()["KeyMetadata"]["Arn"]
            # Counted from here: the codec's own requests.
            kms.meta.events.register("before-send.kms", self._on_kms)
            codec = KmsCodec(kms, key)
        self.runtime = AwsRuntime(SETTINGS, self.client, codec=codec)
        self.engine = self.runtime.engine(worker_id="bench", logger=LOG)
        if self.scripted:
            state = new_scripted_run(RUN_ID, steps=self.batches, max_steps=self.max_steps)
        else:
            params = {**migration.agent.default_params, "batches": self.batches}
            state = RunState(
                run_id=RUN_ID,
                agent="migration",
                goal=migration.agent.goal_for(params),
                options=RunOptions(max_steps=self.max_steps, params=params),
            )
            # What starting a run through the API does: seed the scenario's data.
            migration.prepare(self.runtime.context(RUN_ID, state.options))
        if not self.engine.start(state):
            raise RuntimeError(f"run {RUN_ID} already exists")
        self.meter = RequestMeter(self.client)
        return self

    def _on_kms(self, request: Any, **_: Any) -> None:
        target = request.headers.get("X-Amz-Target", b"")
        if isinstance(target, bytes):
            target = target.decode()
        self.kms_requests[target.rpartition(".")[2]] += 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._mock.stop()

    def advance_to(self, step: int) -> list[StepCost]:
        """Take steps until the run has completed `step`; each must leave it running."""
        costs = []
        for expected in range(self.engine.load(RUN_ID).step + 1, step + 1):
            self.meter.take()
            outcome = self.engine.advance(RUN_ID)
            if outcome.outcome is not Outcome.CONTINUE or outcome.step != expected:
                raise RuntimeError(f"expected step {expected} to complete, got {outcome}")
            requests = self.meter.take()
            costs.append(StepCost(expected, requests, self._sizes(updated_keys(requests))))
        return costs

    def _sizes(self, keys: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The sizes of the items a step updated, as they ended up (read unmetered)."""
        sizes = {}
        for key in keys:
            table, item_key = key
            found = self.client.get_item(
                TableName=table, Key=json.loads(item_key), ConsistentRead=True
            ).get("Item", {})
            sizes[key] = item_size(found)
        self.meter.take()
        return sizes


# --- the bench -------------------------------------------------------------------------------


def report(costs: list[StepCost], seconds: float) -> str:
    shown = [c for c in costs if c.step in STEPS_SHOWN]
    operations = sorted({op for c in shown for op in c.by_operation()})
    lines = [
        "DynamoDB requests, request bytes and write units per step: the scripted agent (200 B",
        "of arguments, a 1 KB result), scripted model,",
        "AwsRuntime on moto in-process, one Engine.advance per step (as the first step of a",
        "step Lambda invocation)",
        "",
        f"{'step':>5} {'role':>7} {'requests':>9} "
        + " ".join(f"{op:>{len(op)}}" for op in operations)
        + f" {'bytes':>8} {'WRU':>4}",
    ]
    for cost in shown:
        for role in (ENGINE, APP, None):
            ops = cost.by_operation(role)
            lines.append(
                f"{cost.step:>5} {role or 'total':>7} {sum(ops.values()):>9} "
                + " ".join(f"{ops.get(op, 0):>{len(op)}}" for op in operations)
                + f" {cost.bytes(role):>8,} {cost.write_units(role):>4}"
            )
    early, late = shown[0], shown[-1]
    growth = late.bytes(ENGINE) / early.bytes(ENGINE)
    units = late.write_units_by_operation(ENGINE)
    lines += [
        "",
        f"engine write units at step {late.step}: "
        + ", ".join(f"{op} {units[op]}" for op in operations if units[op]),
        f"engine bytes, step {late.step} over step {early.step}: {growth:.3f} "
        f"({late.bytes(ENGINE) - early.bytes(ENGINE):+,} bytes)",
        f"{len(costs)} steps in {seconds:.1f} s (moto in-process: no network, no real latency)",
    ]
    return "\n".join(lines)


def compare(off: list[StepCost], on: list[StepCost], kms: Counter[str], seconds: float) -> str:
    """The engine's figures per step with the codec off and on, side by side."""
    shown = [(a, b) for a, b in zip(off, on, strict=True) if a.step in STEPS_SHOWN]
    operations = sorted(
        {op for a, b in shown for op in a.by_operation(ENGINE) | b.by_operation(ENGINE)}
    )
    lines = [
        "The engine's figures per step, payload codec off | on (KMS envelopes, as",
        "ratchet:payloadEncryption seals them): requests, request bytes, write units",
        "",
        f"{'step':>5} {'requests':>9} {'bytes':>15} {'WRU':>7}  write units by operation",
    ]
    for a, b in shown:
        units_off = a.write_units_by_operation(ENGINE)
        units_on = b.write_units_by_operation(ENGINE)
        by_operation = ", ".join(
            f"{op} {units_off[op]}|{units_on[op]}"
            for op in operations
            if units_off[op] or units_on[op]
        )
        requests = f"{sum(a.by_operation(ENGINE).values())}|{sum(b.by_operation(ENGINE).values())}"
        lines.append(
            f"{a.step:>5} {requests:>9} {a.bytes(ENGINE):>7,}|{b.bytes(ENGINE):<7,} "
            f"{a.write_units(ENGINE):>3}|{b.write_units(ENGINE):<3}  {by_operation}"
        )
    lines += [
        "",
        f"KMS requests of the codec over the run's start and {len(on)} steps, in {seconds:.1f} s "
        "(a data key seals for 300 s): "
        + (", ".join(f"{op} {n}" for op, n in sorted(kms.items())) or "none"),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dynamodb_cost")
    parser.add_argument(
        "--clear-only",
        action="store_true",
        help="only the run in clear, not the sealed run beside it (half the time: the test "
        "that holds the docs' figures reads only the clear run's)",
    )
    clear_only = parser.parse_args().clear_only
    started = time.perf_counter()
    with DynamoDbBenchRun(batches=BATCHES, scripted=True) as plain:
        costs = plain.advance_to(max(STEPS_SHOWN))
    print(report(costs, time.perf_counter() - started))
    if clear_only:
        return
    print()
    started = time.perf_counter()
    with DynamoDbBenchRun(batches=BATCHES, scripted=True, sealed=True) as sealed:
        sealed_costs = sealed.advance_to(max(STEPS_SHOWN))
    seconds = time.perf_counter() - started
    print(compare(costs, sealed_costs, sealed.kms_requests, seconds))


if __name__ == "__main__":
    main()
