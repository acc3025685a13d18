"""`pip install ratchet-agents` with no extras, as the README says to until the package is on the
index: a fresh virtual environment, the wheel `uv build` makes from this tree installed with
the base dependencies `uv.lock` pins, none of the AWS SDK, the
X-Ray SDK or the Anthropic SDK. Its own `ratchet` runs an agent offline and serves the runs API:
everything local works without the extras (issue 8, "Packaging")."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
UV = REPO_ROOT / ".tools" / "bin" / "uv"
EXTRAS_ONLY = ["boto3", "botocore", "anthropic", "aws_xray_sdk"]
SCRUBBED = {"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "RATCHET_FAULT", "RATCHET_STORE"}
TIMEOUT = 120

GREETER = '''
    from pydantic import BaseModel

    from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, tool


    class Greeting(BaseModel):
        name: str


    @tool(side_effect=True)
    def greet(args: Greeting, ctx: ToolContext) -> str:
        """Greet someone, once per key."""
        return f"hello {args.name} ({ctx.idempotency_key})"


    def scripted(view: StepView) -> ToolCall | Done:
        if not view.messages:
            return ToolCall(name="greet", arguments={"name": "ada"})
        return Done(summary="greeted ada")


    greeter = Agent(name="greeter", goal="Greet ada.", tools=[greet], policy=scripted)
'''


@dataclass(frozen=True)
class BareInstall:
    venv: Path
    workdir: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def store(self) -> str:
        return f"sqlite:///{self.workdir / 'ratchet.db'}"

    def argv(self, *args: str) -> list[str]:
        return [str(self.venv / "bin" / "ratchet"), "--store", self.store, *args]

    def ratchet(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            cwd=self.workdir,  # where `--agent greeter:greeter` is found, as the README runs it
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )


def _environment() -> dict[str, str]:
    # PYTHONPATH could reach this repository's own tree or .venv and hide a missing dependency.
    return {k: v for k, v in os.environ.items() if k not in SCRUBBED | {"PYTHONPATH"}}


def _uv(*args: str, cwd: Path = REPO_ROOT) -> str:
    assert UV.exists(), f"{UV} is missing: run `make test` (it installs the pinned uv)"
    done = subprocess.run(
        [str(UV), *args],
        cwd=cwd,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"uv {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> BareInstall:
    root = tmp_path_factory.mktemp("bare-install")
    venv = root / "venv"
    # The lock's base set (no extras) as constraints: the versions the tests and Lambda use,
    # already in uv's cache after `make`.
    constraints = root / "constraints.txt"
    _uv(
        "export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes", "--no-header",
        "--no-annotate", "--format", "requirements.txt", "--output-file", str(constraints),
    )  # fmt: skip
    _uv("venv", "--quiet", "--python", sys.executable, str(venv))
    # The wheel a release publishes, built from this tree into a folder of its own (so no
    # earlier build can be the one installed), not an install from the source folder: a file
    # the wheel leaves out fails here, not for the first user.
    dist = root / "dist"
    _uv("build", "--quiet", "--wheel", "--out-dir", str(dist), str(REPO_ROOT))
    (wheel,) = dist.glob("ratchet_agents-*-py3-none-any.whl")
    _uv(
        "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
        "--constraint", str(constraints), str(wheel),
    )  # fmt: skip
    workdir = root / "work"
    workdir.mkdir()
    (workdir / "greeter.py").write_text(textwrap.dedent(GREETER), encoding="utf-8")
    return BareInstall(venv, workdir)


def test_the_bare_install_has_none_of_the_extras_sdks(bare: BareInstall) -> None:
    probe = (
        "import importlib.util, json, sys; "
        "print(json.dumps({name: importlib.util.find_spec(name) is not None "
        "for name in sys.argv[1:]}))"
    )
    done = subprocess.run(
        [str(bare.python), "-c", probe, "ratchet", *EXTRAS_ONLY],
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )

    found = json.loads(done.stdout)

    assert found == {"ratchet": True} | dict.fromkeys(EXTRAS_ONLY, False)


def test_the_bare_install_runs_an_agent_offline_to_done(bare: BareInstall) -> None:
    done = bare.ratchet(
        "run", "--agent", "greeter:greeter", "--model", "scripted", "--run-id", "hello"
    )
    assert done.returncode == 0, done.stdout + done.stderr

    status = bare.ratchet("status", "hello", "--json")

    assert status.returncode == 0, status.stderr
    run = json.loads(status.stdout)
    assert (run["status"], run["step"], run["summary"]) == ("done", 1, "greeted ada")


def test_the_bare_install_serves_the_runs_api(bare: BareInstall) -> None:
    # Given a finished run in the store
    done = bare.ratchet(
        "run", "--agent", "greeter:greeter", "--model", "scripted", "--run-id", "served"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    log = bare.workdir / "serve.log"

    # When `ratchet serve` listens on a free port
    with log.open("w") as output:
        server = subprocess.Popen(
            bare.argv("serve", "--port", "0"),
            cwd=bare.workdir,
            env=_environment() | {"PYTHONUNBUFFERED": "1"},
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        base_url = _wait_for_banner(server, log)
        with urllib.request.urlopen(f"{base_url}/runs/served", timeout=10) as response:
            run = json.load(response)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()

    # Then the runs API answers from that store
    assert (run["run_id"], run["status"]) == ("served", "done")


def _wait_for_banner(server: subprocess.Popen[str], log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"Serving approvals on (http://\S+)", log.read_text())
        if found:
            return found.group(1)
        assert server.poll() is None, f"ratchet serve exited:\n{log.read_text()}"
        time.sleep(0.05)
    raise AssertionError(f"ratchet serve did not listen within 60 s:\n{log.read_text()}")
