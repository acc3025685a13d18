"""The README runs as printed (issue 8): every Python block is executed, offline, with the
agents' scripted policies, and the shell example of "Define your own agent" runs with the
project's `ratchet` command.

A block whose first line is `# <name>.py` is a file: it is written to a folder of its own and
imported from there as module `<name>`, so later blocks (and `--agent <name>:attr`) find it.
Every other block is executed in one namespace shared by the blocks, in order, with that folder
as the working directory.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import ratchet
from ratchet.state import RunStatus

README = Path(__file__).resolve().parents[2] / "README.md"
RATCHET = Path(sys.executable).with_name("ratchet")
TIMEOUT = 120
OFFLINE = ("RATCHET_STORE", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "RATCHET_FAULT")
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_NAME = re.compile(r"^# (?P<module>[A-Za-z_]\w*)\.py$")
RUN_ID = re.compile(r"--run-id (?P<run_id>\S+)")


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int
    """Where the block's code starts in the README, for tracebacks."""

    @property
    def module(self) -> str | None:
        first = self.code.splitlines()[0] if self.code else ""
        found = FILE_NAME.fullmatch(first)
        return found["module"] if found else None


def readme_blocks(lang: str) -> list[Block]:
    text = README.read_text(encoding="utf-8")
    return [
        Block(m["lang"], m["body"], text.count("\n", 0, m.start("body")) + 1)
        for m in FENCE.finditer(text)
        if m["lang"] == lang
    ]


def refunds(client: ratchet.Client, run_id: str) -> list[tuple[str, str]]:
    """What the example's side-effecting tool recorded in the run's data."""
    data = client.runtime.context(run_id, client.head(run_id).options).data
    assert data is not None
    return data.items("refunds/")


def _module_blocks() -> list[Block]:
    return [b for b in readme_blocks("python") if b.module]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The reader's folder: the README's files written to it, it is the working directory and
    on the path; offline (no API key, no store from the environment); and none of its modules
    left imported afterwards, for the next test to import afresh."""
    for name in OFFLINE:
        monkeypatch.delenv(name, raising=False)
    modules = [b.module for b in _module_blocks() if b.module]
    for block in _module_blocks():
        (tmp_path / f"{block.module}.py").write_text(block.code, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in modules:
        sys.modules.pop(module, None)
    yield tmp_path
    for module in modules:
        sys.modules.pop(module, None)


def test_the_readme_has_the_blocks_this_test_runs():
    python = readme_blocks("python")

    assert len(python) >= 2
    assert [b.module for b in python if b.module] == ["my_agents"]
    assert any('assert run.status == "waiting"' in b.code for b in python if not b.module)
    assert any("ask_person(" in b.code for b in python if b.module)
    assert any("ctx.idempotency_key" in b.code and "put_once(" in b.code for b in python)


def test_every_python_block_runs_as_printed(folder):
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    try:
        for block in readme_blocks("python"):
            if block.module:
                module = importlib.import_module(block.module)
                assert Path(module.__file__ or "").parent == folder
            else:
                # Line numbers as in the README, so a failure points at the printed line.
                code = "\n" * (block.line - 1) + block.code
                exec(compile(code, str(README), "exec"), namespace)
    finally:
        for value in namespace.values():
            if isinstance(value, ratchet.Client):
                value.close()

    # The blocks asked a person and went on after the approval, as printed.
    run = namespace.get("run")
    assert isinstance(run, ratchet.Run)
    assert run.waiting is not None
    with ratchet.connect(f"sqlite:///{folder}/runs.db", create=False) as client:
        done = client.get(run.run_id)
        assert done.status is RunStatus.DONE
        assert "decided" in {c.event for c in client.history(run.run_id)}
        assert len(refunds(client, run.run_id)) == 1


def _shell_example() -> tuple[list[str], str]:
    """The commands of the sh block that runs `--agent my_agents:agent` (those that need an
    API key left out), and the run id they name."""
    (block,) = [b for b in readme_blocks("sh") if "--agent my_agents:agent" in b.code]
    commands = [
        line
        for line in block.code.splitlines()
        if line.startswith("ratchet ") and "--model claude" not in line
    ]
    assert commands, block.code
    (run_id,) = {m["run_id"] for line in commands for m in RUN_ID.finditer(line)}
    return commands, run_id


@pytest.mark.slow
def test_the_shell_example_runs_as_printed(folder):
    commands, run_id = _shell_example()
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
    env["PATH"] = f"{RATCHET.parent}{os.pathsep}{env.get('PATH', '')}"

    for command in commands:
        # As typed at a shell: the README's quoting, `&&` and comments, with this ratchet.
        finished = subprocess.run(
            ["bash", "-c", command],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert finished.returncode == 0, (command, finished.stdout, finished.stderr)

    with ratchet.connect(f"sqlite:///{folder}/.ratchet/ratchet.db", create=False) as client:
        done = client.get(run_id)
        assert done.status is RunStatus.DONE
        assert (done.summary or "").startswith("refunded "), done.summary
        assert len(refunds(client, run_id)) == 1
        assert [c.event for c in client.history(run_id)].count("decided") == 1


TIMINGS = re.compile(r" in \d+\.\d s on \d+ processes")


@pytest.mark.slow
def test_the_check_example_prints_what_the_readme_shows(folder):
    (block,) = [b for b in readme_blocks("sh") if b.code.startswith("ratchet check ")]
    (shown,) = [b for b in readme_blocks("text") if b.code.startswith("ratchet check ")]
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
    env["PATH"] = f"{RATCHET.parent}{os.pathsep}{env.get('PATH', '')}"

    checked = subprocess.run(
        ["bash", "-c", block.code.strip()],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )

    assert checked.returncode == 0, (checked.stdout, checked.stderr)
    assert TIMINGS.sub("", checked.stdout) == TIMINGS.sub("", shown.code)
