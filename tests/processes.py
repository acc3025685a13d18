"""Drive the real `ratchet` command in subprocesses, each test on its own store."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratchet.agents import load_agent
from ratchet.runtime import runtime_for
from ratchet.runtime.local import LocalSettings
from ratchet.state import RunState, RunStatus

RATCHET = [sys.executable, "-m", "ratchet.cli"]
SERVE_PATIENCE = 60.0
"""Seconds `ratchet serve` has to print its banner, and to stop once told to."""


def clean_env(**extra: str) -> dict[str, str]:
    drop = {"RATCHET_FAULT", "RATCHET_STORE", "ANTHROPIC_API_KEY"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


CHECKOUT = Path(__file__).resolve().parent.parent


def checkout_env(**extra: str) -> dict[str, str]:
    """`clean_env` for a process that works in a folder of the test's own (a Postgres store's
    processes keep their host's files in the working directory) and still imports the tests'
    agents (`tests.*`) from this checkout, which `python -m` finds only from its own folder."""
    path = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH", "")) if p)
    return clean_env(**{"PYTHONPATH": path, **extra})


@dataclass
class Cli:
    root: Path

    @property
    def store(self) -> str:
        return f"sqlite:///{self.root / 'ratchet.db'}"

    def argv(self, *args: str) -> list[str]:
        return [*RATCHET, "--store", self.store, *args]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of this store's processes."""
        return clean_env(**extra)

    def run(self, *args: str, fault: str | None = None, timeout: float = 120) -> Any:
        env = self.env(RATCHET_FAULT=fault) if fault else self.env()
        return subprocess.run(
            self.argv(*args), capture_output=True, text=True, env=env, timeout=timeout, check=False
        )

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, f"ratchet {' '.join(args)} failed: {done.stderr}"
        return str(done.stdout)

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def spawn_worker(
        self, name: str, *, fault: str | None = None, lease: float = 0.5, until_idle: bool = True
    ) -> subprocess.Popen[str]:
        env = self.env(RATCHET_FAULT=fault) if fault else self.env()
        log = (self.root / f"{name}.log").open("a")
        flags = ["--until-idle"] if until_idle else []
        return subprocess.Popen(
            self.argv("worker", *flags, "--worker-id", name, "--lease-seconds", str(lease)),
            stdout=log,
            stderr=log,
            text=True,
            env=env,
        )

    def work_until_idle(self, name: str = "finisher", lease: float = 0.5) -> None:
        code = self.spawn_worker(name, lease=lease).wait(timeout=120)
        assert code == 0, (self.root / f"{name}.log").read_text()

    # Reads go through the library in this process: the processes under test are the workers,
    # and a CLI start-up per poll would only slow the tests down.

    def head(self, run_id: str) -> RunState:
        runtime = runtime_for(LocalSettings(store=self.store), create=False)
        try:
            state = runtime.store.load_head(run_id)
        finally:
            runtime.close()
        assert state is not None, f"no run {run_id}"
        return state

    def verify(self, run_id: str) -> dict[str, Any]:
        state = self.head(run_id)
        runtime = runtime_for(LocalSettings(store=self.store), create=False)
        try:
            agent = load_agent(state.agent)
            assert agent.verify is not None
            return agent.verify(runtime.context(run_id, state.options), state)
        finally:
            runtime.close()

    def finish_migration(self, run_id: str) -> dict[str, Any]:
        """Work the run to its end, approving the drop when it asks; return `verify`."""
        for _ in range(5):
            self.work_until_idle()
            if self.head(run_id).status is RunStatus.WAITING:
                self.ok("approve", run_id, "--comment", "ok", "--by", "tester")
                continue
            break
        state = self.head(run_id)
        assert state.status is RunStatus.DONE, state
        return self.verify(run_id)


@dataclass
class PostgresCli(Cli):
    """`Cli` on a Postgres store: `url` names its database; the files its processes keep on
    their host are in the working directory's .ratchet (the test's: see tests/e2e's)."""

    url: str = ""

    @property
    def store(self) -> str:
        return self.url

    def env(self, **extra: str) -> dict[str, str]:
        return checkout_env(**extra)


@dataclass
class Served:
    """A `ratchet serve` process, where it listens, and the file its output goes to."""

    process: subprocess.Popen[str]
    base: str
    log: Path

    @property
    def printed(self) -> str:
        return self.log.read_text()


@contextmanager
def serving(
    argv: Sequence[str],
    *,
    log: Path,
    env: dict[str, str],
    cwd: Path | None = None,
    ready: str = r"^(A worker|No worker)",
    address: str = r"Serving approvals on (http://\S+)",
) -> Iterator[Served]:
    """Start `ratchet serve` (`argv`), wait until its banner is printed to the end (`ready`:
    its last line, which says whether a worker works the runs), read where it listens
    (`address`'s group), and stop it on the way out: SIGTERM, then a kill if it does not stop
    in time."""
    with log.open("w") as output:
        process = subprocess.Popen(
            list(argv), cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, text=True
        )
    try:
        deadline = time.monotonic() + SERVE_PATIENCE
        while not re.search(ready, log.read_text(), re.MULTILINE):
            assert process.poll() is None, f"ratchet serve exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"ratchet serve never listened:\n{log.read_text()}"
            time.sleep(0.05)
        found = re.search(address, log.read_text())
        assert found, log.read_text()
        yield Served(process, found.group(1), log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=SERVE_PATIENCE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=SERVE_PATIENCE)
