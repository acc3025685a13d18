"""What a project may import: `ratchet` and `ratchet.tools` (and, in its CDK app, `ratchet.cdk`;
in its tests, `ratchet.testing`), and nothing deeper.

The names are pinned here: adding one is a decision (add it below too), and dropping or
renaming one breaks the projects that import it. The shipped example, the README and the docs
show only imports from the two faces, so what a user copies keeps working when internals move.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ratchet
from ratchet import tools

ROOT = Path(__file__).resolve().parents[2]

RATCHET = [
    "Agent",
    "AsyncClient",
    "Checkpoint",
    "Client",
    "Done",
    "EventSent",
    "ForkRefused",
    "HookOpened",
    "PermanentError",
    "RatchetError",
    "Run",
    "RunContext",
    "RunData",
    "RunListed",
    "RunNotFound",
    "RunPage",
    "RunRequestInvalid",
    "RunSpec",
    "RunState",
    "RunStatus",
    "Started",
    "StepView",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "WaitTimedOut",
    "ask_person",
    "connect",
    "sleep",
    "sleep_until",
    "start_runs",
    "tool",
    "wait_for_event",
    "wait_for_reply",
]
TOOLS = [
    "Agent",
    "ApprovalRequest",
    "Decision",
    "Done",
    "ForkRefused",
    "McpServer",
    "Model",
    "ModelOutputInvalid",
    "ModelReply",
    "ModelRequest",
    "ModelUnavailable",
    "PermanentError",
    "Policy",
    "RunContext",
    "RunData",
    "RunSpec",
    "RunState",
    "StepView",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "Usage",
    "ask_person",
    "sleep",
    "sleep_until",
    "start_runs",
    "tool",
    "wait_for_event",
    "wait_for_reply",
]
TESTING = [
    "ApprovalRule",
    "CheckReport",
    "Crash",
    "CrashKind",
    "FakeClock",
    "KeyTest",
    "Outcome",
    "Recording",
    "ScheduleRun",
    "Verdict",
    "WaitScript",
    "assert_idempotent",
    "check",
    "run_agent",
]
FACES = {"ratchet", "ratchet.tools", "ratchet.cdk", "ratchet.testing"}
"""`ratchet.cdk` is the construct's face, for a CDK app (tests/infra/test_cdk_face.py pins it);
`ratchet.testing` the test kit's, for a project's own tests (docs/testing-your-agent.md)."""


def test_ratchet_exports_exactly_its_pinned_names() -> None:
    assert ratchet.__all__ == RATCHET


def test_ratchet_tools_exports_exactly_its_pinned_names() -> None:
    assert sorted(tools.__all__) == TOOLS


def test_ratchet_testing_exports_exactly_its_pinned_names() -> None:
    from ratchet import testing

    assert sorted(testing.__all__) == TESTING
    assert all(getattr(testing, name) is not None for name in TESTING)


@pytest.mark.parametrize("name", RATCHET)
def test_each_name_of_ratchet_loads_and_is_the_one_its_module_defines(name: str) -> None:
    value = getattr(ratchet, name)
    assert name in dir(ratchet)
    if hasattr(value, "__module__") and not isinstance(value, str):
        assert getattr(importlib.import_module(value.__module__), name) is value


@pytest.mark.parametrize("name", TOOLS)
def test_each_name_of_ratchet_tools_is_defined(name: str) -> None:
    assert getattr(tools, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Engine'"):
        _ = ratchet.Engine


def _type_checking_imports() -> dict[str, str]:
    """The names `ratchet/__init__.py` imports for type checkers, and where from."""
    tree = ast.parse(Path(ratchet.__file__).read_text())
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ratchet"):
            for alias in node.names:
                assert alias.asname == alias.name, f"{alias.name}: re-export it `as` itself"
                found[alias.name] = node.module
    return found


def test_what_type_checkers_see_is_what_loads() -> None:
    assert _type_checking_imports() == ratchet._MODULE_OF


def test_importing_ratchet_loads_nothing_it_exports() -> None:
    # The `ratchet` command's quick reads import the package first: it must stay light.
    probe = (
        "import sys, ratchet\n"
        "heavy = {'pydantic', 'typer', 'rich', 'ratchet.client', 'ratchet.tools'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- what users are shown imports only the faces ------------------------------------------------

_PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _imports_of(source: str) -> list[str]:
    modules: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.append(node.module)
        elif isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
    return [m for m in modules if m == "ratchet" or m.startswith("ratchet.")]


def _shown_to_users() -> list[tuple[str, str]]:
    shown = [
        (str(path.relative_to(ROOT)), path.read_text())
        for path in sorted((ROOT / "examples").rglob("*.py"))
    ]
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.name == "architecture.md":
            continue  # the maintainers' map of the internals
        for number, block in enumerate(_PYTHON_BLOCK.findall(page.read_text()), start=1):
            shown.append((f"{page.relative_to(ROOT)} (python block {number})", block))
    return shown


def test_users_are_shown_some_code() -> None:
    names = [where for where, _ in _shown_to_users()]
    assert any(n.startswith("examples/") for n in names)
    assert any(n.startswith("README.md") for n in names)


@pytest.mark.parametrize(("where", "source"), _shown_to_users(), ids=lambda v: str(v)[:60])
def test_the_example_readme_and_docs_import_only_the_faces(where: str, source: str) -> None:
    deeper = [m for m in _imports_of(source) if m not in FACES]
    assert deeper == [], f"{where} imports {deeper}: import from `ratchet` or `ratchet.tools`"
