"""Package the Lambda code without Docker: locked wheels for the Lambda platform, plus `ratchet`.

CI has no Docker, so the asset is built on the host. The dependencies are the versions `uv.lock`
pins for the project (exported without the dev extra, so the tests ran against the same ones),
installed as binary wheels for the Lambda's CPU and Python version whatever the host runs.
The bundle also carries bytecode compiled by this very interpreter: Lambda's code folder is
read-only, so without it every cold start compiles everything again (3.2-3.9 s to import the
step handler instead of 0.7-0.9 s, measured). That is why the runtime is the synthesizing
Python's version. One asset serves every function, so it is built once per synth.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import (
    AssetHashType,
    BundlingOptions,
    DockerImage,
    ILocalBundling,
)
from aws_cdk import aws_lambda as lambda_

PYTHON_VERSION = "3.11"
RUNTIME = lambda_.Runtime.PYTHON_3_11
ARCHITECTURE = lambda_.Architecture.ARM_64
WHEEL_PLATFORM = "aarch64-manylinux2014"
"""uv's name for the manylinux2014 aarch64 platform tag, matching `ARCHITECTURE`."""

PACKAGE = "ratchet"
_RECIPE = "locked-wheels-v1"
"""Part of the asset hash: bump it when the bundling steps change, so old bundles are not reused."""

_IGNORED = {"__pycache__"}


class BundlingFailed(RuntimeError):
    """The asset could not be built; the message says which command failed and how."""


def _source_files(package_dir: Path) -> Iterator[Path]:
    for path in sorted(package_dir.rglob("*")):
        if path.is_file() and not _IGNORED.intersection(path.parts) and path.suffix != ".pyc":
            yield path


def _uv(repo_root: Path) -> str:
    # The Makefile pins uv into .tools/; a developer's own uv on PATH works as well.
    pinned = repo_root / ".tools" / "bin" / "uv"
    if pinned.exists():
        return str(pinned)
    found = shutil.which("uv")
    if found is None:
        raise BundlingFailed("uv not found: run `make` first (it installs uv into .tools/)")
    return found


def _run(command: list[str], cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BundlingFailed(
            f"`{' '.join(command)}` failed with exit code {done.returncode}:\n{done.stderr}"
        )


@jsii.implements(ILocalBundling)
class LockedWheelsBundling:
    """Builds the asset on the host (`ILocalBundling`), never in Docker."""

    def __init__(self, repo_root: Path) -> None:
        self._repo_root = repo_root

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_options: Any) -> bool:
        """Build the asset in `output_dir`; `image` and the other Docker options go unused."""
        out = Path(output_dir)
        with tempfile.TemporaryDirectory(prefix="ratchet-bundle-") as scratch:
            requirements = Path(scratch) / "requirements.txt"
            uv = _uv(self._repo_root)
            _run(
                [
                    uv, "export", "--frozen", "--no-dev", "--no-emit-project", "--no-header",
                    "--no-annotate", "--format", "requirements.txt",
                    "--output-file", str(requirements),
                ],
                cwd=self._repo_root,
            )  # fmt: skip
            _run(
                [
                    uv, "pip", "install", "--quiet", "--target", str(out), "--no-deps",
                    "--only-binary", ":all:", "--python-platform", WHEEL_PLATFORM,
                    "--python-version", PYTHON_VERSION, "--requirement", str(requirements),
                ],
                cwd=self._repo_root,
            )  # fmt: skip
        package_dir = self._repo_root / "lambdas" / PACKAGE
        for source in _source_files(package_dir):
            target = out / PACKAGE / source.relative_to(package_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        _compile_bytecode(out)
        # Returning False would make CDK fall back to Docker, which CI does not have; a failure
        # above raises with the command's output instead.
        return True


def _compile_bytecode(out: Path) -> None:
    """Compile the bundle for the runtime's Python, if this interpreter is that Python.

    `unchecked-hash` pycs are used whatever the files' timestamps become in the asset zip.
    """
    if f"{sys.version_info.major}.{sys.version_info.minor}" != PYTHON_VERSION:
        raise BundlingFailed(
            f"the Lambda runtime is Python {PYTHON_VERSION} and its bytecode is compiled by the "
            f"synthesizing interpreter, but this is Python {sys.version.split()[0]}: synthesize "
            "from the project's .venv (`make synth`)"
        )
    _run(
        [
            sys.executable, "-m", "compileall", "-q", "-j", "0",
            "--invalidation-mode", "unchecked-hash", str(out),
        ],
        cwd=out,
    )  # fmt: skip


def asset_hash(repo_root: Path) -> str:
    """A hash of everything that goes into the bundle: the recipe, the lock and the code.

    It lets CDK reuse a bundle already in the output folder (a second synth is fast) and makes
    a deploy update the functions exactly when the code or a pinned dependency changed.
    """
    digest = hashlib.sha256()
    for part in (_RECIPE, PYTHON_VERSION, WHEEL_PLATFORM):
        digest.update(part.encode() + b"\0")
    digest.update((repo_root / "uv.lock").read_bytes())
    package_dir = repo_root / "lambdas" / PACKAGE
    for source in _source_files(package_dir):
        digest.update(source.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(source.read_bytes() + b"\0")
    return digest.hexdigest()


def lambda_code(repo_root: Path) -> lambda_.Code:
    """The one code asset every function uses.

    The asset's source is `lambdas/`, so when bundling is skipped (CDK's
    `aws:cdk:bundling-stacks` context, which template-only tests set) the functions still point
    at a folder holding the `ratchet` package.
    """
    return lambda_.Code.from_asset(
        str(repo_root / "lambdas"),
        asset_hash_type=AssetHashType.CUSTOM,
        asset_hash=asset_hash(repo_root),
        exclude=["**/__pycache__", "**/*.pyc"],
        bundling=BundlingOptions(
            local=LockedWheelsBundling(repo_root),
            # Required by the API; used only if local bundling declined, which it never does.
            image=RUNTIME.bundling_image,
        ),
    )
