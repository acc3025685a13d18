"""Which CDK CLI `ratchet deploy` runs: a `cdk` on PATH, else the pinned major version through
`npx`, else one line saying what to install (`ratchet.cli.project.cdk_cli`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratchet.cli.project import CDK_CLI_PACKAGE, cdk_cli
from ratchet.errors import InvalidInput


def _executable(folder: Path, name: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_a_cdk_on_path_is_run_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cdk = _executable(tmp_path / "a", "cdk")
    _executable(tmp_path / "b", "npx")
    monkeypatch.setenv("PATH", f"{tmp_path / 'b'}:{tmp_path / 'a'}")

    assert cdk_cli() == [str(cdk)]


def test_without_a_cdk_npx_runs_the_pinned_major_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    npx = _executable(tmp_path / "b", "npx")
    monkeypatch.setenv("PATH", str(tmp_path / "b"))

    assert cdk_cli() == [str(npx), "--yes", CDK_CLI_PACKAGE]
    assert CDK_CLI_PACKAGE == "aws-cdk@2"


def test_with_neither_it_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(InvalidInput, match=r"neither a cdk nor an npx on PATH"):
        cdk_cli()
