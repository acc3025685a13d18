"""A user's path from nothing but the wheel to a tested, synthesized stack (issue 33): the wheel
`uv build` makes from this tree, installed with the cdk extra into a fresh venv outside the
repository (dependencies from the package index, through uv's shared cache), then in an empty
folder `ratchet init`, the generated project's own tests, and `ratchet synth`, with no AWS
credentials and no Docker. The template must register the project's agent on the functions
that start and step runs, and hold least privilege as tests/infra holds the repository's own
stack; cdk-nag runs in every synth, and a finding fails it.

One venv for the module: the install is most of its time. Each step's time is printed (`-s`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.infra.test_iam import NO_RESOURCE_LEVEL

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
UV = REPO_ROOT / ".tools" / "bin" / "uv"
TIMEOUT = 900
SCRUBBED = {"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "RATCHET_FAULT", "RATCHET_STORE"}


def _environment(venv: Path | None = None) -> dict[str, str]:
    """The user's shell: no PYTHONPATH into this tree, no AWS credentials, no Docker, and the
    venv activated (its bin/ first on PATH, where `ratchet` and `python` are)."""
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in SCRUBBED | {"PYTHONPATH", "VIRTUAL_ENV"} and not k.startswith("AWS_")
    }
    environment.update(
        AWS_CONFIG_FILE="/nonexistent/aws-config",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent/aws-credentials",
        AWS_EC2_METADATA_DISABLED="true",
        CDK_DOCKER="false",
    )
    if venv is not None:
        environment["VIRTUAL_ENV"] = str(venv)
        environment["PATH"] = f"{venv / 'bin'}:{environment['PATH']}"
    return environment


def _run(command: list[str], cwd: Path, venv: Path | None = None) -> tuple[str, float]:
    began = time.monotonic()
    done = subprocess.run(
        command,
        cwd=cwd,
        env=_environment(venv),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    took = time.monotonic() - began
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout, took


@dataclass(frozen=True)
class Installed:
    venv: Path
    project: Path
    timings: dict[str, float]

    def ratchet(self, *args: str) -> tuple[str, float]:
        return _run([str(self.venv / "bin" / "ratchet"), *args], self.project, self.venv)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    assert UV.exists(), f"{UV} is missing: run `make test` (it installs the pinned uv)"
    root = tmp_path_factory.mktemp("project-install")
    timings: dict[str, float] = {}
    dist = root / "dist"
    _, timings["uv build --wheel"] = _run(
        [str(UV), "build", "--quiet", "--wheel", "--out-dir", str(dist), str(REPO_ROOT)], REPO_ROOT
    )
    (wheel,) = dist.glob("ratchet_agents-*-py3-none-any.whl")
    # The versions uv.lock pins (the tests', and the bundle's) as constraints: what `make`
    # already put in uv's cache.
    constraints = root / "constraints.txt"
    _run(
        [
            str(UV), "export", "--frozen", "--no-dev", "--all-extras", "--no-emit-project",
            "--no-hashes", "--no-header", "--no-annotate", "--format", "requirements.txt",
            "--output-file", str(constraints),
        ],
        REPO_ROOT,
    )  # fmt: skip
    venv = root / "venv"
    _, timings["uv venv"] = _run(
        [str(UV), "venv", "--quiet", "--python", sys.executable, str(venv)], root
    )
    _, timings["pip install 'ratchet-agents[cdk]' pytest"] = _run(
        [
            str(UV), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
            "--constraint", str(constraints), f"{wheel}[cdk]", "pytest",
        ],
        root,
    )  # fmt: skip
    work = root / "work"
    work.mkdir()
    _, timings["ratchet init my-agents"] = _run(
        [str(venv / "bin" / "ratchet"), "init", "my-agents"], work, venv
    )
    return Installed(venv, work / "my-agents", timings)


def test_the_generated_projects_tests_pass_in_the_installed_venv(installed: Installed) -> None:
    said, took = _run(
        [str(installed.venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        installed.project,
        installed.venv,
    )
    installed.timings["pytest"] = took

    assert "4 passed" in said, said


@pytest.fixture(scope="module")
def synthesized(installed: Installed) -> dict[str, Any]:
    said, took = installed.ratchet("synth")
    installed.timings["ratchet synth"] = took
    print("\n" + "\n".join(f"{step}: {s:.1f} s" for step, s in installed.timings.items()))
    print(said.splitlines()[-1])
    manifest = json.loads((installed.project / "cdk.out" / "manifest.json").read_text())
    (stack,) = [
        a for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"
    ]
    template_file = installed.project / "cdk.out" / stack["properties"]["templateFile"]
    assert said.splitlines()[-1] == (
        f"Synthesized MyAgents: cdk.out/{template_file.name} "
        f"({len(json.loads(template_file.read_text())['Resources'])} resources)"
    )
    template: dict[str, Any] = json.loads(template_file.read_text())
    return template


def _of_type(template: dict[str, Any], kind: str) -> dict[str, Any]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def test_the_synthesized_stack_registers_the_projects_agent(synthesized: dict[str, Any]) -> None:
    registered = [
        json.loads(variables["RATCHET_AGENTS"])
        for function in _of_type(synthesized, "AWS::Lambda::Function").values()
        if "RATCHET_AGENTS" in (variables := function["Properties"]["Environment"]["Variables"])
    ]

    # The API starts it by name, and the step function (and a schedule's fire) loads it.
    assert len(registered) >= 2, registered
    assert all(agents == {"payout": "my_agents.agent:agent"} for agents in registered), registered


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_the_synthesized_stack_holds_least_privilege(synthesized: dict[str, Any]) -> None:
    statements = [
        statement
        for policy in _of_type(synthesized, "AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]

    assert statements
    for statement in statements:
        assert statement["Effect"] == "Allow", statement
        assert not [a for a in _as_list(statement["Action"]) if "*" in a], statement
        if "*" in _as_list(statement["Resource"]):
            assert set(_as_list(statement["Action"])) <= NO_RESOURCE_LEVEL, statement
