"""The README runs as printed (issues 8 and 36): every Python block is executed, offline, with
the agents' scripted policies, and every command line of its `sh` blocks is run here with the
project's `ratchet` command, in a folder of the reader's own, or named in RUN_ELSEWHERE with the
test (or CI) that runs it.

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
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import ratchet
from ratchet.state import RunStatus
from tests.integration.fake_messages_api import FakeMessagesApi, tool_use_response
from tests.processes import serving

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
AGENTS_DOC = REPO / "docs" / "agents.md"
RATCHET = Path(sys.executable).with_name("ratchet")
TIMEOUT = 120
OFFLINE = ("RATCHET_STORE", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "RATCHET_FAULT")
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_NAME = re.compile(r"^# (?P<module>[A-Za-z_]\w*)\.py$")
RUN_ID = re.compile(r"--run-id (?P<run_id>\S+)")
LINK = re.compile(r"http://\S+/approvals/\S+")
PAID = "--model claude-sonnet-4-6"

RUN_ELSEWHERE = {
    "make demo": "tests/e2e/test_demo.py runs `ratchet demo`, all that `make demo` runs once "
    "it has set up",
    "make test": ".ci/run, CI's run on a clean clone (and the workflows in .github/)",
    "make dist": "tests/e2e/test_base_install.py and tests/e2e/test_project_install.py build "
    "the wheel with `uv build`, as `make dist` does",
    "pip install 'dist/ratchet_agents-0.1.0-py3-none-any.whl[anthropic]'": "the package "
    "index, which this test does not reach: tests/e2e/test_base_install.py installs that wheel",
    "pip install 'ratchet_agents-0.1.0-py3-none-any.whl[cdk]' pytest": "tests/e2e/"
    "test_project_install.py, from the wheel with the versions uv.lock pins",
    "pytest && ratchet synth": "tests/e2e/test_project_install.py: the generated project's "
    "tests, then its synth (Node.js, some 20 s)",
}
"""The README's command lines this test does not run, and who does."""


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


def readme_blocks(lang: str, doc: Path = README) -> list[Block]:
    text = doc.read_text(encoding="utf-8")
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


def command_lines(block: Block) -> list[str]:
    """A `sh` block's command lines as a reader types them: comment lines left out."""
    return [line for line in block.code.splitlines() if line.strip() and not line.startswith("#")]


def _without_comment(line: str) -> str:
    return line.split("  #", 1)[0].strip()


def _shell_example() -> tuple[list[str], str]:
    """The commands of the sh block that runs `--agent my_agents:agent`, and the run id they
    name (the line on Claude names none)."""
    (block,) = [b for b in readme_blocks("sh") if "--agent my_agents:agent" in b.code]
    commands = command_lines(block)
    assert all(line.startswith("ratchet ") for line in commands), block.code
    (run_id,) = {m["run_id"] for line in commands for m in RUN_ID.finditer(line)}
    return commands, run_id


def _check_example() -> Block:
    (block,) = [b for b in readme_blocks("sh") if b.code.startswith("ratchet check ")]
    return block


def _approval_block() -> Block:
    (block,) = [b for b in readme_blocks("sh") if "--run-id try-approval" in b.code]
    return block


def _approval_example() -> list[str]:
    return command_lines(_approval_block())


def _aws_example_here() -> list[str]:
    """The AWS block's lines that run offline and quickly: `ratchet init`."""
    (block,) = [b for b in readme_blocks("sh") if "ratchet init my-agents" in b.code]
    return [line for line in command_lines(block) if line.startswith("ratchet init ")]


def test_every_shell_line_of_the_readme_is_run_here_or_named_elsewhere():
    printed = [_without_comment(line) for b in readme_blocks("sh") for line in command_lines(b)]
    run_here = [
        *_shell_example()[0],
        *command_lines(_check_example()),
        *_approval_example(),
        *_aws_example_here(),
    ]

    assert printed, "the README has no sh block"
    assert {_without_comment(line) for line in run_here}.isdisjoint(RUN_ELSEWHERE)
    assert sorted(printed) == sorted(
        [*{_without_comment(line) for line in run_here}, *RUN_ELSEWHERE]
    ), "a README command line is neither run here nor named in RUN_ELSEWHERE"
    for who in RUN_ELSEWHERE.values():
        for path in re.findall(r"(?:tests/\S+\.py|\.ci/run)", who):
            assert (REPO / path).exists(), (who, path)


def reader_env(**extra: str) -> dict[str, str]:
    """The reader's shell: offline, no store from the environment, this ratchet first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
    env["PATH"] = f"{RATCHET.parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def typed(command: str, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A line as typed at a shell: the README's quoting, `&&` and comments, with this ratchet."""
    return subprocess.run(
        ["bash", "-c", command],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.mark.slow
def test_the_shell_example_runs_as_printed(folder):
    commands, run_id = _shell_example()
    env = reader_env()
    paid = [line for line in commands if PAID in line]
    assert len(paid) == 1, commands

    for command in commands:
        if command in paid:
            continue
        finished = typed(command, folder, env)
        assert finished.returncode == 0, (command, finished.stdout, finished.stderr)
    # The line on Claude, with a key set, against a Messages API that asks for the approval:
    # the run says first that it is on a paid model, and parks for the person.
    with FakeMessagesApi() as api:
        api.enqueue(tool_use_response("request_approval", {"customer": "acme", "cents": 50}))
        on_claude = typed(
            paid[0],
            folder,
            reader_env(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url),
        )
        assert on_claude.returncode == 0, (on_claude.stdout, on_claude.stderr)
        assert len(api.requests) == 1

    assert on_claude.stdout.splitlines()[0] == "model: claude-sonnet-4-6", on_claude.stdout
    with ratchet.connect(f"sqlite:///{folder}/.ratchet/ratchet.db", create=False) as client:
        done = client.get(run_id)
        assert done.status is RunStatus.DONE
        assert (done.summary or "").startswith("refunded "), done.summary
        assert len(refunds(client, run_id)) == 1
        assert [c.event for c in client.history(run_id)].count("decided") == 1
        (claude,) = [r for r in client.runs() if r.run_id != run_id]
        parked = client.get(claude.run_id)
        assert parked.status is RunStatus.WAITING
        assert parked.waiting is not None
        assert parked.waiting.prompt == "Refund 50 cents to acme?"


def _answered(url: str, form: str | None = None) -> int:
    request = urllib.request.Request(
        url,
        data=form.encode() if form is not None else None,
        headers={"Content-Type": "application/x-www-form-urlencoded"} if form else {},
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
        return int(answer.status)


@pytest.mark.slow
def test_the_approval_example_runs_as_printed(folder):
    started, serve, opened, status = _approval_block().code.splitlines()
    env = reader_env(PYTHONUNBUFFERED="1")
    serve = _without_comment(serve)
    assert serve == "ratchet serve"
    assert [started, status] == [
        line for line in _approval_example() if _without_comment(line) != serve
    ]

    parked = typed(started, folder, env)  # as typed: it parks and prints the link
    assert parked.returncode == 0, (parked.stdout, parked.stderr)
    links = set(LINK.findall(parked.stdout + parked.stderr))
    assert len(links) == 1, (parked.stdout, parked.stderr)
    (link,) = links
    # `ratchet serve` as printed, in the background, on a free port: other tests on this
    # machine may hold 8765. Its own worker finishes the run once a person approves.
    with serving(
        [*serve.split(), "--port", "0"], log=folder / "serve.log", env=env, cwd=folder
    ) as served:
        assert opened.startswith("# open the printed link and press Approve")
        page = urllib.parse.urlsplit(link)
        on_serve = f"{served.base}{page.path}?{page.query}"
        assert _answered(on_serve) == 200
        assert _answered(on_serve, form="decision=approve&comment=") == 200
        deadline = time.monotonic() + TIMEOUT
        shown = typed(status, folder, env)
        while "done" not in shown.stdout:
            assert time.monotonic() < deadline, (shown.stdout, served.printed)
            time.sleep(0.2)
            shown = typed(status, folder, env)

    assert shown.returncode == 0, shown.stderr
    with ratchet.connect(f"sqlite:///{folder}/.ratchet/ratchet.db", create=False) as client:
        assert client.get("try-approval").status is RunStatus.DONE
        assert [c.event for c in client.history("try-approval")].count("decided") == 1


@pytest.mark.slow
def test_the_aws_examples_ratchet_init_runs_as_printed(folder):
    (init,) = _aws_example_here()

    made = typed(init, folder, reader_env())

    assert made.returncode == 0, (made.stdout, made.stderr)
    assert (folder / "my-agents" / "app.py").is_file()
    assert (folder / "my-agents" / "tests" / "test_agent.py").is_file()


TIMINGS = re.compile(r" in \d+\.\d s on \d+ processes")


@pytest.mark.slow
def test_the_check_example_prints_what_the_docs_show(folder):
    block = _check_example()
    # What it prints is shown in docs/agents.md, beside the same command.
    (shown,) = [b for b in readme_blocks("text", AGENTS_DOC) if b.code.startswith("ratchet check ")]
    assert any(b.code == block.code for b in readme_blocks("sh", AGENTS_DOC))

    checked = typed(block.code.strip(), folder, reader_env())

    assert checked.returncode == 0, (checked.stdout, checked.stderr)
    assert TIMINGS.sub("", checked.stdout) == TIMINGS.sub("", shown.code)
