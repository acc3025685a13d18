"""What a user's CDK app may import: `ratchet.cdk` and its three names (docs/cdk-construct.md).

Pinned here as tests/unit/test_public_face.py pins `ratchet` and `ratchet.tools`: adding a name,
a prop or an attribute is a decision (add it below too), and dropping or renaming one breaks
the apps that use it. The library itself never loads the CDK, which only the [cdk] extra
installs."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import subprocess
import sys

import pytest
from aws_cdk import Stack
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn

import ratchet.cdk
from ratchet.cdk import RatchetAgents
from ratchet.cdk.config import PROPS, DeployConfig, context_key
from tests.infra.synth import REPO_ROOT, Synthesized

CDK = ["RatchetAgents", "RatchetStack", "add_checks"]
SIGNATURES = {
    "RatchetAgents": (
        "(self, scope: 'Construct', construct_id: 'str', *, project: 'str | Path | None' = "
        "None, asl_path: 'Path | None' = None, **props: 'Any') -> 'None'"
    ),
    "RatchetStack": (
        "(self, scope: 'Construct', construct_id: 'str', *, project: 'str | Path | None' = "
        "None, asl_path: 'Path | None' = None, **kwargs: 'Any') -> 'None'"
    ),
    "add_checks": "(app: 'IConstruct') -> 'None'",
}
PINNED_PROPS = [
    "agents",
    "anthropic_secret_arn",
    "approval_timeout_seconds",
    "bedrock_models",
    "checkpoint_retention_days",
    "email_sender",
    "event_bus_name",
    "kms_key_arn",
    "max_concurrent",
    "max_steps_per_invocation",
    "notify_emails",
    "notify_slack_channel",
    "payload_encryption",
    "prices",
    "project",
    "public_url",
    "queue_retry_seconds",
    "requests_per_minute",
    "rollover_after",
    "ses_identity_arn",
    "slack_bot_token_secret_arn",
    "slack_signing_secret_arn",
]
ATTRIBUTES: dict[str, type] = {
    "api": apigateway.RestApi,
    "checkpoints_table": dynamodb.Table,
    "idempotency_table": dynamodb.Table,
    "app_table": dynamodb.Table,
    "blob_bucket": s3.Bucket,
    "state_machine": sfn.StateMachine,
    "kms_key": type(None),  # a key with `kms_key_arn` only (tests/infra/test_kms.py)
    "functions": dict,
    "roles": dict,
    "store_url": str,
    "runs_url": str,
}
GUIDE = REPO_ROOT / "docs" / "cdk-construct.md"


def test_ratchet_cdk_exports_exactly_its_pinned_names() -> None:
    assert ratchet.cdk.__all__ == CDK
    assert sorted(ratchet.cdk._MODULE_OF) == CDK


@pytest.mark.parametrize("name", CDK)
def test_each_name_loads_from_its_module_with_its_pinned_signature(name: str) -> None:
    value = getattr(ratchet.cdk, name)

    assert getattr(importlib.import_module(ratchet.cdk._MODULE_OF[name]), name) is value
    # A construct's class is jsii's: its own signature is its __init__'s.
    callable_ = vars(value)["__init__"] if isinstance(value, type) else value
    assert str(inspect.signature(callable_)) == SIGNATURES[name]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Functions'"):
        _ = ratchet.cdk.Functions


def test_the_props_are_the_settings_and_each_is_documented_with_its_context_key() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    deploy = (REPO_ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")

    assert list(PROPS) == PINNED_PROPS
    assert sorted(f.name for f in dataclasses.fields(DeployConfig)) == PINNED_PROPS
    for name in PROPS:
        assert f"`{context_key(name)}`" in deploy, f"docs/deploy.md lacks {context_key(name)}"
        assert f"`{name}`" in guide, f"{GUIDE.name} lacks the prop {name}"


def test_the_construct_exposes_what_a_user_wires_further(synthesized: Synthesized) -> None:
    agents = synthesized.stack.agents

    assert set(RatchetAgents.__annotations__) == set(ATTRIBUTES)
    for name, kind in ATTRIBUTES.items():
        assert isinstance(getattr(agents, name), kind), name
        assert f"`{name}`" in GUIDE.read_text(encoding="utf-8"), f"{GUIDE.name} lacks {name}"
    assert set(agents.functions) == set(agents.roles)
    assert all(isinstance(f, lambda_.Function) for f in agents.functions.values())
    assert all(isinstance(r, iam.Role) for r in agents.roles.values())
    stack = Stack.of(agents)
    outputs = synthesized.template.to_json()["Outputs"]
    assert outputs["StoreUrl"]["Value"] == stack.resolve(agents.store_url)
    assert outputs["RunsUrl"]["Value"] == stack.resolve(agents.runs_url)


def _probe(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_library_and_the_projects_checks_load_no_cdk() -> None:
    # `ratchet.cdk.project` reads a [tool.ratchet] table; the CLI and the runtime may use it
    # where the [cdk] extra is not installed.
    loaded = _probe(
        "import sys\n"
        "import ratchet, ratchet.tools, ratchet.client, ratchet.runtime, ratchet.handlers.step\n"
        "import ratchet.cdk, ratchet.cdk.project\n"
        "print(sorted({'aws_cdk', 'constructs', 'cdk_nag', 'jsii'} & set(sys.modules)))\n"
    )
    assert loaded == "[]"


def test_without_the_cdk_extra_the_construct_says_what_to_install() -> None:
    said = _probe(
        "import sys\n"
        "class NoCdk:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'aws_cdk':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoCdk())\n"
        "try:\n"
        "    from ratchet.cdk import RatchetAgents\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error)\n"
    )
    assert said == (
        "ratchet.cdk needs the AWS CDK, which the [cdk] extra brings: "
        "pip install 'ratchet-agents[cdk]'"
    )


def test_the_guide_shows_the_app_the_tests_synthesize() -> None:
    from tests.infra.synth import USER_APP

    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    shown = [b for b in blocks if "app.synth()" in b]
    assert shown, f"{GUIDE.name} shows no app"
    # The tests' app gives one prop more.
    wanted = USER_APP.replace(", rollover_after=50", "")
    assert any(_code_lines(b) == _code_lines(wanted) for b in shown)


def _code_lines(source: str) -> list[str]:
    return [
        line.split("  #")[0].rstrip()
        for line in source.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_the_repositorys_app_is_a_thin_user_of_the_construct() -> None:
    app = (REPO_ROOT / "cdk" / "app.py").read_text(encoding="utf-8")
    assert "from ratchet.cdk import RatchetStack, add_checks" in app
    assert sorted(p.name for p in (REPO_ROOT / "cdk").glob("*.py")) == ["__init__.py", "app.py"]
