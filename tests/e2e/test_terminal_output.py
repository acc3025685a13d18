"""What the `ratchet` command prints as runs move (issue 10, "Terminal output"): a line per step
when piped, JSON lines with `--json`, `list`, `watch`, `history` in words, honest `status`.

Every test drives the installed console script in subprocesses (stdout a pipe, never a
terminal) against its own store under `tmp_path`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import breaker_agent

RATCHET = Path(sys.executable).with_name("ratchet")
TIMEOUT = 120
SCRUBBED = {"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "RATCHET_FAULT", "RATCHET_STORE"}
# batches=2: step 1 inspect, 2-3 copy, 4 ask; then 5 drop (if approved), 6 email, DONE
MIGRATION = ("--scenario", "migration", "--param", "batches=2")
STEP_LINE = re.compile(
    r"^(?P<run>\S+)  step (?P<step>\d+)  (?P<tool>\w+)\((?P<args>.*)\) -> (?P<result>.+)  "
    r"(?P<ms>\d+) ms  \[(?P<done>\d+)/(?P<total>\d+)\]$"
)
FAILING_AGENT = Path(breaker_agent.__file__).read_text(encoding="utf-8")


class Cli:
    def __init__(self, tmp_path: Path) -> None:
        self.cwd = tmp_path
        self.url = f"sqlite:///{tmp_path / 'store' / 'ratchet.db'}"
        self.env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}

    def command(self, *args: str) -> list[str]:
        return [str(RATCHET), "--store", self.url, *args]

    def __call__(self, *args: str, code: int | None = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.command(*args),
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        if code is not None:
            assert done.returncode == code, (args, done.stdout, done.stderr)
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def test_a_piped_run_prints_one_plain_line_per_step(cli):
    shown = cli("run", *MIGRATION, "--run-id", "r1").stdout.splitlines()

    steps = [STEP_LINE.match(line) for line in shown[:4]]
    assert all(steps), shown
    assert [(m["run"], int(m["step"]), m["tool"]) for m in steps if m] == [
        ("r1", 1, "inspect_table"),
        ("r1", 2, "copy_batch"),
        ("r1", 3, "copy_batch"),
        ("r1", 4, "request_approval"),
    ]
    copied = steps[1]
    assert copied is not None
    assert copied["args"] == "batch=1"
    assert "Copied 1,000 rows" in copied["result"]
    # The migration's batches make the run's length known: the position follows the batch.
    assert [(m["done"], m["total"]) for m in steps if m] == [
        ("0", "2"),
        ("1", "2"),
        ("2", "2"),
        ("2", "2"),
    ]
    assert shown[4] == "r1: waiting at step 4"
    assert not any("\x1b" in line for line in shown), "no terminal codes in piped output"


def test_json_lines_of_a_run_parse_and_carry_step_tool_and_ms(cli):
    lines = cli("run", *MIGRATION, "--run-id", "r1", "--json").stdout.splitlines()

    parsed = [json.loads(line) for line in lines]
    steps = [p for p in parsed if "tool" in p]
    assert [(s["step"], s["tool"]) for s in steps] == [
        (1, "inspect_table"),
        (2, "copy_batch"),
        (3, "copy_batch"),
        (4, "request_approval"),
    ]
    assert all(isinstance(s["ms"], float) and s["ms"] >= 0 for s in steps)
    assert steps[1]["arguments"] == "batch=1"
    assert (steps[2]["done"], steps[2]["total"]) == (2, 2)
    final = parsed[-1]
    assert (final["run_id"], final["status"], final["step"]) == ("r1", "waiting", 4)
    assert final["approval_link"].startswith("http")


def test_a_worker_prints_a_line_per_step_of_the_runs_it_works(cli):
    cli("start", *MIGRATION, "--run-id", "w1")

    lines = cli("worker", "--until-idle", "--json").stdout.splitlines()

    parsed = [json.loads(line) for line in lines]
    assert [p["step"] for p in parsed if "tool" in p] == [1, 2, 3, 4]
    assert any("w1 waits for a person" in p.get("note", "") for p in parsed)


def test_list_shows_every_run_and_filters_by_status(cli):
    cli("run", *MIGRATION, "--run-id", "waits")
    cli("run", *MIGRATION, "--run-id", "stops", "--max-steps", "2")

    listed = cli.json("list")["runs"]
    assert {(r["run_id"], r["status"], r["step"]) for r in listed} == {
        ("waits", "waiting", 4),
        ("stops", "stopped", 2),
    }
    assert [r["run_id"] for r in cli.json("list", "--status", "stopped")["runs"]] == ["stops"]
    table = cli("list").stdout
    assert "waits" in table
    assert "stopped" in table
    refused = cli("list", "--status", "sleeping", code=2)
    assert "unknown run status" in refused.stderr
    assert not refused.stdout


def test_watch_follows_a_run_another_process_works_until_it_waits(cli):
    cli("start", *MIGRATION, "--run-id", "r1", "--tool-latency-ms", "50")
    watch = subprocess.Popen(
        cli.command("watch", "r1", "--json", "--interval", "0.05"),
        cwd=cli.cwd,
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        cli("worker", "--until-idle")
        out, errors = watch.communicate(timeout=TIMEOUT)
    finally:
        watch.kill()

    assert watch.returncode == 0, errors
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["type"] == "started"
    assert [e["id"] for e in lines] == sorted({e["id"] for e in lines})
    assert [(s["step"], s["tool"]) for s in lines if "tool" in s] == [
        (1, "inspect_table"),
        (2, "copy_batch"),
        (3, "copy_batch"),
        (4, "request_approval"),
    ]
    assert lines[-1]["status"] == "waiting"


def test_watch_of_a_failed_run_exits_1(cli):
    (cli.cwd / "breaker.py").write_text(FAILING_AGENT, encoding="utf-8")
    cli("run", "--agent", "breaker:agent", "--run-id", "f1", code=1)

    done = cli("watch", "f1", code=1)
    last = done.stdout.splitlines()[-1]
    assert last.startswith("f1  step 2  failed -> finished: failed: step 2 failed"), last


FLAKY_AGENT = """
from pathlib import Path

from pydantic import BaseModel

from ratchet.state import Done, ToolCall
from ratchet.tools import Agent, tool


class Nothing(BaseModel):
    pass


@tool()
def flaky(args: Nothing, ctx) -> str:
    \"\"\"Fail the first time.\"\"\"
    tried = Path("tried")
    if not tried.exists():
        tried.write_text("1")
        raise RuntimeError("not yet")
    return "worked"


def policy(view):
    return Done(summary="fine") if view.messages else ToolCall(name="flaky", arguments={})


agent = Agent(name="flaky", goal="Try twice.", tools=[flaky], policy=policy)
"""


def test_watch_names_a_failed_attempt_by_the_step_it_tried(cli):
    (cli.cwd / "flaky.py").write_text(FLAKY_AGENT, encoding="utf-8")
    cli("run", "--agent", "flaky:agent", "--run-id", "t1")

    lines = cli("watch", "t1").stdout.splitlines()

    assert lines[0] == "t1  step 0  running -> created"
    assert lines[1].startswith("t1  step 1  running -> attempt 1 at step 1 failed: "), lines
    assert lines[2].startswith("t1  step 1  flaky() -> worked"), lines
    assert lines[3].startswith("t1  done -> finished: done: fine"), lines


def test_history_explains_every_version(cli):
    cli("run", *MIGRATION, "--run-id", "r1")
    cli("approve", "r1", "--by", "dana", "--comment", "go ahead")
    cli("run", "--run-id", "r1")

    history = cli.json("history", "r1")

    rows = history["checkpoints"]
    said = [r["explanation"] for r in rows]
    assert said[0] == "created"
    assert "person decided by dana: approved: go ahead" in said
    assert said[-1].startswith("finished: done: Copied 2,000 rows")
    decided = next(r for r in rows if r["event"] == "decided")
    assert (decided["by"], decided["comment"]) == ("dana", "go ahead")
    copied = [r for r in rows if r["tool"] == "copy_batch"]
    assert [r["arguments"] for r in copied] == [{"batch": 1}, {"batch": 2}]
    assert all("Copied 1,000 rows" in r["result"] and r["duration_ms"] >= 0 for r in copied)
    # Every version is a row or inside a range said to be an attempt counted without a record.
    covered = {r["version"] for r in rows}
    for gap in history["unrecorded_versions"]:
        assert "attempts counted" in gap["explanation"]
        covered |= set(range(gap["from"], gap["to"] + 1))
    head = cli.json("status", "r1")["version"]
    assert covered == set(range(1, head + 1))
    assert history["unrecorded_versions"], "a resumed run counts an attempt without a record"

    table = cli("history", "r1").stdout
    # No attempt failed: each counted attempt was committed, a row for none of them; the
    # line under the table says what the versions without a row are.
    assert "attempt counted (no record)" not in table
    assert table.splitlines()[-1].startswith("Versions without a row: attempts counted")
    assert "person decided by dana: approved: go ahead" in table
    assert "copy_batch(batch=2) -> Copied 1,000 rows" in table


def test_status_of_a_failed_run_names_the_step_that_failed(cli):
    (cli.cwd / "breaker.py").write_text(FAILING_AGENT, encoding="utf-8")
    cli("run", "--agent", "breaker:agent", "--run-id", "f1", code=1)

    status = cli.json("status", "f1")
    assert (status["status"], status["step"], status["failed_step"]) == ("failed", 1, 2)
    assert isinstance(status["attempts"], int)
    text = cli("status", "f1").stdout
    assert re.search(r"^\s+status  failed at step 2$", text, re.MULTILINE), text
    assert "the disk is on fire" in text
    assert not re.search(r"^\s+attempts ", text, re.MULTILINE)


def test_status_of_a_stopped_run_gives_the_reason_and_no_attempts(cli):
    cli("run", *MIGRATION, "--run-id", "s1", "--max-steps", "2")

    status = cli.json("status", "s1")
    assert (status["status"], status["step"], status["failed_step"]) == ("stopped", 2, None)
    assert "step cap of 2" in status["summary"]
    text = cli("status", "s1").stdout
    assert re.search(r"^\s+reason  Stopped at the step cap of 2 steps", text, re.MULTILINE), text
    assert not re.search(r"^\s+attempts ", text, re.MULTILINE)


def test_a_worker_says_whose_lease_it_waits_for_and_until_when(cli):
    cli("start", *MIGRATION, "--run-id", "r1", "--tool-latency-ms", "300")
    first = subprocess.Popen(
        cli.command("worker", "--worker-id", "doomed", "--lease-seconds", "10"),
        cwd=cli.cwd,
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert first.stdout is not None
        # Its first committed step is printed: it holds the run's lease now. Kill it there.
        assert first.stdout.readline().startswith("r1  step 1  inspect_table")
        first.kill()
        first.wait(timeout=TIMEOUT)
    finally:
        first.kill()

    lines = cli("worker", "--until-idle", "--worker-id", "heir", "--json").stdout.splitlines()

    parsed = [json.loads(line) for line in lines]
    notes = [p["note"] for p in parsed if "note" in p]
    assert re.fullmatch(
        r"waiting for worker doomed's lease on r1 until \d\d:\d\d:\d\d "
        r"\(it is renewed while that worker lives\)",
        notes[0],
    ), notes
    assert [p["step"] for p in parsed if "tool" in p][-1] == 4
