"""Package the Lambda code without Docker: Ratchet's dependencies as binary wheels for the Lambda
platform, `ratchet` (the library) and the functions' entry points (`ratchet_functions`).

CI has no Docker, so the asset is built on the host, installed as binary wheels for the
Lambda's CPU and Python version whatever the host runs. The bundle also carries bytecode
compiled by this very interpreter: Lambda's code folder is read-only, so without it every cold
start compiles everything again (3.2-3.9 s to import the step handler instead of 0.7-0.9 s,
measured). That is why the runtime is the synthesizing Python's version. One asset serves every
function, so it is built once per synth.

Which versions (`sources.RatchetCode`): in Ratchet's own checkout, those `uv.lock` pins for the
project (exported without the dev extra, so the tests ran against the same ones). From an
installed wheel, in a user's project, no lock of Ratchet's exists: its runtime dependencies
(the base ones and the `aws` and `anthropic` extras, as Lambda's platform evaluates their
markers) are pinned to the versions installed where the synth runs, which is where the project's
own tests ran, and uv resolves them for Lambda. The library is the package itself, either way,
less its `cdk` subpackage (which builds the stack and never runs on Lambda).

A user's project (`project.py`) adds its packages and its `requirements`. The requirements are
resolved together with Ratchet's pinned set, which also constrains them (uv's `--constraint`):
a requirement may add packages, but one that needs another version of a package Ratchet pins
fails the synth, saying which. An override (`--override`) would instead install Ratchet's
version under a library that declared it cannot work with it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import sysconfig
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
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ratchet.cdk.project import Project
from ratchet.cdk.sources import CONSTRUCT, ENTRY_POINTS, LIBRARY, RatchetCode

PYTHON_VERSION = "3.11"
RUNTIME = lambda_.Runtime.PYTHON_3_11
ARCHITECTURE = lambda_.Architecture.ARM_64
WHEEL_PLATFORM = "aarch64-manylinux2014"
"""uv's name for the manylinux2014 aarch64 platform tag, matching `ARCHITECTURE`."""

DISTRIBUTION = "ratchet-agents"
"""Ratchet's distribution, whose installed metadata lists its dependencies."""
_RECIPE = "locked-wheels-v2"
"""Part of the asset hash: bump it when the bundling steps change, so old bundles are not reused."""
_INSTALLED_RECIPE = "installed-wheels-v1"
"""The same, for the bundle of an installed wheel (its pins come from the environment)."""

_IGNORED = {"__pycache__"}
_EXTRAS = ("aws", "anthropic")
"""The extras of Ratchet's own pyproject.toml the functions need (boto3 and Powertools, the
Anthropic client), with the base dependencies: exported from the lock, or read from the
installed metadata."""
SEALING_EXTRAS = ("encryption",)
"""And those of a deployment that seals payloads (`ratchet:payloadEncryption`): the codec's
AES-GCM (`cryptography`). Without the setting the bundle is what it was without the codec."""


def bundled_extras(*, sealing: bool) -> tuple[str, ...]:
    return _EXTRAS + SEALING_EXTRAS if sealing else _EXTRAS


LAMBDA_MARKERS = {
    "implementation_name": "cpython",
    "os_name": "posix",
    "platform_machine": "aarch64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_version": PYTHON_VERSION,
    "sys_platform": "linux",
}
"""How Lambda's platform answers a requirement's environment markers: a dependency the host
needs only for itself (`colorama; sys_platform == "win32"`) is none of the bundle's."""


class BundlingFailed(RuntimeError):
    """The asset could not be built; the message says which command failed and how."""


def _source_files(package_dir: Path, *, leave_out: str | None = None) -> Iterator[Path]:
    for path in sorted(package_dir.rglob("*")):
        relative = path.relative_to(package_dir).parts
        if leave_out is not None and relative[0] == leave_out:
            continue
        if path.is_file() and not _IGNORED.intersection(relative) and path.suffix != ".pyc":
            yield path


def _packages(code: RatchetCode) -> Iterator[tuple[str, Path]]:
    """Each file of the bundle's own packages: its path in the bundle, and where it is."""
    for name, package_dir, leave_out in (
        (LIBRARY, code.library, CONSTRUCT),
        (ENTRY_POINTS, code.entry_points, None),
    ):
        for source in _source_files(package_dir, leave_out=leave_out):
            yield f"{name}/{source.relative_to(package_dir).as_posix()}", source


def _uv(code: RatchetCode) -> str:
    # The Makefile pins uv into a checkout's .tools/; the [cdk] extra installs it beside the
    # interpreter; a developer's own uv on PATH works as well.
    candidates = [Path(sysconfig.get_path("scripts")) / "uv"]
    if code.repo_root is not None:
        candidates.insert(0, code.repo_root / ".tools" / "bin" / "uv")
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    found = shutil.which("uv")
    if found is not None:
        return found
    if code.repo_root is not None:
        raise BundlingFailed("uv not found: run `make` first (it installs uv into .tools/)")
    raise BundlingFailed(
        "uv not found: it installs the functions' dependencies for Lambda; "
        "`pip install 'ratchet-agents[cdk]'` brings it (or `pip install uv`)"
    )


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


def installed_pins(
    distribution: str = DISTRIBUTION, *, bundled: tuple[str, ...] = _EXTRAS
) -> list[str]:
    """`name==version` of every distribution the functions need from Ratchet's installed
    metadata: its requirements with the `bundled` extras (`aws` and `anthropic`; `bundled_extras`),
    and theirs, as Lambda's platform evaluates their markers, each at the version installed
    here.

    A requirement with nothing installed here is left to uv (a package only Lambda's platform
    needs); the requirement of the one that needs it still bounds it."""
    markers = {key: str(value) for key, value in default_environment().items()}
    markers |= LAMBDA_MARKERS | {"python_full_version": f"{PYTHON_VERSION}.0"}
    pins: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(distribution, frozenset(bundled))]
    walked: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in walked:
            continue
        walked.add((name, extras))
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            if name == distribution:
                raise BundlingFailed(
                    f"{distribution} is not installed in {sys.prefix}: install it there "
                    f"(`pip install '{distribution}[cdk]'`), then synthesize again"
                ) from None
            continue
        for text in requires:
            requirement = Requirement(text)
            wanted = requirement.marker is None or any(
                requirement.marker.evaluate({**markers, "extra": extra})
                for extra in (*sorted(extras), "")
            )
            if not wanted or canonicalize_name(requirement.name) == canonicalize_name(distribution):
                continue
            try:
                pins[canonicalize_name(requirement.name)] = importlib.metadata.version(
                    requirement.name
                )
            except importlib.metadata.PackageNotFoundError:
                continue
            todo.append((requirement.name, frozenset(requirement.extras)))
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


@jsii.implements(ILocalBundling)
class PinnedWheelsBundling:
    """Builds the asset on the host (`ILocalBundling`), never in Docker."""

    def __init__(
        self, code: RatchetCode, project: Project | None = None, *, sealing: bool = False
    ) -> None:
        self._code = code
        self._project = project
        self._extras = bundled_extras(sealing=sealing)

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_options: Any) -> bool:
        """Build the asset in `output_dir`; `image` and the other Docker options go unused."""
        out = Path(output_dir)
        with tempfile.TemporaryDirectory(prefix="ratchet-bundle-") as scratch:
            self._install_dependencies(out, Path(scratch))
        for path, source in _packages(self._code):
            target = out / path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        if self._project is not None:
            _copy_project(self._project, out)
        _compile_bytecode(out)
        # Returning False would make CDK fall back to Docker, which CI does not have; a failure
        # above raises with the command's output instead.
        return True

    def _install_dependencies(self, out: Path, scratch: Path) -> None:
        uv = _uv(self._code)
        cwd = self._code.repo_root or scratch
        pinned = scratch / "requirements.txt"
        if self._code.lock is not None:
            extras = [arg for extra in self._extras for arg in ("--extra", extra)]
            _run(
                [
                    uv, "export", "--frozen", "--no-dev", *extras, "--no-emit-project",
                    "--no-header", "--no-annotate", "--format", "requirements.txt",
                    "--output-file", str(pinned),
                ],
                cwd=cwd,
            )  # fmt: skip
            pinned_by = "Ratchet's locked dependencies (uv.lock)"
        else:
            pinned.write_text("\n".join(installed_pins(bundled=self._extras)) + "\n")
            pinned_by = f"Ratchet's dependencies as installed here ({sys.prefix})"
        install = [
            uv, "pip", "install", "--quiet", "--target", str(out), "--only-binary", ":all:",
            "--python-platform", WHEEL_PLATFORM, "--python-version", PYTHON_VERSION,
            "--requirement", str(pinned),
        ]  # fmt: skip
        if self._project is None or not self._project.requirements:
            # The lock is the whole closure: install it exactly, resolving nothing. Pins taken
            # from an environment leave out what only Lambda's platform needs: uv adds it.
            _run([*install, "--no-deps"] if self._code.lock else install, cwd=cwd)
            return
        wanted = scratch / "project-requirements.txt"
        wanted.write_text("\n".join(self._project.requirements) + "\n")
        _run(
            [*install, "--requirement", str(wanted), "--constraint", str(pinned)],
            cwd=cwd,
            failure=f"{self._project.config_file}: {self._project.key_prefix}"
            f"requirements cannot be installed with {pinned_by} as binary wheels for Lambda "
            f"({WHEEL_PLATFORM}, Python {PYTHON_VERSION}). A requirement may add packages but "
            "not change a version Ratchet pins.",
        )


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
            f"with Python {PYTHON_VERSION} (in Ratchet's checkout, its .venv: `make synth`)"
        )
    _run(
        [
            sys.executable, "-m", "compileall", "-q", "-j", "0",
            "--invalidation-mode", "unchecked-hash", str(out),
        ],
        cwd=out,
    )  # fmt: skip


def asset_hash(code: RatchetCode, project: Project | None = None, *, sealing: bool = False) -> str:
    """A hash of everything that goes into the bundle: the recipe, the pins (the lock, or the
    versions installed here), the code, and the project's files and requirements.

    It lets CDK reuse a bundle already in the output folder (a second synth is fast) and makes
    a deploy update the functions exactly when the code or a pinned dependency changed. A
    project requirement is hashed as written: pin it (`==`) for a deploy to follow an upgrade.
    """
    digest = hashlib.sha256()
    extras = bundled_extras(sealing=sealing)
    if code.lock is not None:
        parts: tuple[str, ...] = (_RECIPE, PYTHON_VERSION, WHEEL_PLATFORM)
    else:
        parts = (_INSTALLED_RECIPE, PYTHON_VERSION, WHEEL_PLATFORM, *installed_pins(bundled=extras))
    if sealing:
        # Only then: a bundle without the setting keeps the hash it had before the setting.
        parts += ("extras", *extras)
    for part in parts:
        digest.update(part.encode() + b"\0")
    if code.lock is not None:
        digest.update(code.lock.read_bytes())
    for path, source in _packages(code):
        digest.update(path.encode() + b"\0")
        digest.update(source.read_bytes() + b"\0")
    if project is not None:
        digest.update(b"project\0")
        for requirement in project.requirements:
            digest.update(b"requires\0" + requirement.encode() + b"\0")
        for shipped in project.shipped_files():
            digest.update(shipped.path.encode() + b"\0")
            digest.update(shipped.source.read_bytes() + b"\0")
    return digest.hexdigest()


def lambda_code(
    code: RatchetCode, project: Project | None = None, *, sealing: bool = False
) -> lambda_.Code:
    """The one code asset every function uses.

    The asset's source is the folder that holds the entry points, so when bundling is skipped
    (CDK's `aws:cdk:bundling-stacks` context, which template-only tests set) the functions
    still point at a folder holding the entry points their handlers name. With `sealing` the
    bundle also holds the payload codec's dependencies (`SEALING_EXTRAS`).
    """
    return lambda_.Code.from_asset(
        str(code.entry_points.parent),
        asset_hash_type=AssetHashType.CUSTOM,
        asset_hash=asset_hash(code, project, sealing=sealing),
        exclude=["**/__pycache__", "**/*.pyc"],
        bundling=BundlingOptions(
            local=PinnedWheelsBundling(code, project, sealing=sealing),
            # Required by the API; used only if local bundling declined, which it never does.
            image=RUNTIME.bundling_image,
        ),
    )
