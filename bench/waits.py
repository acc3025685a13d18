"""What waiting costs locally, side by side: the figures of issue 17.

    python -m bench.waits [--runs N]

- bytes: what each checkpoint of a run that waits writes (the step that parks, the settling of
  its wait, the step after), beside a plain step: a wait adds a small record, and nothing to
  the steps around it;
- the worker's sweep before each claim (the book of open waits: what is due, what has its
  event), with no waiting run, with N runs waiting for events and with N more asleep, as
  ratios (these machines are noisy). The sweep reads no head: it is two indexed queries;
- one event sent to a waiting run (posted to the mailbox and the wait settled in one commit),
  beside one plain step of the same agent.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions, RunState, utcnow
from ratchet.tools import (
    Agent,
    Done,
    StepView,
    Tool,
    ToolCall,
    ToolContext,
    ToolResult,
    wait_for_event,
)
from ratchet.tools import sleep as sleep_for
from ratchet.worker import Worker

LOG = logging.getLogger("bench.waits")


class Nothing(BaseModel):
    pass


def _policy(view: StepView) -> ToolCall | Done:
    done = [m.tool for m in view.messages]
    plan = view.params["plan"]
    if len(done) < len(plan):
        return ToolCall(name=plan[len(done)], arguments={})
    return Done(summary="done")


def _note(args: Nothing, ctx: ToolContext) -> str:
    return "noted"


def _wait(args: Nothing, ctx: ToolContext) -> ToolResult:
    return wait_for_event("ci-finished", timeout=7200)


def _nap(args: Nothing, ctx: ToolContext) -> ToolResult:
    return sleep_for(3600)


agent = Agent(
    name="bench-waits",
    tools=[
        Tool("note", "Note.", Nothing, _note),
        Tool("wait", "Wait for CI.", Nothing, _wait),
        Tool("nap", "Nap an hour.", Nothing, _nap),
    ],
    policy=_policy,
    default_params={"plan": []},
)


def _median_ms(action: Callable[[], object], repeat: int = 25) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="waiting runs in the sweep test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{Path(folder)}/b.db"))
        engine = runtime.engine(worker_id="bench", logger=LOG)
        desk = runtime.event_desk(engine)
        settle = runtime.wait_settler(engine)
        numbered = iter(range(10**9))

        def start(*plan: str, work: bool = True) -> str:
            run_id = f"r-{next(numbered)}"
            options = RunOptions(model="scripted", params={"plan": list(plan)})
            state = RunState(run_id=run_id, agent="bench.waits:agent", goal="b", options=options)
            engine.start(state)
            if work:
                Worker(engine, runtime.leases, LOG).run(until_idle=True, run_id=run_id)
            return run_id

        # Bytes: note, wait for an event, note, nap (woken), note, done.
        run_id = start("note", "wait", "note", "nap", "note")
        desk.send(run_id, "ci-finished", {"conclusion": "success"}, event_id="e-1")
        Worker(engine, runtime.leases, LOG).run(until_idle=True, run_id=run_id)
        desk.wake(run_id, by="bench")
        Worker(engine, runtime.leases, LOG).run(until_idle=True, run_id=run_id)
        print("bytes each checkpoint wrote (note, wait for an event, note, nap, note, done):")
        for checkpoint in runtime.store.list_checkpoints(run_id):
            event = checkpoint.event
            what = getattr(event, "call", None)
            name = f"{event.kind} {what.name}" if what is not None else event.kind
            print(f"  v{checkpoint.version:<3} {name:<14} {checkpoint.size:>6,} B")

        # The sweep: nothing waiting; N runs waiting for events; N more asleep.
        empty = _median_ms(lambda: settle(utcnow()))
        for _ in range(args.runs):
            start("wait")
        events = _median_ms(lambda: settle(utcnow()))
        for _ in range(args.runs):
            start("nap")
        both = _median_ms(lambda: settle(utcnow()))
        head_read = _median_ms(lambda: engine.load(run_id))
        print("\nthe worker's sweep before each claim (median of 25):")
        rows = [
            ("no waiting run", empty),
            (f"{args.runs:,} runs waiting for events", events),
            (f"and {args.runs:,} more asleep", both),
            ("(for scale: one head read)", head_read),
        ]
        for label, ms in rows:
            print(f"  {label:<36} {ms:8.3f} ms  {ms / empty:6.2f}x")

        # One event sent to a waiting run, beside a plain step.
        waiting = [start("wait") for _ in range(25)]
        sent = iter(waiting)
        send_ms = _median_ms(
            lambda: desk.send(next(sent), "ci-finished", {"conclusion": "success"})
        )
        plain = [start("note", work=False) for _ in range(25)]
        stepped = iter(plain)
        plain_ms = _median_ms(lambda: engine.advance(next(stepped)))
        print("\none event sent to a waiting run, posted and its wait settled (median of 25):")
        print(
            f"  send_event                           {send_ms:8.3f} ms  {send_ms / plain_ms:6.2f}x"
        )
        print(f"  one plain step (a tool call)         {plain_ms:8.3f} ms    1.00x")
        runtime.close()


if __name__ == "__main__":
    main()
