"""The code asset's hash: it changes exactly when what goes into the bundle changes."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from ratchet.cdk.bundling import BundlingFailed, PinnedWheelsBundling, asset_hash, installed_pins
from ratchet.cdk.sources import RatchetCode
from tests.infra.synth import REPO_ROOT


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    package = tmp_path / "src" / "ratchet"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""ratchet"""\n')
    (package / "handlers.py").write_text("def handler(event, context):\n    return event\n")
    entry_points = tmp_path / "lambdas" / "ratchet_functions"
    entry_points.mkdir(parents=True)
    (entry_points / "step.py").write_text("from ratchet.handlers import handler\n")
    (tmp_path / "uv.lock").write_text("version = 1\n")
    return tmp_path


def test_hash_changes_with_the_code(repo: Path) -> None:
    before = asset_hash(RatchetCode.checkout(repo))
    (repo / "src" / "ratchet" / "handlers.py").write_text("def handler(e, c):\n    return 1\n")
    assert asset_hash(RatchetCode.checkout(repo)) != before


def test_hash_changes_with_an_entry_point(repo: Path) -> None:
    before = asset_hash(RatchetCode.checkout(repo))
    (repo / "lambdas" / "ratchet_functions" / "step.py").write_text("handler = print\n")
    assert asset_hash(RatchetCode.checkout(repo)) != before


def test_hash_changes_when_a_file_moves_between_the_library_and_the_entry_points(
    repo: Path,
) -> None:
    before = asset_hash(RatchetCode.checkout(repo))
    moved = repo / "lambdas" / "ratchet_functions" / "handlers.py"
    (repo / "src" / "ratchet" / "handlers.py").rename(moved)
    assert asset_hash(RatchetCode.checkout(repo)) != before


def test_hash_changes_with_the_lock(repo: Path) -> None:
    before = asset_hash(RatchetCode.checkout(repo))
    (repo / "uv.lock").write_text("version = 2\n")
    assert asset_hash(RatchetCode.checkout(repo)) != before


def test_hash_changes_when_a_module_is_renamed(repo: Path) -> None:
    before = asset_hash(RatchetCode.checkout(repo))
    package = repo / "src" / "ratchet"
    (package / "handlers.py").rename(package / "handler.py")
    assert asset_hash(RatchetCode.checkout(repo)) != before


def test_hash_ignores_bytecode(repo: Path) -> None:
    before = asset_hash(RatchetCode.checkout(repo))
    cache = repo / "src" / "ratchet" / "__pycache__"
    cache.mkdir()
    (cache / "handlers.cpython-311.pyc").write_bytes(b"\x00compiled")
    assert asset_hash(RatchetCode.checkout(repo)) == before


def test_a_failed_bundle_says_which_command_failed(repo: Path, tmp_path: Path) -> None:
    # The pinned uv, but a "repository" with no pyproject.toml: the export fails.
    (repo / ".tools").symlink_to(REPO_ROOT / ".tools")
    bundling = PinnedWheelsBundling(RatchetCode.checkout(repo))
    with pytest.raises(BundlingFailed, match="uv export"):
        bundling.try_bundle(str(tmp_path / "out"), image=None)  # type: ignore[arg-type]


def test_an_installed_ratchet_pins_its_functions_dependencies_as_installed_here() -> None:
    pins = dict(pin.split("==") for pin in installed_pins())

    # The base dependencies, the aws and anthropic extras, and theirs (Powertools' tracer).
    for name in ("pydantic", "boto3", "botocore", "anthropic", "aws-xray-sdk", "croniter"):
        assert pins[name] == importlib.metadata.version(name), name
    # Neither the extras the functions do not use, nor Ratchet itself (the bundle copies it).
    assert not {"pytest", "moto", "aws-cdk-lib", "mcp", "ratchet-agents"} & set(pins)
