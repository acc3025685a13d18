"""A user's agent on AWS: `cdk synth` through the CDK CLI with the example project
(`examples/billing_agent`), its package bundled for real beside Ratchet, and its agent
registered on the functions; a requirement that would move a version Ratchet pins fails."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ratchet.cdk.bundling import PYTHON_VERSION, BundlingFailed, PinnedWheelsBundling
from ratchet.cdk.project import Project
from ratchet.cdk.sources import RatchetCode
from tests.infra.synth import REPO_ROOT
from tests.infra.test_cli_synth import CDK, _without_aws_or_docker

pytestmark = pytest.mark.slow


def test_cdk_synth_ships_the_project_package_and_registers_its_agent(tmp_path: Path) -> None:
    assert CDK.exists(), f"{CDK} is missing: run `make test` (it runs `npm ci`)"
    out = tmp_path / "cdk.out"
    # As `make synth RATCHET_PROJECT=examples/billing_agent` runs it: the path is relative to
    # the working directory, and the environment variable is read by the app.
    environment = {**_without_aws_or_docker(tmp_path), "RATCHET_PROJECT": "examples/billing_agent"}

    done = subprocess.run(
        [str(CDK), "synth", "--quiet", "--output", str(out)],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    (bundle,) = [p for p in out.iterdir() if p.name.startswith("asset.") and p.is_dir()]
    assert (bundle / "billing_agent" / "agent.py").is_file()
    assert (bundle / "billing_agent" / "__init__.py").is_file()
    tag = PYTHON_VERSION.replace(".", "")
    assert (bundle / "billing_agent" / "__pycache__" / f"agent.cpython-{tag}.pyc").is_file()
    assert (bundle / "ratchet" / "handlers" / "step.py").is_file()
    # The extras the functions need, now outside the base dependencies.
    for package in ("boto3", "aws_lambda_powertools", "anthropic"):
        assert (bundle / package).is_dir(), f"the bundle lacks {package}"
    template = json.loads((out / "Ratchet.template.json").read_text())
    functions = [
        r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function"
    ]
    registered = [
        json.loads(f["Environment"]["Variables"]["RATCHET_AGENTS"])
        for f in functions
        if "RATCHET_AGENTS" in f["Environment"]["Variables"]
    ]
    assert registered == [{"billing": "billing_agent.agent:agent"}] * 2  # the api and the step


def test_a_requirement_that_moves_a_pinned_version_fails_the_bundle(tmp_path: Path) -> None:
    project_dir = tmp_path / "project"
    (project_dir / "src" / "acme").mkdir(parents=True)
    (project_dir / "src" / "acme" / "__init__.py").write_text("agent = None\n")
    (project_dir / "ratchet.toml").write_text(
        'agents = { acme = "acme:agent" }\nsource = "src"\nrequirements = ["pydantic<2"]\n'
    )
    project = Project.load(project_dir)

    bundling = PinnedWheelsBundling(RatchetCode.checkout(REPO_ROOT), project)
    with pytest.raises(BundlingFailed) as failed:
        bundling.try_bundle(str(tmp_path / "out"), image=None)  # type: ignore[arg-type]

    message = str(failed.value)
    assert message.startswith(f"{project_dir / 'ratchet.toml'}: requirements cannot be installed")
    assert "not change a version Ratchet pins" in message
    assert "pydantic<2" in message  # uv's own words name the conflict
