"""The import contracts `make lint` checks (pyproject.toml's `[tool.importlinter]`, and
imports-in-annotations.toml's, which count imports made only for annotations) bite: on a copy of
the package, one forbidden import breaks the build and the report names it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = ("pyproject.toml", "imports-in-annotations.toml")


@dataclass(frozen=True)
class Copy:
    root: Path

    @property
    def package(self) -> Path:
        return self.root / "src" / "ratchet"

    def lint_imports(self) -> subprocess.CompletedProcess[str]:
        assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: run `make test`"
        # PYTHONPATH puts the copy ahead of the editable install of the real tree.
        env = os.environ | {"PYTHONPATH": str(self.root / "src"), "COLUMNS": "200"}
        return subprocess.run(
            [
                str(LINT_IMPORTS),
                *(str(self.root / c) for c in CONTRACTS),
                "--no-cache",
                "--no-logo",
            ],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def copy(tmp_path: Path) -> Copy:
    """The package and the very contracts `make lint` reads, copied under tmp_path."""
    shutil.copytree(
        REPO_ROOT / "src" / "ratchet",
        tmp_path / "src" / "ratchet",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for contracts in CONTRACTS:
        shutil.copy(REPO_ROOT / contracts, tmp_path / contracts)
    return Copy(tmp_path)


def test_the_unmodified_package_keeps_every_contract(copy: Copy) -> None:
    done = copy.lint_imports()

    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


FORBIDDEN = [
    # (file in the package, the line appended to it, the contract's source, what it may not import)
    ("engine/step.py", "import boto3", "ratchet.engine", "boto3"),
    ("engine/fold.py", "from botocore import exceptions", "ratchet.engine", "botocore"),
    ("engine/step.py", "import sqlite3", "ratchet.engine", "sqlite3"),
    ("engine/fold.py", "from ratchet.stored import head_json", "ratchet.engine", "ratchet.stored"),
    ("engine/attempt.py", "import ratchet.adapters", "ratchet.engine", "ratchet.adapters"),
    ("ports.py", "import anthropic", "ratchet.ports", "anthropic"),
    ("tools.py", "import aws_lambda_powertools", "ratchet.tools", "aws_lambda_powertools"),
    ("adapters/sqlite/store.py", "import ratchet.runtime", "ratchet.adapters", "ratchet.runtime"),
    (
        "adapters/sqlite/housekeeping.py",
        "from ratchet import housekeeping",
        "ratchet.adapters",
        "ratchet.housekeeping",
    ),
    ("scenarios/migration.py", "import ratchet.cli", "ratchet.scenarios", "ratchet.cli"),
    ("approvals/desk.py", "import ratchet.client", "ratchet.approvals", "ratchet.client"),
    ("client.py", "import ratchet.cli", "ratchet.client", "ratchet.cli"),
    ("cli/quick.py", "import typer", "ratchet.cli.quick", "typer"),
    ("cli/quick_writes.py", "import typer", "ratchet.cli.quick_writes", "typer"),
    # the full CLI never imports the entry point back (it hands on to the full CLI)
    ("cli/inspection.py", "import ratchet.cli.quick", "ratchet.cli.app", "ratchet.cli.quick"),
    # the floors (docs/architecture.md), one crossing each
    ("client.py", "import ratchet.runtime", "ratchet.client", "ratchet.runtime"),
    ("web/runs.py", "import ratchet.runtime", "ratchet.web", "ratchet.runtime"),
    ("worker.py", "import ratchet.client", "ratchet.worker", "ratchet.client"),
    ("adapters/outbox.py", "import ratchet.runs", "ratchet.adapters", "ratchet.runs"),
    ("approvals/desk.py", "import ratchet.tools", "ratchet.approvals", "ratchet.tools"),
    ("state.py", "import ratchet.engine", "ratchet.state", "ratchet.engine"),
    # the library knows no CDK: the construct (ratchet.cdk) is the [cdk] extra's face alone
    ("client.py", "import aws_cdk", "ratchet.client", "aws_cdk"),
    ("runtime/aws.py", "from constructs import Construct", "ratchet.runtime", "constructs"),
    ("handlers/step.py", "import ratchet.cdk", "ratchet.handlers", "ratchet.cdk"),
    # the apps get what they use from the runtime
    ("cli/housekeeping.py", "import ratchet.adapters", "ratchet.cli", "ratchet.adapters"),
    ("web/approvals.py", "from ratchet.engine import Engine", "ratchet.web", "ratchet.engine"),
    # adapters and the engine share what they both use on the ground floor (ratchet.backoff)
    ("adapters/anthropic_model.py", "import ratchet.engine", "ratchet.adapters", "ratchet.engine"),
    # the runs API's route modules: schedules and their shared floor never import the runs API
    ("web/schedules.py", "import ratchet.web.runs", "ratchet.web.schedules", "ratchet.web.runs"),
    (
        "web/routes.py",
        "import ratchet.web.schedules",
        "ratchet.web.routes",
        "ratchet.web.schedules",
    ),
    # the client names nothing of the runtime, even for an annotation
    (
        "client.py",
        "if TYPE_CHECKING: import ratchet.runtime",
        "ratchet.client",
        "ratchet.runtime",
    ),
]


@pytest.mark.parametrize(("module", "statement", "importer", "imported"), FORBIDDEN)
def test_one_forbidden_import_breaks_the_lint(
    copy: Copy, module: str, statement: str, importer: str, imported: str
) -> None:
    # Given the copy with one forbidden import appended (never executed: the linter only parses)
    source = copy.package / module
    lines = source.read_text(encoding="utf-8").splitlines()
    source.write_text("\n".join([*lines, statement, ""]), encoding="utf-8")
    offending = f"ratchet.{module.removesuffix('.py').replace('/', '.')}"

    done = copy.lint_imports()

    assert done.returncode != 0, done.stdout
    assert f"{importer} is not allowed to import {imported}" in done.stdout, done.stdout
    assert f"{offending} -> {imported} (l.{len(lines) + 1})" in done.stdout, done.stdout


def test_every_module_but_the_construct_and_the_cli_is_kept_from_the_cdk() -> None:
    # A module missing from the contract's list could import the CDK unseen: `import ratchet`
    # must work where only the library is installed.
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [
        c
        for c in pyproject["tool"]["importlinter"]["contracts"]
        if c["id"] == "library-imports-no-cdk"
    ]
    package = REPO_ROOT / "src" / "ratchet"
    modules = {
        f"ratchet.{path.stem}"
        for path in package.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }

    assert set(contract["source_modules"]) == modules - {"ratchet.cdk", "ratchet.cli"}
