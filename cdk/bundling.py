"""Package the Lambda code without Docker: locked wheels for the Lambda platform, `ratchet` (the
library, from `src/`) and the functions' entry points (`lambdas/ratchet_functions`).

CI has no Docker, so the asset is built on the host. The dependencies are the versions `uv.lock`
pins for the project (exported without the dev extra, so the tests ran against the same ones),
installed as binary wheels for the Lambda's CPU and Python version whatever the host runs.
The bundle also carries bytecode compiled by this very interpreter: Lambda's code folder is
read-only, so without it every cold start compiles everything again (3.2-3.9 s to import the
step handler instead of 0.7-0.9 s, measured). That is why the runtime is the synthesizing
Python's version. One asset serves every function, so it is built once per synth.

A user's project (`cdk/project.py`) adds its packages and its `requirements`. The requirements
are resolved together with Ratchet's locked set, which also constrains them (uv's
`--constraint`): a requirement may add packages, but one that needs another version of a
package Ratchet pins fails the synth, saying which. An override (`--override`) would instead
install Ratchet's version under a library that declared it cannot work with it.
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

from cdk.project import Project

PYTHON_VERSION = "3.11"
RUNTIME = lambda_.Runtime.PYTHON_3_11
ARCHITECTURE = lambda_.Architecture.ARM_64
WHEEL_PLATFORM = "aarch64-manylinux2014"
"""uv's name for the manylinux2014 aarch64 platform tag, matching `ARCHITECTURE`."""

PACKAGE = "ratchet"
ENTRY_POINTS = "ratchet_functions"
_RECIPE = "locked-wheels-v2"
"""Part of the asset hash: bump it when the bundling steps change, so old bundles are not reused."""

_IGNORED = {"__pycache__"}
_EXTRAS = ("aws", "anthropic")
"""The extras of Ratchet's own pyproject.toml the functions need (boto3 and Powertools, the
Anthropic client), exported from the lock with the base dependencies."""


class BundlingFailed(RuntimeError):
    """The asset could not be built; the message says which command failed and how."""


def _source_files(package_dir: Path) -> Iterator[Path]:
    for path in sorted(package_dir.rglob("*")):
        if path.is_file() and not _IGNORED.intersection(path.parts) and path.suffix != ".pyc":
            yield path


def _packages(repo_root: Path) -> list[tuple[str, Path]]:
    """The bundle's own packages, by import name: the library and the entry points."""
    return [
        (PACKAGE, repo_root / "src" / PACKAGE),
        (ENTRY_POINTS, repo_root / "lambdas" / ENTRY_POINTS),
    ]


def _uv(repo_root: Path) -> str:
    # The Makefile pins uv into .tools/; a developer's own uv on PATH works as well.
    pinned = repo_root / ".tools" / "bin" / "uv"
    if pinned.exists():
        return str(pinned)
    found = shutil.which("uv")
    if found is None:
        raise BundlingFailed("uv not found: run `make` first (it installs uv into .tools/)")
    return found


def _run(command: list[str], cwd: Path, *, failure: str | None = None) -> None:
    """Run `command`; if it fails, `BundlingFailed` with what it said on stderr, after
    `failure` (what went wrong, in the project's words) or else the command itself."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return
    if failure is not None:
        raise BundlingFailed(f"{failure} uv says:\n{done.stderr.strip()}")
    raise BundlingFailed(
        f"`{' '.join(command)}` failed with exit code {done.returncode}:\n{done.stderr}"
    )


@jsii.implements(ILocalBundling)
class LockedWheelsBundling:
    """Builds the asset on the host (`ILocalBundling`), never in Docker."""

    def __init__(self, repo_root: Path, project: Project | None = None) -> None:
        self._repo_root = repo_root
        self._project = project

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_options: Any) -> bool:
        """Build the asset in `output_dir`; `image` and the other Docker options go unused."""
        out = Path(output_dir)
        with tempfile.TemporaryDirectory(prefix="ratchet-bundle-") as scratch:
            locked = Path(scratch) / "requirements.txt"
            uv = _uv(self._repo_root)
            extras = [arg for extra in _EXTRAS for arg in ("--extra", extra)]
            _run(
                [
                    uv, "export", "--frozen", "--no-dev", *extras, "--no-emit-project",
                    "--no-header", "--no-annotate", "--format", "requirements.txt",
                    "--output-file", str(locked),
                ],
                cwd=self._repo_root,
            )  # fmt: skip
            install = [
                uv, "pip", "install", "--quiet", "--target", str(out), "--only-binary", ":all:",
                "--python-platform", WHEEL_PLATFORM, "--python-version", PYTHON_VERSION,
                "--requirement", str(locked),
            ]  # fmt: skip
            if self._project is None or not self._project.requirements:
                # The lock is the whole closure: install it exactly, resolving nothing.
                _run([*install, "--no-deps"], cwd=self._repo_root)
            else:
                wanted = Path(scratch) / "project-requirements.txt"
                wanted.write_text("\n".join(self._project.requirements) + "\n")
                _run(
                    [*install, "--requirement", str(wanted), "--constraint", str(locked)],
                    cwd=self._repo_root,
                    failure=f"{self._project.config_file}: {self._project.key_prefix}"
                    "requirements cannot be installed with Ratchet's locked dependencies "
                    f"(uv.lock) as binary wheels for Lambda ({WHEEL_PLATFORM}, Python "
                    f"{PYTHON_VERSION}). A requirement may add packages but not change a "
                    "version Ratchet pins.",
                )
        for name, package_dir in _packages(self._repo_root):
            for source in _source_files(package_dir):
                target = out / name / source.relative_to(package_dir)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        if self._project is not None:
            _copy_project(self._project, out)
        _compile_bytecode(out)
        # Returning False would make CDK fall back to Docker, which CI does not have; a failure
        # above raises with the command's output instead.
        return True


def _copy_project(project: Project, out: Path) -> None:
    taken = {p.name for p in out.iterdir()} | {p.stem for p in out.glob("*.py")}
    for name, entry in project.top_level().items():
        if name in taken:
            clash = (
                f"{entry} has the import name {name!r} of a package already in the bundle "
                "(Ratchet or a dependency); rename it"
            )
            raise BundlingFailed(str(project.error("source", clash)))
    for shipped in project.shipped_files():
        target = out / shipped.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(shipped.source, target)


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


def asset_hash(repo_root: Path, project: Project | None = None) -> str:
    """A hash of everything that goes into the bundle: the recipe, the lock, the code, and the
    project's files and requirements.

    It lets CDK reuse a bundle already in the output folder (a second synth is fast) and makes
    a deploy update the functions exactly when the code or a pinned dependency changed. A
    project requirement is hashed as written: pin it (`==`) for a deploy to follow an upgrade.
    """
    digest = hashlib.sha256()
    for part in (_RECIPE, PYTHON_VERSION, WHEEL_PLATFORM):
        digest.update(part.encode() + b"\0")
    digest.update((repo_root / "uv.lock").read_bytes())
    for name, package_dir in _packages(repo_root):
        for source in _source_files(package_dir):
            digest.update(f"{name}/{source.relative_to(package_dir).as_posix()}".encode() + b"\0")
            digest.update(source.read_bytes() + b"\0")
    if project is not None:
        digest.update(b"project\0")
        for requirement in project.requirements:
            digest.update(b"requires\0" + requirement.encode() + b"\0")
        for shipped in project.shipped_files():
            digest.update(shipped.path.encode() + b"\0")
            digest.update(shipped.source.read_bytes() + b"\0")
    return digest.hexdigest()


def lambda_code(repo_root: Path, project: Project | None = None) -> lambda_.Code:
    """The one code asset every function uses.

    The asset's source is `lambdas/`, so when bundling is skipped (CDK's
    `aws:cdk:bundling-stacks` context, which template-only tests set) the functions still point
    at a folder holding the entry points their handlers name.
    """
    return lambda_.Code.from_asset(
        str(repo_root / "lambdas"),
        asset_hash_type=AssetHashType.CUSTOM,
        asset_hash=asset_hash(repo_root, project),
        exclude=["**/__pycache__", "**/*.pyc"],
        bundling=BundlingOptions(
            local=LockedWheelsBundling(repo_root, project),
            # Required by the API; used only if local bundling declined, which it never does.
            image=RUNTIME.bundling_image,
        ),
    )
