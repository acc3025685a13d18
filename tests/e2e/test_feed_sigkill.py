"""`client.follow` across SIGKILLs (issue 35): a follower process reads a run's feed while the
run's worker is SIGKILLed right after a commit, `ratchet serve` (whose worker works the run to
its wait) is SIGKILLed with the run parked, and the follower itself is SIGKILLed and started
again after the last id it printed; another worker is SIGKILLed after the commit that follows
the approval, and a last one ends the run. The two followers together print every event of the
run exactly once, in order, and the second ends by itself when the run is done."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ratchet.state import RunStatus
from tests.e2e.test_serve_local import PATIENCE, ratchet_serve, until_status
from tests.processes import Cli, clean_env

pytestmark = pytest.mark.slow

FOLLOWER = """
import json, sys
import ratchet
store, run_id, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
with ratchet.connect(store) as client:
    for event in client.follow(run_id, after=after, poll=0.02):
        print(json.dumps(event.data()), flush=True)
"""


def _follow(cli: Cli, run_id: str, after: int, name: str) -> tuple[subprocess.Popen[str], Path]:
    out = cli.root / f"{name}.jsonl"
    with out.open("w") as lines:
        process = subprocess.Popen(
            [sys.executable, "-c", FOLLOWER, cli.store, run_id, str(after)],
            stdout=lines,
            stderr=(cli.root / f"{name}.err").open("w"),
            text=True,
            env=clean_env(),
        )
    return process, out


def _printed(out: Path) -> list[dict[str, Any]]:
    # A line the follower was killed in the middle of is not an event it printed.
    return [
        json.loads(line) for line in out.read_text().splitlines(keepends=True) if line[-1:] == "\n"
    ]


def _until(what: str, check: Any) -> Any:
    deadline = time.monotonic() + PATIENCE
    while not (value := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)
    return value


def test_follow_sees_each_event_once_across_sigkills_of_workers_serve_and_itself(tmp_path):
    cli = Cli(tmp_path)
    cli.ok("start", "--scenario", "migration", "--batches", "3", "--run-id", "f1")
    first, first_out = _follow(cli, "f1", 0, "follower-1")

    doomed = cli.spawn_worker("doomed-1", fault="kill:after_commit@2")
    assert doomed.wait(timeout=PATIENCE) == -signal.SIGKILL
    with ratchet_serve(cli, "--port", "0") as served:
        until_status(cli, "f1", RunStatus.WAITING)
        _until(
            "the follower reads the wait", lambda: _printed(first_out)[-1:][0]["type"] == "waiting"
        )
        served.process.send_signal(signal.SIGKILL)
        served.process.wait(timeout=PATIENCE)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=PATIENCE)
    before = _printed(first_out)
    second, second_out = _follow(cli, "f1", before[-1]["id"], "follower-2")

    cli.ok("approve", "f1", "--comment", "ok", "--by", "tester")
    doomed = cli.spawn_worker("doomed-2", fault="kill:after_commit@6")
    assert doomed.wait(timeout=PATIENCE) == -signal.SIGKILL
    cli.work_until_idle()
    assert second.wait(timeout=PATIENCE) == 0, (tmp_path / "follower-2.err").read_text()

    events = before + _printed(second_out)
    ids = [e["id"] for e in events]
    assert ids == [c["version"] for c in cli.json("history", "f1")["checkpoints"]]
    assert [e["type"] for e in events] == [
        "started",
        "step",
        "step",
        "step",
        "step",
        "waiting",
        "decided",
        "step",
        "step",
        "done",
    ]
    assert [e["step"] for e in events if e["type"] == "step"] == [1, 2, 3, 4, 6, 7]
