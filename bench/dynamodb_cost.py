"""What one step costs on DynamoDB: requests by operation, and request bytes.

`python -m bench.dynamodb_cost` runs the migration scenario (scripted model) in this process on
moto's in-memory DynamoDB, through `AwsRuntime`, the wiring the step Lambda uses, one
`Engine.advance` per step as one Lambda invocation takes it. A botocore `before-send` hook on
the runtime's client sees every HTTP request the client sends, retries included, and the
figures are printed for steps 10, 100 and 500.

- requests: by operation, and by the tables they touch: the engine's (checkpoints and
  idempotency) and the agent's (the app table, where the migration copies its rows);
- bytes: the request bodies as sent (DynamoDB JSON, UTF-8). They track, but are not, the item
  sizes DynamoDB bills: a write is billed per 1 KB of the whole item written (twice that in a
  transaction), an `UpdateItem` on the head for the whole head item.

What a step writes must not grow with the run: the engine's figures at step 500 match step 10
but for wider numbers. The app's figures are the scenario's own (a 1,000-row batch).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ratchet.adapters.dynamodb import create_tables
from ratchet.aws.runtime import AwsRuntime
from ratchet.aws.settings import AwsSettings
from ratchet.engine.core import Outcome
from ratchet.scenarios import migration
from ratchet.state import RunOptions, RunState

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

RUN_ID = "bench-migration"
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
        self.requests.append(Request(target.rpartition(".")[2], _tables(payload), len(body)))

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

    def by_operation(self, role: str | None = None) -> Counter[str]:
        return Counter(r.operation for r in self._of(role))

    def bytes(self, role: str | None = None) -> int:
        return sum(r.bytes for r in self._of(role))

    def _of(self, role: str | None) -> Iterator[Request]:
        for request in self.requests:
            touches_app = SETTINGS.app_table in request.tables
            if role is None or (role == APP) == touches_app:
                yield request


# --- a run, stepped in this process ------------------------------------------------------------


class DynamoDbBenchRun:
    """A migration run on moto, advanced one `Engine.advance` at a time, metered.

    Starts moto's mock on entry; everything DynamoDB in this process goes to it until exit.
    """

    def __init__(self, *, batches: int, max_steps: int | None = None) -> None:
        self.batches = batches
        self.max_steps = max_steps or batches + 10

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
        self.runtime = AwsRuntime(SETTINGS, self.client)
        self.engine = self.runtime.engine(worker_id="bench", logger=LOG)
        params = {**migration.agent.default_params, "batches": self.batches}
        state = RunState(
            run_id=RUN_ID,
            agent="migration",
            goal=migration.agent.goal_for(params),
            options=RunOptions(max_steps=self.max_steps, params=params),
        )
        # What starting a run through the API does: seed the scenario's data, create the run.
        migration.prepare(self.runtime.context(RUN_ID, state.options))
        if not self.engine.start(state):
            raise RuntimeError(f"run {RUN_ID} already exists")
        self.meter = RequestMeter(self.client)
        return self

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
            costs.append(StepCost(expected, self.meter.take()))
        return costs


# --- the bench -------------------------------------------------------------------------------


def report(costs: list[StepCost], seconds: float) -> str:
    shown = [c for c in costs if c.step in STEPS_SHOWN]
    operations = sorted({op for c in shown for op in c.by_operation()})
    lines = [
        "DynamoDB requests and request bytes per step: migration scenario, scripted model,",
        "AwsRuntime on moto in-process, one Engine.advance per step (as one step Lambda call)",
        "",
        f"{'step':>5} {'role':>7} {'requests':>9} "
        + " ".join(f"{op:>{len(op)}}" for op in operations)
        + f" {'bytes':>8}",
    ]
    for cost in shown:
        for role in (ENGINE, APP, None):
            ops = cost.by_operation(role)
            lines.append(
                f"{cost.step:>5} {role or 'total':>7} {sum(ops.values()):>9} "
                + " ".join(f"{ops.get(op, 0):>{len(op)}}" for op in operations)
                + f" {cost.bytes(role):>8,}"
            )
    early, late = shown[0], shown[-1]
    growth = late.bytes(ENGINE) / early.bytes(ENGINE)
    lines += [
        "",
        f"engine bytes, step {late.step} over step {early.step}: {growth:.3f} "
        f"({late.bytes(ENGINE) - early.bytes(ENGINE):+,} bytes)",
        f"{len(costs)} steps in {seconds:.1f} s (moto in-process: no network, no real latency)",
    ]
    return "\n".join(lines)


def main() -> None:
    started = time.perf_counter()
    with DynamoDbBenchRun(batches=BATCHES) as run:
        costs = run.advance_to(max(STEPS_SHOWN))
    print(report(costs, time.perf_counter() - started))


if __name__ == "__main__":
    main()
