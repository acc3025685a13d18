"""Payloads sealed on the deployed stack (`ratchet:payloadEncryption`, docs/security.md): every
function is given `RATCHET_PAYLOAD_KEY=kms:<the stack's key>` and its code the codec's
packages; the setting needs the deployment's own key and is refused in one line otherwise;
without it no function seals. Which uses of the key each role holds, and cdk-nag and cfn-lint
with the setting on, are held by tests/infra/test_kms.py; the functions' settings by
tests/infra/test_functions.py; a run through the machine on moto by
tests/integration/aws/test_sealed_stack.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App

from ratchet.adapters.payload_keys import KmsCodec
from ratchet.cdk import contract
from ratchet.cdk.bundling import asset_hash, bundled_extras
from ratchet.cdk.config import DeployConfig
from ratchet.cdk.sources import RatchetCode
from ratchet.errors import InvalidInput
from ratchet.runtime.aws_settings import AwsSettings
from tests.infra.queries import environment, function_names
from tests.infra.synth import EXAMPLE_PROJECT, REPO_ROOT, Synthesized, synthesize

KEY_ARN = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
KEY = "ratchet:kmsKeyArn"
SEALING = "ratchet:payloadEncryption"


@pytest.fixture(scope="module")
def created_and_sealed() -> Synthesized:
    """The billing example's project, a key the stack makes, and payloads sealed: the setting
    as a boolean, as cdk.json holds it."""
    project = str(EXAMPLE_PROJECT)
    return synthesize(context={"ratchet:project": project, KEY: "create", SEALING: True})


@pytest.fixture(scope="module")
def key_only() -> Synthesized:
    """A key of the deployer's own, and payloads not sealed (`false`, as `cdk deploy -c` says)."""
    return synthesize(context={KEY: KEY_ARN, SEALING: "false"})


def test_every_function_seals_with_the_stacks_own_key(created_and_sealed: Synthesized) -> None:
    (key_id,) = created_and_sealed.of_type("AWS::KMS::Key")
    expected = {"Fn::Join": ["", ["kms:", {"Fn::GetAtt": [key_id, "Arn"]}]]}
    names = sorted(function_names(created_and_sealed))

    given = {n: environment(created_and_sealed, n).get(contract.PAYLOAD_KEY) for n in names}

    print(f"\n{len(names)} functions given {contract.PAYLOAD_KEY}: {', '.join(names)}")
    assert given == dict.fromkeys(names, expected)


def test_without_the_setting_no_function_seals(
    synthesized: Synthesized, configured: Synthesized, key_only: Synthesized
) -> None:
    for synth in (synthesized, configured, key_only):
        for name in function_names(synth):
            assert contract.PAYLOAD_KEY not in environment(synth, name), name
        template = json.dumps(synth.template.to_json())
        assert "kms:EncryptionContext:ratchet" not in template


def test_the_setting_needs_the_deployments_own_key() -> None:
    with pytest.raises(ValueError, match="needs") as refused:
        DeployConfig.from_context(App(context={SEALING: "true"}))

    assert str(refused.value) == (f"context {SEALING} needs {KEY} (a key's ARN, or 'create')")


@pytest.mark.parametrize("value", ["yes", "1", 1, "on", ["true"]])
def test_a_value_other_than_true_or_false_is_refused_in_one_line(value: Any) -> None:
    with pytest.raises(ValueError, match="must be true or false") as refused:
        DeployConfig.from_context(App(context={KEY: KEY_ARN, SEALING: value}))

    assert str(refused.value) == f"context {SEALING} must be true or false: {value!r}"


def test_the_prop_wins_over_the_context_key_and_is_named_as_a_prop() -> None:
    app = App(context={KEY: KEY_ARN, SEALING: "true"})

    assert DeployConfig.from_context(app).payload_encryption is True
    assert DeployConfig.from_context(app, {"payload_encryption": False}).payload_encryption is False
    spaced = App(context={SEALING: " TRUE ", KEY: "create"})
    assert DeployConfig.from_context(spaced).payload_encryption is True
    with pytest.raises(ValueError, match=r"^RatchetAgents payload_encryption needs kms_key_arn "):
        DeployConfig.from_context(App(), {"payload_encryption": True})


def test_the_grants_hold_for_the_codecs_encryption_context() -> None:
    # The codec asks KMS for every data key with this context; the functions' grants name it.
    assert contract.PAYLOAD_ENCRYPTION_CONTEXT == KmsCodec.ENCRYPTION_CONTEXT


def test_the_functions_read_the_payload_key_the_stack_gives_and_refuse_a_bad_one() -> None:
    tables = {
        "RATCHET_CHECKPOINTS_TABLE": "ckp",
        "RATCHET_IDEMPOTENCY_TABLE": "idm",
        "RATCHET_APP_TABLE": "app",
    }

    settings = AwsSettings.from_env({**tables, contract.PAYLOAD_KEY: f"kms:{KEY_ARN}"})
    assert settings.payload_key == f"kms:{KEY_ARN}"
    assert AwsSettings.from_env(tables).payload_key is None
    with pytest.raises(InvalidInput) as refused:
        AwsSettings.from_env({**tables, contract.PAYLOAD_KEY: "aws-kms"})
    assert str(refused.value) == (
        "RATCHET_PAYLOAD_KEY is not valid: 'aws-kms' is none of 'local', 'file:PATH' or "
        "'kms:<key ARN or alias>'"
    )


def test_a_sealing_bundle_holds_the_codecs_packages_and_others_are_as_before() -> None:
    code = RatchetCode.find()
    sealing, plain = bundled_extras(sealing=True), bundled_extras(sealing=False)

    assert asset_hash(code, sealing=False) == asset_hash(code)
    assert asset_hash(code, sealing=True) != asset_hash(code)
    # What the checkout's bundle installs: the lock's export for these extras (an installed
    # Ratchet's bundle pins the same extras from its metadata, `installed_pins`).
    assert _locked("cryptography", sealing)
    assert not _locked("cryptography", plain)


def _locked(package: str, extras: tuple[str, ...]) -> bool:
    uv = Path(REPO_ROOT / ".tools" / "bin" / "uv")
    exported = subprocess.run(
        [
            str(uv), "export", "--frozen", "--no-dev",
            *(arg for extra in extras for arg in ("--extra", extra)),
            "--no-emit-project", "--no-header", "--no-annotate", "--format", "requirements.txt",
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return any(line.startswith(f"{package}==") for line in exported.splitlines())
