"""Webhooks without `ratchet serve` (issue 35): each `ratchet worker` with `RATCHET_WEBHOOKS`
sends, and `ratchet run` and `ratchet worker --until-idle` send what they committed before they
exit. Two workers at once share the deliveries through the store's claims: each change is
delivered, with its id, and none twice while both live (the receiver answers slowly, so that
both senders hold the same deliveries due at once). An agent's own `webhooks` are sent to
beside the deployment's."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from ratchet.state import RunStatus
from tests.e2e.test_outbound_webhooks import Receiver, _hooked, _until, serving
from tests.e2e.test_serve_local import PATIENCE, _env
from tests.processes import Cli

pytestmark = pytest.mark.slow

ANSWER_SECONDS = 0.3
"""How long the receiver takes to answer: longer than a sender's pass (0.2 s), so that the
other sender reads the same deliveries due while one is being sent."""


@pytest.fixture
def slow_receiver() -> Iterator[tuple[Receiver, str]]:
    kept = Receiver()
    with serving(kept, answer_after=ANSWER_SECONDS) as url:
        yield kept, url


def _worker(cli: Cli, name: str, url: str) -> subprocess.Popen[str]:
    log = (cli.root / f"{name}.log").open("a")
    return subprocess.Popen(
        cli.argv("worker", "--worker-id", name, "--lease-seconds", "0.5"),
        stdout=log,
        stderr=log,
        text=True,
        env=_hooked(url),
    )


def _sender_started(store: Path) -> bool:
    """Whether a sender has marked where the store's webhooks start (`push_start`)."""
    if not store.exists():
        return False
    with sqlite3.connect(store) as db:
        try:
            return bool(db.execute("SELECT count(*) FROM push_start").fetchone()[0])
        except sqlite3.OperationalError:
            return False


def test_two_workers_deliver_each_change_once_without_serve(tmp_path, slow_receiver):
    kept, url = slow_receiver
    cli = Cli(tmp_path)
    runs = ["t1", "t2", "t3"]
    workers = [_worker(cli, name, url) for name in ("wa", "wb")]
    try:
        _until("a sender started", lambda: _sender_started(tmp_path / "ratchet.db"))
        for run_id in runs:
            cli.ok("start", "--scenario", "migration", "--batches", "1", "--run-id", run_id)
        for run_id in runs:
            _until(f"{run_id} waits", partial(_waiting, cli, run_id))
            cli.ok("approve", run_id, "--comment", "ok", "--by", "tester")
        _until("every change delivered", lambda: len(set(_ids(kept))) >= 4 * len(runs))
        listed = _until("each delivery recorded delivered", lambda: _settled(cli, 4 * len(runs)))
        time.sleep(2 * ANSWER_SECONDS)  # a repeat, were one in flight, arrives meanwhile
        gone = {
            n: w.returncode
            for n, w in zip(("wa", "wb"), workers, strict=True)
            if w.poll() is not None
        }
        assert not gone, f"both senders lived throughout: {gone}\n{_logs(cli, gone)}"
        received = list(kept.received)
    finally:
        for process in workers:
            process.send_signal(signal.SIGTERM)
        for process in workers:
            process.wait(timeout=PATIENCE)

    sent = [r.headers["Ratchet-Delivery"] for r in received]
    twice = {i: n for i, n in Counter(sent).items() if n > 1}
    print(f"two workers: {len(sent)} deliveries of {len(set(sent))} changes, {len(twice)} twice")
    assert not twice, f"delivered twice while both senders lived: {twice}"
    bodies = [json.loads(r.body) for r in received]
    for delivery, body in zip(sent, bodies, strict=True):
        assert delivery.startswith(f"{body['id']}@")
    by_run: dict[str, list[str]] = {}
    for body in sorted(bodies, key=lambda b: (b["run_id"], b["version"])):
        by_run.setdefault(body["run_id"], []).append(body["status"])
    assert by_run == {r: ["running", "waiting", "running", "done"] for r in runs}
    assert sorted((d["id"], d["attempts"]) for d in listed) == sorted((i, 1) for i in sent)


def _logs(cli: Cli, names: dict[str, int | None]) -> str:
    return "\n".join(f"--- {n}.log:\n{(cli.root / f'{n}.log').read_text()}" for n in names)


def _waiting(cli: Cli, run_id: str) -> bool:
    return cli.head(run_id).status is RunStatus.WAITING


def _ids(kept: Receiver) -> list[str]:
    with kept.lock:
        return [r.headers["Ratchet-Delivery"] for r in kept.received]


def _settled(cli: Cli, changes: int) -> list[dict[str, Any]]:
    """The deliveries listed, once at least `changes` are and each was delivered; else none."""
    listed: list[dict[str, Any]] = json.loads(cli.ok("deliveries", "--json"))["deliveries"]
    return (
        listed if len(listed) >= changes and all(d["state"] == "delivered" for d in listed) else []
    )


def test_run_and_an_idle_worker_send_what_they_committed_before_they_exit(tmp_path, slow_receiver):
    kept, url = slow_receiver
    cli = Cli(tmp_path)

    ran = subprocess.run(
        cli.argv("run", "--scenario", "migration", "--batches", "1", "--run-id", "f1"),
        capture_output=True,
        text=True,
        env=_hooked(url),
        timeout=PATIENCE,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    # No sender runs once `ratchet run` has exited: what was received came from it.
    parked = _statuses(kept)
    cli.ok("approve", "f1", "--comment", "ok", "--by", "tester")
    worked = subprocess.run(
        cli.argv("worker", "--until-idle", "--worker-id", "idle"),
        capture_output=True,
        text=True,
        env=_hooked(url),
        timeout=PATIENCE,
        check=False,
    )
    assert worked.returncode == 0, worked.stderr
    ended = _statuses(kept)

    assert parked == ["running", "waiting"]
    assert ended == ["running", "waiting", "running", "done"]
    assert "still owed" not in ran.stderr + worked.stderr


HOOKED_AGENT = '''
from pydantic import BaseModel

from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, tool


class Greeting(BaseModel):
    name: str


@tool(side_effect=True)
def greet(args: Greeting, ctx: ToolContext) -> str:
    """Greet someone, once per key."""
    return f"hello {args.name}"


def scripted(view: StepView) -> ToolCall | Done:
    if not view.messages:
        return ToolCall(name="greet", arguments={"name": "ada"})
    return Done(summary="greeted ada")


agent = Agent(
    name="hooked", goal="Greet ada.", tools=[greet], policy=scripted, webhooks=[AGENT_URL]
)
'''


def test_an_agents_own_webhooks_are_sent_beside_the_deployments(tmp_path, slow_receiver):
    kept, url = slow_receiver
    cli = Cli(tmp_path)
    code = tmp_path / "code"
    code.mkdir()
    agent_url = f"{url}/agent"
    (code / "hooked.py").write_text(HOOKED_AGENT.replace("AGENT_URL", repr(agent_url)))
    path = os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])

    def run(run_id: str, env: dict[str, str]) -> None:
        done = subprocess.run(
            cli.argv("run", "--agent", "hooked:agent", "--run-id", run_id),
            capture_output=True,
            text=True,
            env={**env, "PYTHONPATH": path},
            timeout=PATIENCE,
            check=False,
        )
        assert done.returncode == 0, done.stderr

    # The agent's URL alone (no RATCHET_WEBHOOKS): `ratchet run` sends to it.
    run("a1", _env())
    # Beside the deployment's: each change to both.
    run("a2", _hooked(f"{url}/deployment"))

    sent = sorted(
        (json.loads(r.body)["run_id"], json.loads(r.body)["status"], r.headers["Path"])
        for r in kept.received
    )
    assert sent == [
        ("a1", "done", "/hook/agent"),
        ("a1", "running", "/hook/agent"),
        ("a2", "done", "/hook/agent"),
        ("a2", "done", "/hook/deployment"),
        ("a2", "running", "/hook/agent"),
        ("a2", "running", "/hook/deployment"),
    ]


def _statuses(kept: Receiver) -> list[str]:
    """The statuses received, in the order of the changes (a sender may send two due at once in
    either order)."""
    bodies = sorted((json.loads(r.body) for r in kept.received), key=lambda b: b["version"])
    return [b["status"] for b in bodies]
