"""What 1,000 scripted steps cost on AWS, counted on moto, for 1, 10 and 100 steps per
invocation of the step function (`ratchet:maxStepsPerInvocation`).

`python -m bench.aws_cost` runs the scripted agent of `bench.scripted_agent` (200 B of arguments
and a 1 KB result a step) through the real state machine (`statemachine/agent_run.asl.json`,
interpreted by moto's Step Functions engine) and the real step handler, dispatched in process
(`tests.integration.aws.harness`), on moto's DynamoDB. For each setting one run of `STEPS`
steps (its lookups and the step that reports it done) goes from start to end, and the bench
counts:

- state transitions: the states the executions entered, from their histories (Step Functions
  bills one per state entered, retries included; this run has none);
- Lambda invocations of the step function (`ratchet-step`);
- DynamoDB requests, by operation, as the handlers' client sent them (a botocore `before-send`
  hook), and their write units from item sizes as DynamoDB bills them
  (`bench.dynamodb_cost.write_units`; an update is billed on its item as it ended up, read at
  the end of the run: the head is bounded, so its last size stands for each update's).

The counts are scaled to 1,000 steps (the run's one start and end, a few transitions and
requests, are scaled with them, so the figures are a little over a 1,000-step run's), and
priced at the us-east-1 list prices docs/deploy.md uses: Step Functions Standard $0.025 per
1,000 transitions; Lambda arm64 $0.0000133334 per GB-second and $0.20 per million requests, at
512 MB and an estimated 250 ms a scripted step; DynamoDB on demand $0.625 per million write
units and $0.125 per million read units, a read request estimated at 1 read unit (a head or a
window of step records, under 4 KB: the read units need a deployed stack to measure). Logs and
traces are not in the figure (docs/deploy.md). The target is at most $0.02 per 1,000 scripted
steps. "1 (before)" is the loop as it was: one step per invocation.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from bench.dynamodb_cost import Request, RequestMeter, item_size, updated_keys, write_units
from bench.scripted_agent import new_scripted_run
from ratchet.handlers import _wiring
from tests.integration.aws.harness import AGENTS, Stack, deployed

STEPS = 100
"""Steps of each run (lookups and the DONE step), scaled to 1,000 in the figures: a 1,000-step
run at one step per invocation takes three minutes on moto by itself."""
PER_INVOCATION = (1, 10, 100)
TARGET_DOLLARS = 0.02
"""The target: AWS's bill for 1,000 scripted steps (issue 21)."""

TRANSITION_DOLLARS = 0.025 / 1000
LAMBDA_GB_SECOND_DOLLARS = 0.0000133334
LAMBDA_REQUEST_DOLLARS = 0.20 / 1_000_000
LAMBDA_GB = 0.5
SCRIPTED_STEP_SECONDS = 0.25
WRITE_UNIT_DOLLARS = 0.625 / 1_000_000
READ_UNIT_DOLLARS = 0.125 / 1_000_000
READS = {"GetItem", "Query", "BatchGetItem", "Scan"}
SCRIPTED_AGENT = "bench.scripted_agent:agent"
LOG = logging.getLogger("ratchet.bench.aws")
LOG.addHandler(logging.NullHandler())
LOG.propagate = False


@dataclass(frozen=True)
class Counts:
    """What one run of `steps` steps sent to AWS."""

    per_invocation: int
    steps: int
    transitions: int
    invocations: int
    requests: Counter[str]
    write_units: int
    seconds: float

    def per_thousand(self, value: float) -> float:
        return value * 1000 / self.steps

    @property
    def read_units(self) -> int:
        return sum(n for op, n in self.requests.items() if op in READS)

    def dollars(self) -> dict[str, float]:
        """The bill of 1,000 such steps, by service."""
        lambda_seconds = self.steps * SCRIPTED_STEP_SECONDS
        return {
            "Step Functions": self.per_thousand(self.transitions * TRANSITION_DOLLARS),
            "Lambda": self.per_thousand(
                lambda_seconds * LAMBDA_GB * LAMBDA_GB_SECOND_DOLLARS
                + self.invocations * LAMBDA_REQUEST_DOLLARS
            ),
            "DynamoDB": self.per_thousand(
                self.write_units * WRITE_UNIT_DOLLARS + self.read_units * READ_UNIT_DOLLARS
            ),
        }


def count_run(per_invocation: int, *, steps: int = STEPS) -> Counts:
    """One run of `steps` steps on moto at `per_invocation` steps per invocation, counted."""
    # The handlers' log lines and metrics (stdout, as on Lambda) are a deployment's to read;
    # Powertools' handler keeps the stream it found at import, so it is pointed away too.
    handler = _wiring.logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    previous = handler.setStream(io.StringIO())
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return _count_run(per_invocation, steps)
    finally:
        handler.setStream(previous)


def _count_run(per_invocation: int, steps: int) -> Counts:
    started = time.perf_counter()
    with pytest.MonkeyPatch.context() as patch, deployed(patch) as stack:
        stack.configure(
            max_steps_per_invocation=per_invocation,
            agents=json.dumps({**AGENTS, "scripted-lookups": SCRIPTED_AGENT}),
        )
        runtime = _wiring.runtime()
        meter = RequestMeter(runtime.dynamodb)
        run_id = f"cost-{per_invocation}"
        state = new_scripted_run(run_id, steps=steps - 1, max_steps=steps)
        if not runtime.engine(worker_id="bench", logger=LOG).start(state):
            raise RuntimeError(f"run {run_id} exists already")
        name = runtime.start_execution(run_id, logger=LOG)
        finished = stack.finished(name, timeout=600)
        if finished["status"] != "SUCCEEDED":
            raise RuntimeError(f"{name} ended {finished['status']}: {finished.get('cause')}")
        head = runtime.store.load_head(run_id)
        if head is None or head.step != steps - 1:
            raise RuntimeError(f"run {run_id} ended at {head and head.step}, not {steps - 1}")
        requests = meter.take()
        return Counts(
            per_invocation=per_invocation,
            steps=steps,
            transitions=_transitions(stack),
            invocations=sum(1 for n, _ in stack.lambdas.invocations if n == "ratchet-step"),
            requests=Counter(r.operation for r in requests),
            write_units=_write_units(stack, requests),
            seconds=time.perf_counter() - started,
        )


def _transitions(stack: Stack) -> int:
    return sum(
        1
        for execution in stack.executions()
        for event in stack.history(execution["name"])
        if event["type"].endswith("StateEntered")
    )


def _write_units(stack: Stack, requests: list[Request]) -> int:
    sizes = {}
    for table, key in updated_keys(requests):
        found = stack.dynamodb.get_item(TableName=table, Key=json.loads(key), ConsistentRead=True)
        sizes[(table, key)] = item_size(found.get("Item", {}))
    return sum(write_units(r, sizes) for r in requests)


def report(counts: list[Counts]) -> str:
    operations = sorted({op for c in counts for op in c.requests})
    header = (
        f"{'steps/invocation':>17} {'transitions':>11} {'invocations':>11} {'DDB requests':>12} "
        + " ".join(f"{op:>{len(op)}}" for op in operations)
        + f" {'WRU':>6} {'RRU':>6}"
    )
    lines = [
        "AWS per 1,000 scripted steps: the scripted agent (200 B of arguments, a 1 KB result),",
        "counted on moto (the state machine's ASL run by moto, the step handler in process),",
        f"one run of {counts[0].steps} steps per setting, scaled to 1,000",
        "",
        header,
    ]
    for c in counts:
        label = f"{c.per_invocation}" + (" (before)" if c.per_invocation == 1 else "")
        ops = " ".join(
            f"{c.per_thousand(c.requests.get(op, 0)):>{len(op)},.0f}" for op in operations
        )
        lines.append(
            f"{label:>17} {c.per_thousand(c.transitions):>11,.0f} "
            f"{c.per_thousand(c.invocations):>11,.0f} "
            f"{c.per_thousand(sum(c.requests.values())):>12,.0f} {ops} "
            f"{c.per_thousand(c.write_units):>6,.0f} {c.per_thousand(c.read_units):>6,.0f}"
        )
    services = list(counts[0].dollars())
    lines += [
        "",
        f"{'steps/invocation':>17} "
        + " ".join(f"{s:>14}" for s in services)
        + f" {'total':>9} {'target':>7}",
    ]
    for c in counts:
        label = f"{c.per_invocation}" + (" (before)" if c.per_invocation == 1 else "")
        bill = c.dollars()
        total = sum(bill.values())
        verdict = "met" if total <= TARGET_DOLLARS else "missed"
        lines.append(
            f"{label:>17} "
            + " ".join(f"{'$' + format(bill[s], '.4f'):>14}" for s in services)
            + f" {'$' + format(total, '.4f'):>9} {verdict:>7}"
        )
    lines += [
        "",
        f"target: at most ${TARGET_DOLLARS:.2f} of AWS per 1,000 scripted steps (Step Functions,",
        f"Lambda at 512 MB arm64 and {SCRIPTED_STEP_SECONDS * 1000:.0f} ms a step, DynamoDB with "
        "1 RRU a read request; list prices)",
        "; ".join(f"{c.per_invocation}/invocation {c.seconds:.1f} s" for c in counts)
        + " (moto in-process: no network, no real latency)",
    ]
    return "\n".join(lines)


def main() -> None:
    print(report([count_run(n) for n in PER_INVOCATION]))


if __name__ == "__main__":
    main()
