"""`ratchet demo`: the pattern's story, for real, in under a minute and offline.

Worker A (a real process) runs the migration agent and is SIGKILLed during step 23, after its
tool copied the batch and before the checkpoint. Worker B, a fresh process, waits for A's lease
to lapse, resumes at step 23 from checkpoint 22 (the redelivered key changes nothing), and runs
until the agent asks for approval: the run parks, B prints the approval link and exits. A
person opens the link on `ratchet serve` (the page changes nothing) and presses Approve, as
they would from the email; worker C finishes the run. Then the demo checks the invariants and
exits non-zero if any fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunState, RunStatus, idempotency_key
from ratchet.waits import Approval, ApprovalStatus

RUN_ID = "demo-migration"
KILL_STEP = 23
LEASE_SECONDS = 1.5
TIMEOUT_SECONDS = 120.0


@dataclass
class _Demo:
    console: Console
    workdir: Path
    batches: int

    @property
    def store(self) -> str:
        return f"sqlite:///{self.workdir / 'ratchet.db'}"

    @property
    def total_steps(self) -> int:
        return self.batches + 5  # inspect, copies, approval, drop, email, then DONE

    def ratchet(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ratchet.cli", "--store", self.store, *args],
            capture_output=True,
            text=True,
            env=self._env(env),
            check=False,
        )

    def spawn_worker(self, name: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        log = (self.workdir / f"{name}.log").open("w")
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ratchet.cli",
                "--store",
                self.store,
                "worker",
                "--until-idle",
                "--worker-id",
                name,
                "--lease-seconds",
                str(LEASE_SECONDS),
            ],
            stdout=log,
            stderr=log,
            text=True,
            env=self._env(env),
        )

    def serve(self) -> tuple[subprocess.Popen[str], str]:
        """`ratchet serve` on a free port; returns the process and its base URL."""
        log_path = self.workdir / "serve.log"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ratchet.cli",
                "--store",
                self.store,
                "serve",
                "--port",
                "0",
                "--no-worker",  # the demo shows its own workers: A killed, B, C
            ],
            stdout=log_path.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            env=self._env(None),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            found = re.search(r"Serving approvals on (http://\S+)", log_path.read_text())
            if found:
                return process, found.group(1)
            time.sleep(0.05)
        process.kill()
        raise RuntimeError(f"ratchet serve did not start: {log_path.read_text()[-500:]}")

    def outbox_link(self) -> str:
        runtime = LocalRuntime.open(LocalSettings(store=self.store), create=False)
        try:
            messages = runtime.outbox.messages()
        finally:
            runtime.close()
        links = [str(m["link"]) for m in messages if m.get("channel") == "email"]
        if not links:
            raise RuntimeError("the outbox holds no approval email")
        return links[-1]

    def approvals(self) -> list[Approval]:
        runtime = LocalRuntime.open(LocalSettings(store=self.store), create=False)
        try:
            return runtime.approvals.of_run(RUN_ID)
        finally:
            runtime.close()

    def head(self) -> RunState:
        runtime = LocalRuntime.open(LocalSettings(store=self.store), create=False)
        try:
            state = runtime.store.load_head(RUN_ID)
        finally:
            runtime.close()
        assert state is not None
        return state

    def watch(self, process: subprocess.Popen[str], label: str) -> int:
        """Show the run's progress until the worker process exits; return its exit code."""
        deadline = time.monotonic() + TIMEOUT_SECONDS
        with Progress(
            TextColumn(f"  {label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps  {task.fields[status]}"),
            console=self.console,
            transient=True,
        ) as progress:
            task = progress.add_task(label, total=self.total_steps, status="")
            while process.poll() is None:
                if time.monotonic() > deadline:
                    process.kill()
                    raise TimeoutError(f"{label} did not finish in {TIMEOUT_SECONDS:.0f} s")
                state = self.head()
                # The last decision ends the run without a step of its own: a run done is
                # every step of the bar.
                done = state.status is RunStatus.DONE
                completed = self.total_steps if done else state.step
                progress.update(task, completed=completed, status=state.status.value)
                time.sleep(0.05)
        return process.wait()

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("RATCHET_FAULT", "RATCHET_STORE")}
        # DEBUG adds a line per model call, which is how the demo counts what was paid for.
        return {**env, "RATCHET_LOG_LEVEL": "DEBUG", **(extra or {})}


def run_demo(console: Console, *, batches: int = 40, keep: bool = False) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="ratchet-demo-"))
    demo = _Demo(console, workdir, batches)
    try:
        return _tell(demo)
    finally:
        if keep:
            console.print(f"\nThe demo's store is kept at {demo.store}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _tell(demo: _Demo) -> int:
    say = demo.console.print
    started = time.monotonic()
    say("[bold]Ratchet demo[/bold]: a migration agent that survives SIGKILL and waits for a person")
    say(f"Store: {demo.store} (fresh)\n")

    created = demo.ratchet(
        "start",
        "--scenario",
        "migration",
        "--run-id",
        RUN_ID,
        "--model",
        "scripted",
        "--batches",
        str(demo.batches),
    )
    if created.returncode != 0:
        say(f"[red]could not start the run:[/red] {created.stderr.strip()}")
        return 1
    say(
        f"1. Started run [cyan]{RUN_ID}[/cyan]: copy {demo.batches * 1000:,} rows of "
        f"legacy_orders in {demo.batches} batches, ask before dropping it, email a report."
    )

    say(
        f"2. Worker A starts. It will be killed with SIGKILL during step {KILL_STEP}, after its "
        "tool copied the batch and before the checkpoint."
    )
    worker_a = demo.spawn_worker("worker-A", {"RATCHET_FAULT": f"kill:after_tool@{KILL_STEP}"})
    code = demo.watch(worker_a, "worker A")
    state = demo.head()
    say(
        f"   Worker A died (exit {code}). Last checkpoint: step {state.step}, version "
        f"{state.version}; attempts at step {state.next_step}: {state.attempts}."
    )

    server, base_url = demo.serve()
    try:
        return _resume_and_approve(demo, base_url, started)
    finally:
        server.terminate()
        server.wait(timeout=10)


def _resume_and_approve(demo: _Demo, base_url: str, started: float) -> int:
    say = demo.console.print
    say(
        "3. Worker B, a fresh process, waits for A's lease to lapse and resumes from the "
        "checkpoint."
    )
    worker_b = demo.spawn_worker("worker-B", {"RATCHET_PUBLIC_URL": base_url})
    code = demo.watch(worker_b, "worker B")
    state = demo.head()
    if state.status is not RunStatus.WAITING or state.waiting is None:
        say(f"[red]expected the run to wait for approval, it is {state.status.value}[/red]")
        return 1
    say(
        f"   The run parked at step {state.step}, waiting for a person: "
        f"[italic]{state.waiting.request.prompt}[/italic]"
    )
    say(f"   Worker B exited (exit {code}): a waiting run holds no process and costs nothing.")

    link = demo.outbox_link()
    say("4. A person opens the approval link from their email (the outbox beside the store):")
    say(f"   {link}", soft_wrap=True)
    shown = _http(link)
    state = demo.head()
    say(
        f"   `ratchet serve` shows the request (HTTP {shown}); opening it decided nothing: the "
        f"run is still {state.status.value}. They press Approve."
    )
    decided = _http(link, form={"decision": "approve", "comment": "Backups verified"})
    if decided != 200 or demo.head().status is not RunStatus.RUNNING:
        say(f"[red]approving from the page failed (HTTP {decided})[/red]")
        return 1
    again = _http(link, form={"decision": "approve", "comment": "again"})
    say(f"   Approved. The same link now answers HTTP {again}: each request is decided once.")

    say("5. Worker C picks the run up and finishes it.")
    demo.watch(demo.spawn_worker("worker-C"), "worker C")
    state = demo.head()
    say(f"   Run {state.status.value} at step {state.step}: {state.summary}\n")
    return _verify(demo, state, time.monotonic() - started)


def _http(url: str, *, form: dict[str, str] | None = None) -> int:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as page:
            return int(page.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def _verify(demo: _Demo, state: RunState, elapsed: float) -> int:
    say = demo.console.print
    checked = demo.ratchet("verify", RUN_ID, "--json")
    report = json.loads(checked.stdout) if checked.stdout.strip() else {"ok": False}
    resumed_from = _last_step_by(demo, "worker-A", last=True)
    resumed_at = _last_step_by(demo, "worker-B", last=False)
    model_calls = _model_calls(demo)
    paid_twice = sum(1 for count in model_calls.values() if count > 1)
    key = idempotency_key(RUN_ID, KILL_STEP)
    approvals = demo.approvals()
    decided = [(a.status, a.channel, a.decided_by) for a in approvals]
    checks = [
        ("run finished", state.status is RunStatus.DONE, state.status.value),
        (
            f"worker B resumed at step {KILL_STEP} from checkpoint {KILL_STEP - 1}",
            (resumed_from, resumed_at) == (KILL_STEP - 1, KILL_STEP),
            f"A's last checkpoint: step {resumed_from}; B's first: step {resumed_at}",
        ),
        (
            "rows copied",
            report.get("target_rows") == report.get("source_rows"),
            f"{report.get('target_rows', 0):,} of {report.get('source_rows', 0):,}",
        ),
        ("duplicate rows", report.get("duplicate_rows") == 0, str(report.get("duplicate_rows"))),
        ("emails sent", report.get("emails_sent") == 1, str(report.get("emails_sent"))),
        ("legacy_orders dropped", report.get("legacy_dropped") is True, "yes"),
        (
            "model calls paid twice",
            paid_twice == 0 and len(model_calls) == demo.total_steps,
            f"{paid_twice} ({sum(model_calls.values())} calls for {len(model_calls)} decisions)",
        ),
        (
            f"key {key}",
            report.get("keys_delivered", 0) - report.get("keys_applied", 0) == 1,
            "delivered twice, applied once",
        ),
        (
            "approval requests",
            len(approvals) == 1
            and approvals[0].status is ApprovalStatus.APPROVED
            and approvals[0].channel == "link",
            f"{len(approvals)}, decided on the page by {approvals[0].decided_by}"
            if len(approvals) == 1
            else str(decided),
        ),
        ("verify", bool(report.get("ok")), "ok" if report.get("ok") else str(report)),
    ]
    say("[bold]Verification[/bold]")
    for label, ok, detail in checks:
        mark = "[green]ok[/green]  " if ok else "[red]FAIL[/red]"
        say(f"  {mark} {label}: {detail}")
    failed = [label for label, ok, _ in checks if not ok]
    if failed:
        say(f"\n[red]{len(failed)} invariant(s) failed.[/red] Logs: {demo.workdir}")
        return 1
    say(f"\nAll invariants hold. The demo took {elapsed:.1f} s.")
    return 0


def _log_records(demo: _Demo) -> list[dict[str, object]]:
    records = []
    for log in sorted(demo.workdir.glob("worker-*.log")):
        for line in log.read_text().splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
    return records


def _model_calls(demo: _Demo) -> Counter[int]:
    return Counter(
        int(str(r["step"])) for r in _log_records(demo) if r.get("message") == "model called"
    )


def _last_step_by(demo: _Demo, worker: str, *, last: bool) -> int | None:
    """The last (or first) step a worker checkpointed, from its own log lines."""
    steps = [
        int(str(r["step"]))
        for r in _log_records(demo)
        if r.get("message") == "checkpoint written"
        and r.get("worker_id") == worker
        and r.get("event") == "step"
    ]
    if not steps:
        return None
    return max(steps) if last else min(steps)
