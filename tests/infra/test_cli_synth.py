"""`cdk synth` through the CDK CLI, as CI and a newcomer run it: no AWS credentials, no Docker,
the functions bundled for real (locked wheels for Lambda's arm64 Python)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ratchet.cdk.bundling import PYTHON_VERSION
from tests.infra.synth import REPO_ROOT

pytestmark = pytest.mark.slow

CDK = REPO_ROOT / "node_modules" / ".bin" / "cdk"


def _without_aws_or_docker(scratch: Path) -> dict[str, str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AWS_", "CDK_")) and key != "DOCKER_HOST"
    }
    environment.update(
        AWS_CONFIG_FILE=str(scratch / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(scratch / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        # Any attempt to run Docker fails the synth instead of quietly succeeding here.
        CDK_DOCKER="false",
    )
    return environment


def test_cdk_synth_bundles_for_lambda_without_credentials_or_docker(tmp_path: Path) -> None:
    # One test, so that the 10-20 s bundle is built once however xdist spreads the tests.
    assert CDK.exists(), f"{CDK} is missing: run `make test` (it runs `npm ci`)"
    out = tmp_path / "cdk.out"

    done = subprocess.run(
        [str(CDK), "synth", "--quiet", "--output", str(out)],
        cwd=REPO_ROOT,
        env=_without_aws_or_docker(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "Ratchet.template.json").exists()
    (bundle,) = [p for p in out.iterdir() if p.name.startswith("asset.") and p.is_dir()]
    assert (bundle / "ratchet" / "handlers" / "step.py").exists()
    tag = PYTHON_VERSION.replace(".", "")
    # Compiled for the runtime, not copied from the developer's tree: Lambda cannot write
    # bytecode, so a bundle without it pays for compiling every module on each cold start.
    assert (bundle / "ratchet" / "handlers" / "__pycache__" / f"step.cpython-{tag}.pyc").exists()
    assert (bundle / "pydantic" / "__pycache__" / f"main.cpython-{tag}.pyc").exists()
    assert [p.name for p in (bundle / "pydantic_core").glob("*.so")] == [
        f"_pydantic_core.cpython-{tag}-aarch64-linux-gnu.so"
    ]
    # The handlers trace with Powertools' Tracer, which imports aws_xray_sdk in Lambda: without
    # it every function fails at cold start. It comes with `aws-lambda-powertools[tracer]`.
    assert (bundle / "aws_xray_sdk").is_dir(), "the bundle lacks aws_xray_sdk"
