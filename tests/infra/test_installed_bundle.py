"""Ratchet as a user's project installs it: the wheel `uv build` makes (`make dist`) carries the
construct's data (the state machine and the functions' entry points, as the repository has
them), and the construct bundles the functions from that installed package, with no uv.lock
and no src/ of Ratchet's: its dependencies pinned to the versions installed where the synth
runs, for Lambda's platform."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ratchet.cdk.bundling import PYTHON_VERSION, BundlingFailed, PinnedWheelsBundling
from ratchet.cdk.project import Project
from ratchet.cdk.sources import ASL_FILE, ENTRY_POINTS_FOLDER, RatchetCode
from tests.infra.synth import REPO_ROOT, USER_AGENT, USER_PROJECT

pytestmark = pytest.mark.slow

UV = REPO_ROOT / ".tools" / "bin" / "uv"
ASSETS = "ratchet/cdk/_assets"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel a release publishes, built from this tree into a folder of its own."""
    assert UV.exists(), f"{UV} is missing: run `make test` (it installs the pinned uv)"
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [str(UV), "build", "--quiet", "--wheel", "--out-dir", str(dist), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (built,) = dist.glob("ratchet_agents-*-py3-none-any.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's files as an installer lays them out: the folder that holds `ratchet/`."""
    site = tmp_path_factory.mktemp("site-packages")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_the_wheel_ships_the_state_machine_and_the_entry_points(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        shipped = {name: archive.read(name) for name in names if name.startswith(ASSETS)}

    entry_points = {
        f"{ASSETS}/{ENTRY_POINTS_FOLDER.as_posix()}/{path.name}": path.read_bytes()
        for path in sorted((REPO_ROOT / ENTRY_POINTS_FOLDER).glob("*.py"))
    }
    asl = {f"{ASSETS}/{ASL_FILE.as_posix()}": (REPO_ROOT / ASL_FILE).read_bytes()}
    assert shipped == asl | entry_points
    assert {"ratchet/cdk/__init__.py", "ratchet/cdk/stack.py"} <= names


def test_the_installed_package_finds_its_assets_and_no_lock(installed: Path) -> None:
    probe = (
        "import json\n"
        "from ratchet.cdk.sources import RatchetCode\n"
        "code = RatchetCode.find()\n"
        "print(json.dumps([str(code.library), str(code.state_machine), code.lock]))\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=installed,
        env=environment | {"PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    library, state_machine, lock = json.loads(done.stdout)
    assert library == str(installed / "ratchet")
    assert state_machine == str(installed / ASSETS / ASL_FILE)
    assert lock is None


def _project(folder: Path, requirements: str) -> Project:
    (folder / "src" / "greeter").mkdir(parents=True)
    (folder / "src" / "greeter" / "__init__.py").write_text("")
    (folder / "src" / "greeter" / "agent.py").write_text(USER_AGENT)
    (folder / "pyproject.toml").write_text(USER_PROJECT + f"requirements = {requirements}\n")
    return Project.load(folder)


def test_the_functions_bundle_from_the_installed_package(installed: Path, tmp_path: Path) -> None:
    # jmespath is among Ratchet's own dependencies: the project's requirement resolves with
    # Ratchet's pins, as the locked path resolves it with the lock.
    project = _project(tmp_path / "project", '["jmespath"]')
    out = tmp_path / "bundle"
    out.mkdir()

    PinnedWheelsBundling(RatchetCode.installed(installed / "ratchet"), project).try_bundle(
        str(out),
        image=None,  # type: ignore[arg-type]
    )

    tag = PYTHON_VERSION.replace(".", "")
    assert (out / "ratchet" / "handlers" / "__pycache__" / f"step.cpython-{tag}.pyc").is_file()
    assert not (out / "ratchet" / "cdk").exists()  # builds the stack; never runs on Lambda
    assert (out / "ratchet_functions" / "step.py").is_file()
    assert (out / "greeter" / "agent.py").is_file()
    assert [p.name for p in (out / "pydantic_core").glob("*.so")] == [
        f"_pydantic_core.cpython-{tag}-aarch64-linux-gnu.so"
    ]
    bundled = {
        d.metadata["Name"].lower(): d.version
        for d in importlib.metadata.distributions(path=[str(out)])
    }
    for name in ("pydantic", "boto3", "anthropic", "aws-xray-sdk", "jmespath"):
        assert bundled[name] == importlib.metadata.version(name), name


def test_a_requirement_that_moves_an_installed_pin_fails_the_bundle(
    installed: Path, tmp_path: Path
) -> None:
    project = _project(tmp_path / "project", '["pydantic<2"]')
    bundling = PinnedWheelsBundling(RatchetCode.installed(installed / "ratchet"), project)

    with pytest.raises(BundlingFailed) as failed:
        bundling.try_bundle(str(tmp_path / "out"), image=None)  # type: ignore[arg-type]

    message = str(failed.value)
    assert message.startswith(f"{project.config_file}: [tool.ratchet] requirements cannot be")
    assert f"Ratchet's dependencies as installed here ({sys.prefix})" in message
    assert "pydantic<2" in message
