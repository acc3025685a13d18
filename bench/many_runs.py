"""Many runs, three measures side by side.

Listing runs on DynamoDB (moto, in this process): the Scan that `list_runs` is against a page
of the runs index (`list_page`), side by side, for tables of 100, 1,000 and 10,000 runs (others
with `--runs`), each run with `--steps` step records (10 by default) beside its head. The
tables are filled as `tests.dynamodb_seed` fills them, with BatchWriteItem, the items the
store's commits would leave (10,000 runs of 10 steps: ~123,000 items in ~25 s).

Concurrency limits (a SQLite store, 4 workers in this process): 20 runs of
`tests.bounded_agent` (2 steps of 0.1 s each) with its bound of 3, and the same with no bound,
side by side: the steps in flight in each tenth of a second, the most at once, and how long the
20 runs took.

Child runs (`bench.fan_out`): a parent starting 10 and 100 children, 4 workers, the time
from its starting step to its resumption.

Postgres beside SQLite (last; alone with `--stores`): 200 runs of `tests.keyed_effects_agent`
(3 steps, each applying one keyed effect to a SQLite file of its own, the same for both
stores) worked by 4 `ratchet worker --until-idle` processes, on a SQLite store and on a
Postgres store (a throwaway cluster, `tests.postgres_support`): steps per second from the
first step's commit to the last, and the wall time with the workers' start-up.

    python -m bench.many_runs [--runs 100 1000 10000] [--steps 10] [--limit 50] [--stores]

For each table it prints the items the table holds, then for the Scan and for a page of done
runs (a third of them) and a page of every status: the items DynamoDB read (`ScannedCount`,
what a request is billed by), their share of the Scan's (1/N: N times fewer), the requests
(the Scan pages through the table a MB at a time, as DynamoDB's does), and moto's time. The
items read are what DynamoDB would read; moto's times are not DynamoDB's: moto answers a Query
of an index by going through the whole table, so there a page is slower than it would be, and
it sorts the whole table for each page of a Scan, so its Scan's time grows with the square of
the table (10,000 runs of 10 steps take it ~60 s; `--steps 20`, ~3 minutes).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from moto import mock_aws

from ratchet.adapters.dynamodb.store import DynamoDbCheckpointStore
from ratchet.state import RunState
from tests.dynamodb_seed import seed_runs
from tests.dynamodb_support import REGION, SETTINGS, create_tables


@dataclass
class Reads:
    """The items each Query or Scan read, and the requests, from botocore's after-call event."""

    items: int = 0
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    """A page's first reads go out from threads of their own."""

    def __call__(self, parsed: dict[str, Any], **_: Any) -> None:
        with self.lock:
            self.requests += 1
            self.items += int(parsed.get("ScannedCount", 0))


@dataclass(frozen=True)
class Measured:
    items: int
    requests: int
    milliseconds: float
    listed: int


def measure(reads: Reads, read: Callable[[], list[Any]]) -> Measured:
    reads.items = reads.requests = 0
    started = time.perf_counter()
    listed = read()
    elapsed = (time.perf_counter() - started) * 1000
    return Measured(reads.items, reads.requests, elapsed, len(listed))


def share(page: Measured, scan: Measured) -> str:
    """The page's items read as a share of the Scan's: 1/N, the Scan reading N times more."""
    return f"1/{scan.items / page.items:,.0f}"


def bench(runs: int, steps: int, limit: int) -> dict[str, Any]:
    with mock_aws():
        client = boto3.client(
            "dynamodb", region_name=REGION, aws_access_key_id="b", aws_secret_access_key="b"
        )
        create_tables(
            client,
            checkpoints=SETTINGS.checkpoints_table,
            idempotency=SETTINGS.idempotency_table,
            app=SETTINGS.app_table,
        )
        store = DynamoDbCheckpointStore(
            client, table=SETTINGS.checkpoints_table, ledger_table=SETTINGS.idempotency_table
        )
        items = seed_runs(client, table=SETTINGS.checkpoints_table, runs=runs, steps=steps).items
        reads = Reads()
        client.meta.events.register("after-call.dynamodb.Scan", reads)
        client.meta.events.register("after-call.dynamodb.Query", reads)
        scan = measure(reads, store.list_runs)
        assert scan.listed == runs, f"the Scan found {scan.listed} of {runs} heads"
        return {
            "runs": runs,
            "items": items,
            "scan": scan,
            "done": measure(reads, lambda: store.list_page(status="done", limit=limit)),
            "every": measure(reads, lambda: store.list_page(limit=limit)),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--stores", action="store_true", help="only Postgres beside SQLite")
    args = parser.parse_args(argv)
    if args.stores:
        stores_section()
        return
    print(
        f"Listing runs on DynamoDB (moto): the Scan against a page of {args.limit} from the "
        f"runs index; {args.steps} step records a run"
    )
    print(
        f"{'runs':>7} {'items':>8} | {'Scan read':>9} {'reqs':>4} {'ms':>8} | "
        f"{'done page read':>14} {'reqs':>4} {'ms':>7} {'of Scan':>8} | "
        f"{'any page read':>13} {'reqs':>4} {'ms':>7} {'of Scan':>8}"
    )
    for runs in args.runs:
        row = bench(runs, args.steps, args.limit)
        scan, done, every = row["scan"], row["done"], row["every"]
        print(
            f"{runs:>7,} {row['items']:>8,} | {scan.items:>9,} {scan.requests:>4} "
            f"{scan.milliseconds:>8.1f} | "
            f"{done.items:>14,} {done.requests:>4} {done.milliseconds:>7.1f} "
            f"{share(done, scan):>8} | "
            f"{every.items:>13,} {every.requests:>4} {every.milliseconds:>7.1f} "
            f"{share(every, scan):>8}"
        )


def in_flight_over_time(bound: int | None, root: Path) -> tuple[list[int], int, float]:
    """Steps in flight in each 0.1 s, the most at once, and the seconds the 20 runs took."""
    from ratchet.agents import AgentRegistry
    from ratchet.limits import ConcurrencyLimits
    from ratchet.runtime.local import LocalRuntime, LocalSettings
    from ratchet.state import RunOptions
    from ratchet.worker import Worker
    from tests.bounded_agent import AGENT, in_flight

    store = f"sqlite:///{root / 'ratchet.db'}"
    log = root / "steps.log"
    quiet = logging.getLogger("bench.many_runs.quiet")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    runtime = LocalRuntime.open(LocalSettings(store=store))
    engine = runtime.engine(worker_id="bench", logger=quiet)
    for n in range(20):
        options = RunOptions(params={"log": str(log), "steps": 2, "hold": 0})
        engine.start(RunState(run_id=f"r-{n:02d}", agent=AGENT, goal="Work", options=options))
    runtime.close()
    overrides = {} if bound is not None else {"bounded": 10_000}

    def work(n: int) -> None:
        mine = LocalRuntime.open(LocalSettings(store=store))
        try:
            Worker(
                mine.engine(worker_id=f"w{n}", logger=quiet),
                mine.leases,
                quiet,
                poll_seconds=0.01,
                limits=ConcurrencyLimits(AgentRegistry.local(), overrides),
            ).run(until_idle=True)
        finally:
            mine.close()

    started = time.time()
    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.time() - started
    most, _ = in_flight(log)
    buckets = [0] * (int(took * 10) + 1)
    spans: dict[str, float] = {}
    for line in log.read_text().splitlines():
        what, moment, run_id, _ = line.split()
        if what == "start":
            spans[run_id] = float(moment)
            continue
        for tenth in range(
            int((spans[run_id] - started) * 10), int((float(moment) - started) * 10)
        ):
            buckets[tenth] += 1
    return buckets, most, took


def concurrency_section() -> None:
    print()
    print("Concurrency limits: 20 runs of a 2-step agent, 4 workers (SQLite, in this process)")
    rows = {}
    for label, bound in (("max_concurrent=3", 3), ("no bound", None)):
        with tempfile.TemporaryDirectory() as root:
            rows[label] = in_flight_over_time(bound, Path(root))
    print(f"{'':>17} {'most at once':>12} {'seconds':>8}  steps in flight per 0.1 s")
    for label, (buckets, most, took) in rows.items():
        series = "".join(str(min(b, 9)) for b in buckets)
        print(f"{label:>17} {most:>12} {took:>8.2f}  {series}")
    bounded, free = rows["max_concurrent=3"][2], rows["no bound"][2]
    print(f"{'bounded / free':>17} {'':>12} {bounded / free:>7.2f}x")


STORE_RUNS = 200
STORE_WORKERS = 4
STORE_STEPS = 3
REPO = Path(__file__).resolve().parents[1]


def steps_per_second(store: str, root: Path) -> tuple[float, float]:
    """Steps a second over `STORE_RUNS` runs worked by `STORE_WORKERS` worker processes on
    `store`, from the first step's commit to the last, and the wall seconds the workers took
    (with their start-up)."""
    import os
    import subprocess
    import sys

    import ratchet
    from ratchet.state import RunStatus, StepCompleted
    from tests.keyed_effects_agent import AGENT

    client = ratchet.connect(store)
    worker_argv = [sys.executable, "-m", "ratchet.cli"]
    for n in range(STORE_RUNS):
        client.start(run_id=f"r-{n:03d}", agent=AGENT, input={"steps": STORE_STEPS})
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(REPO)) if p)
    env = {k: v for k, v in os.environ.items() if k not in {"RATCHET_FAULT", "RATCHET_STORE"}}
    started = time.monotonic()
    workers = [
        subprocess.Popen(
            [*worker_argv, "--store", store, "worker", "--until-idle", "--worker-id", f"w{n}"],
            cwd=root,
            env={**env, "PYTHONPATH": path},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in range(STORE_WORKERS)
    ]
    for worker in workers:
        worker.wait(timeout=600)
    wall = time.monotonic() - started
    commits = []
    for n in range(STORE_RUNS):
        head = client.runtime.store.load_head(f"r-{n:03d}")
        assert head is not None, n
        assert head.status is RunStatus.DONE, head
        commits += [
            c.created_at
            for c in client.runtime.store.list_checkpoints(f"r-{n:03d}")
            if isinstance(c.event, StepCompleted)
        ]
    client.runtime.close()
    span = (max(commits) - min(commits)).total_seconds()
    return len(commits) / span, wall


def stores_section() -> None:
    import os

    from tests.postgres_support import cluster

    print()
    print(
        f"Postgres beside SQLite: {STORE_RUNS} runs x {STORE_STEPS} steps over "
        f"{STORE_WORKERS} worker processes"
    )
    rows = {}
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for label in ("sqlite", "postgres"):
            (root / label).mkdir()
            os.chdir(root / label)  # the agent's world and the store's host files
            try:
                if label == "sqlite":
                    store = f"sqlite:///{root / label / 'ratchet.db'}"
                else:
                    postgres = cluster()
                    store = postgres.url(postgres.fresh_database())
                rows[label] = steps_per_second(store, root / label)
            finally:
                os.chdir(here)
    print(f"{'store':>9} {'steps/s':>8} {'wall s':>7}")
    for label, (rate, wall) in rows.items():
        print(f"{label:>9} {rate:>8.1f} {wall:>7.1f}")
    print(f"{'pg/sqlite':>9} {rows['postgres'][0] / rows['sqlite'][0]:>7.2f}x")


if __name__ == "__main__":
    import sys

    from bench.fan_out import fan_out_section

    main()
    if "--stores" not in sys.argv:
        concurrency_section()
        fan_out_section()
        stores_section()
