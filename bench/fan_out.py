"""Child runs: the time from a parent's step that starts its children to its resumption, for a
fan-out of 10 and of 100 (`tests.children_agent`: each child works one 0.05 s step and is
done), 4 workers in this process on one SQLite store, side by side.

    python -m bench.fan_out

For each fan-out it prints the seconds from the commit of the parent's starting step (the
children are started before it) to the commit that settled its wait (the last child's end),
that per child, the seconds to the parent's end, and the children that worked more than once
(none, or the guarantee broke). The ratio of the per-child times says whether settling grows
with the fan-out beyond the children's own work: each child's end reads its siblings' heads
until the first still running, so a wide fan-out reads more per end.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import (
    Finished,
    RunOptions,
    RunState,
    RunStatus,
    StepCompleted,
    WaitSettled,
)
from ratchet.worker import Worker
from tests.children_agent import PARENT, parent

WORKERS = 4
FAN_OUTS = (10, 100)


@dataclass(frozen=True)
class FanOut:
    children: int
    to_resumption: float
    to_end: float
    worked_twice: int
    all_done: bool


def fan_out(children: int, root: Path) -> FanOut:
    store = f"sqlite:///{root / 'ratchet.db'}"
    log = root / "work.log"
    quiet = logging.getLogger("bench.fan_out.quiet")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    runtime = LocalRuntime.open(LocalSettings(store=store))
    params = {**parent.default_params, "children": children, "log": str(log)}
    state = RunState(run_id="p", agent=PARENT, goal="Delegate", options=RunOptions(params=params))
    runtime.engine(worker_id="bench", logger=quiet).start(state)
    runtime.close()

    def work(n: int) -> None:
        mine = LocalRuntime.open(LocalSettings(store=store))
        try:
            engine = mine.engine(worker_id=f"w{n}", logger=quiet)
            Worker(
                engine,
                mine.leases,
                quiet,
                poll_seconds=0.01,
                settle_waits=mine.wait_settler(engine),
            ).run(until_idle=True)
        finally:
            mine.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    runtime = LocalRuntime.open(LocalSettings(store=store), create=False)
    try:
        records = runtime.store.list_checkpoints("p")
        started = next(c for c in records if isinstance(c.event, StepCompleted)).created_at
        resumed = next(c for c in records if isinstance(c.event, WaitSettled)).created_at
        ended = next(c for c in records if isinstance(c.event, Finished)).created_at
        heads = [runtime.store.load_head(f"p.step-1.{i}") for i in range(children)]
    finally:
        runtime.close()
    worked = Counter(line.split()[0] for line in log.read_text().splitlines())
    return FanOut(
        children=children,
        to_resumption=(resumed - started).total_seconds(),
        to_end=(ended - started).total_seconds(),
        worked_twice=sum(1 for n in worked.values() if n > 1),
        all_done=all(h is not None and h.status is RunStatus.DONE for h in heads),
    )


def fan_out_section() -> None:
    print()
    print(
        f"Child runs: a parent starting N children (one 0.05 s step each), {WORKERS} workers "
        "(SQLite, in this process)"
    )
    print(
        f"{'children':>8} {'to resumption s':>15} {'per child ms':>12} {'to end s':>8} "
        f"{'worked twice':>12} {'all done':>8}"
    )
    rows = []
    for children in FAN_OUTS:
        with tempfile.TemporaryDirectory() as root:
            row = fan_out(children, Path(root))
        rows.append(row)
        print(
            f"{row.children:>8} {row.to_resumption:>15.2f} "
            f"{row.to_resumption / row.children * 1000:>12.1f} {row.to_end:>8.2f} "
            f"{row.worked_twice:>12} {'yes' if row.all_done else 'NO':>8}"
        )
    small, large = rows[0], rows[-1]
    ratio = (large.to_resumption / large.children) / (small.to_resumption / small.children)
    print(f"{'per child, 100 / 10':>28} {ratio:>6.2f}x")


if __name__ == "__main__":
    fan_out_section()
