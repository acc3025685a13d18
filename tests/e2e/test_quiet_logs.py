"""Where the JSON log lines go (issue 20, "a quiet, honest start"): on a terminal, into the log
beside the store, so that a person reads only the step lines; on stderr when stderr is not a
terminal (CI, containers) or with `--log-json`.

Each test runs the real command in a subprocess whose stdout (and stderr, unless the test pipes
it) is a pseudo-terminal, reading what it shows until the process closes it.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.processes import RATCHET, clean_env

TIMEOUT = 120
MIGRATION = ("--scenario", "migration", "--param", "batches=2")
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\x1b[=>78]")


@dataclass
class Shown:
    code: int
    terminal: str
    """What the terminal showed, its escape sequences removed."""
    stderr: str
    """stderr, when it was a pipe."""

    @property
    def lines(self) -> list[str]:
        """Each line the terminal showed, a carriage return (a redrawn line) starting another."""
        return [line for line in re.split(r"[\r\n]+", self.terminal) if line.strip()]

    def json_lines(self) -> list[str]:
        return [line for line in self.lines if line.lstrip().startswith("{")]


def on_terminal(
    root: Path, *args: str, stderr_piped: bool = False, cwd: Path | None = None
) -> Shown:
    """`ratchet --store <root>/ratchet.db ARGS` with its stdout on a pseudo-terminal (its
    stderr too, unless `stderr_piped`), read until it exits and closes the terminal."""
    primary, secondary = os.openpty()
    process = subprocess.Popen(
        [*RATCHET, "--store", f"sqlite:///{root / 'ratchet.db'}", *args],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=subprocess.PIPE if stderr_piped else secondary,
        cwd=cwd or root,
        env=clean_env(COLUMNS="200", LINES="50", TERM="xterm"),
    )
    os.close(secondary)
    reading = {primary: bytearray()}
    if process.stderr is not None:
        reading[process.stderr.fileno()] = bytearray()
    read: dict[int, bytearray] = {}
    deadline = time.monotonic() + TIMEOUT
    try:
        while reading:
            left = deadline - time.monotonic()
            assert left > 0, f"ratchet {' '.join(args)} did not finish in {TIMEOUT} s"
            ready, _, _ = select.select(list(reading), [], [], left)
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the terminal is closed: Linux reads EIO
                    chunk = b""
                if chunk:
                    reading[fd] += chunk
                else:
                    read[fd] = reading.pop(fd)
        code = process.wait(timeout=TIMEOUT)
    finally:
        process.kill()
        os.close(primary)
        if process.stderr is not None:
            process.stderr.close()
    terminal = _ESCAPES.sub("", read.pop(primary).decode("utf-8", "replace"))
    stderr = b"".join(read.values()).decode("utf-8", "replace")
    return Shown(code, terminal, stderr)


def logged(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def checkpoints(lines: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    """(run, step, event) of each "checkpoint written" line, each holding its worker and size."""
    written = [line for line in lines if line["message"] == "checkpoint written"]
    assert all(line["worker_id"] and line["bytes"] > 0 for line in written), written
    return [(line["run_id"], line["step"], line["event"]) for line in written]


def test_a_run_on_a_terminal_shows_step_lines_only_and_logs_beside_the_store(tmp_path):
    shown = on_terminal(tmp_path, "run", *MIGRATION, "--run-id", "r1")

    assert shown.code == 0, shown.terminal
    assert shown.json_lines() == []
    assert any(line.startswith("r1  step 4  request_approval(") for line in shown.lines)
    assert "r1: waiting at step 4" in shown.lines
    log = tmp_path / "ratchet.log"
    assert checkpoints(logged(log)) == [
        ("r1", 1, "step"),
        ("r1", 2, "step"),
        ("r1", 3, "step"),
        ("r1", 4, "step"),
    ]

    # And the next command on the terminal appends to the same log.
    approved = on_terminal(tmp_path, "approve", "r1", "--comment", "ok")
    assert approved.code == 0, approved.terminal
    assert approved.json_lines() == []
    assert approved.lines == ["r1: approved; it resumes on the next free worker"]
    assert checkpoints(logged(log))[4:] == [("r1", 4, "decided")]


def test_a_worker_on_a_terminal_logs_beside_the_store(tmp_path):
    started = subprocess.run(
        [*RATCHET, "--store", f"sqlite:///{tmp_path / 'ratchet.db'}", "start", *MIGRATION],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=TIMEOUT,
        check=True,
    )
    run_id = started.stdout.strip()

    shown = on_terminal(tmp_path, "worker", "--until-idle", "--worker-id", "w1")

    assert shown.code == 0, shown.terminal
    assert shown.json_lines() == []
    assert any(line.startswith(f"{run_id}  step 1  inspect_table(") for line in shown.lines)
    lines = logged(tmp_path / "ratchet.log")
    assert [step for _, step, _ in checkpoints(lines)] == [1, 2, 3, 4]
    assert {line["worker_id"] for line in lines} == {"w1"}
    assert lines[-1]["message"] == "worker stopped"


def test_log_json_sends_the_lines_to_the_terminal_instead(tmp_path):
    shown = on_terminal(tmp_path, "run", *MIGRATION, "--run-id", "r1", "--log-json")

    assert shown.code == 0, shown.terminal
    lines = [json.loads(line) for line in shown.json_lines()]
    assert [step for _, step, _ in checkpoints(lines)] == [1, 2, 3, 4]
    assert not (tmp_path / "ratchet.log").exists()
    # Each a line of its own between the step lines: no live display draws over them.
    assert any(line.startswith("r1  step 1  inspect_table(") for line in shown.lines)
    assert "━" not in shown.terminal


def test_a_piped_stderr_gets_the_lines_as_before_and_the_terminal_does_not(tmp_path):
    shown = on_terminal(tmp_path, "run", *MIGRATION, "--run-id", "r1", stderr_piped=True)

    assert shown.code == 0, shown.terminal + shown.stderr
    assert shown.json_lines() == []
    lines = [json.loads(line) for line in shown.stderr.splitlines()]
    assert [step for _, step, _ in checkpoints(lines)] == [1, 2, 3, 4]
    assert not (tmp_path / "ratchet.log").exists()


def test_a_command_that_logs_nothing_leaves_no_log(tmp_path):
    on_terminal(tmp_path, "run", *MIGRATION, "--run-id", "r1")
    (tmp_path / "ratchet.log").unlink()

    shown = on_terminal(tmp_path, "status", "r1")

    assert shown.code == 0, shown.terminal
    assert not (tmp_path / "ratchet.log").exists()


def test_the_demo_on_a_terminal_shows_no_json_line(tmp_path):
    shown = on_terminal(tmp_path, "demo")

    assert shown.code == 0, shown.terminal
    assert shown.json_lines() == []
    assert "All invariants hold." in shown.terminal
