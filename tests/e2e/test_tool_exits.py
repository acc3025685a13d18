"""A tool's `SystemExit` in a real `ratchet worker` process: a failed attempt with that cause,
recorded and retried like any other, never the end of the worker (issue 22, item 7)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ratchet.state import RunStatus
from tests import breaker_agent
from tests.processes import Cli, clean_env

pytestmark = pytest.mark.slow


def test_a_tool_calling_sys_exit_fails_its_attempts_and_the_worker_goes_on(tmp_path: Path):
    # Given a run whose tool calls sys.exit(7), and another run beside it
    shutil.copy(breaker_agent.__file__, tmp_path / "breaker.py")
    cli = Cli(tmp_path)

    def ratchet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cli.argv(*args),
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    for agent, run_id in (("breaker:exits", "exits"), ("breaker:agent", "other")):
        started = ratchet("start", "--agent", agent, "--model", "scripted", "--run-id", run_id)
        assert started.returncode == 0, started.stderr

    # When one worker works them until idle
    worked = ratchet("worker", "--until-idle", "--worker-id", "w")

    # Then the worker lived to the end, working both runs, and the run failed with the cause
    assert worked.returncode == 0, worked.stderr
    failed = cli.head("exits")
    assert failed.status is RunStatus.FAILED
    assert failed.error == (
        "step 1 failed 3 times; last error: exit_process raised SystemExit: 7"
    ), failed.error
    assert "the worker died" not in (failed.error or "")
    assert cli.head("other").status is RunStatus.FAILED  # at its step 2, as it means to
    logged = [json.loads(line) for line in worked.stderr.splitlines() if line.startswith("{")]
    strikes = [r for r in logged if r.get("message") == "step attempt failed"]
    assert [r["error_type"] for r in strikes if r["run_id"] == "exits"] == ["ToolFailed"] * 3
