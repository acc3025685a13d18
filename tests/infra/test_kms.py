"""The deployment's own KMS key (`ratchet:kmsKeyArn`, docs/security.md): every store of the stack
names it, each role holds exactly the uses of it its calls need, cdk-nag and cfn-lint stay
clean, and a malformed setting is refused in one line naming it. Without the setting the
template is the one the fingerprints hold (tests/infra/test_template_equivalence.py).

With payloads sealed too (`ratchet:payloadEncryption`), the same holds, each function's role
also holding the codec's uses of the key (tests/infra/test_payload_encryption.py holds the
rest of that setting)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from aws_cdk import App, Environment
from aws_cdk import aws_kms as kms
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import lint  # type: ignore[import-untyped]
from cfnlint.config import ManualArgs  # type: ignore[import-untyped]

from ratchet.cdk import RatchetStack
from ratchet.cdk.config import DeployConfig
from tests.infra.queries import HANDLERS, as_list, function_names
from tests.infra.synth import (
    ASL,
    CONFIGURED,
    EXAMPLE_PROJECT,
    Synthesized,
    synthesize,
    template_only_context,
)
from tests.infra.test_lint import IGNORED_CFN_LINT

KEY_ARN = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
CONTEXT_KEY = "ratchet:kmsKeyArn"
SEALING_KEY = "ratchet:payloadEncryption"


@pytest.fixture(scope="module")
def imported() -> Synthesized:
    """Every optional setting, and a key of the deployer's own, by its ARN."""
    return synthesize(context={**CONFIGURED, CONTEXT_KEY: KEY_ARN})


@pytest.fixture(scope="module")
def created() -> Synthesized:
    """The billing example's project, and a key the stack makes."""
    return synthesize(context={"ratchet:project": str(EXAMPLE_PROJECT), CONTEXT_KEY: "create"})


@pytest.fixture(scope="module")
def sealed_imported() -> Synthesized:
    """`imported`, with payloads sealed."""
    return synthesize(context={**CONFIGURED, CONTEXT_KEY: KEY_ARN, SEALING_KEY: "true"})


@pytest.fixture(scope="module")
def sealed_created() -> Synthesized:
    """`created`, with payloads sealed."""
    return synthesize(
        context={"ratchet:project": str(EXAMPLE_PROJECT), CONTEXT_KEY: "create", SEALING_KEY: True}
    )


@pytest.fixture(params=["imported", "created", "sealed_imported", "sealed_created"])
def variant(request: pytest.FixtureRequest) -> tuple[Synthesized, Any, bool]:
    """A template with the key, how its resources name that key, and whether it seals
    payloads."""
    synth: Synthesized = request.getfixturevalue(request.param)
    if request.param.endswith("imported"):
        key: Any = KEY_ARN
    else:
        (key_id,) = synth.of_type("AWS::KMS::Key")
        key = {"Fn::GetAtt": [key_id, "Arn"]}
    # What the checks below hold, they hold of a template that uses the key.
    (machine,) = synth.of_type("AWS::StepFunctions::StateMachine").values()
    assert machine["Properties"].get("EncryptionConfiguration", {}).get("KmsKeyId") == key
    return synth, key, request.param.startswith("sealed")


def _properties(synth: Synthesized, resource_type: str) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in synth.of_type(resource_type).items()}


def test_every_store_names_the_key(variant: tuple[Synthesized, Any, bool]) -> None:
    synth, key, _ = variant

    tables = _properties(synth, "AWS::DynamoDB::Table")
    buckets = _properties(synth, "AWS::S3::Bucket")
    machines = _properties(synth, "AWS::StepFunctions::StateMachine")
    log_groups = _properties(synth, "AWS::Logs::LogGroup")
    secrets = _properties(synth, "AWS::SecretsManager::Secret")
    print(
        f"\n{len(tables)} tables, {len(buckets)} buckets, {len(machines)} state machine, "
        f"{len(log_groups)} log groups, {len(secrets)} secrets"
    )

    assert len(tables) == 3
    for props in tables.values():
        assert props["SSESpecification"] == {
            "KMSMasterKeyId": key,
            "SSEEnabled": True,
            "SSEType": "KMS",
        }
    by_key = {
        logical_id: props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        for logical_id, props in buckets.items()
    }
    (access_logs,) = [i for i in buckets if "LoggingConfiguration" not in buckets[i]]
    # The one exception: S3 delivers server access logs only to an SSE-S3 bucket. It holds who
    # read or wrote which blob, never a blob.
    assert by_key.pop(access_logs) == [
        {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
    ]
    assert len(by_key) == 1
    for encryption in by_key.values():
        assert encryption == [
            {
                "BucketKeyEnabled": True,
                "ServerSideEncryptionByDefault": {"KMSMasterKeyID": key, "SSEAlgorithm": "aws:kms"},
            }
        ]
    assert len(machines) == 1
    for props in machines.values():
        assert props["EncryptionConfiguration"] == {
            "KmsDataKeyReusePeriodSeconds": 300,
            "KmsKeyId": key,
            "Type": "CUSTOMER_MANAGED_KMS_KEY",
        }
    # One per function, the state machine's, the API's access and execution logs.
    assert len(log_groups) == len(function_names(synth)) + 3
    assert {logical_id: p.get("KmsKeyId") for logical_id, p in log_groups.items()} == dict.fromkeys(
        log_groups, key
    )
    assert len(secrets) == 2  # the approval link key and the webhook key
    assert {logical_id: p.get("KmsKeyId") for logical_id, p in secrets.items()} == dict.fromkeys(
        secrets, key
    )


def test_without_the_setting_no_store_names_a_key_of_its_own(synthesized: Synthesized) -> None:
    assert synthesized.of_type("AWS::KMS::Key") == {}
    assert "KmsKeyId" not in json.dumps(synthesized.template.to_json())
    for props in _properties(synthesized, "AWS::DynamoDB::Table").values():
        assert props["SSESpecification"] == {"SSEEnabled": True}  # the AWS managed key


def test_the_created_key_rotates_outlives_the_stack_and_lets_only_logs_in(
    created: Synthesized,
) -> None:
    (key,) = created.of_type("AWS::KMS::Key").values()
    assert isinstance(created.stack.agents.kms_key, kms.Key)  # for what the user adds

    assert key["Properties"]["EnableKeyRotation"] is True
    # Retained like the tables and the bucket, whose data would be unreadable without it.
    assert (key["DeletionPolicy"], key["UpdateReplacePolicy"]) == ("Retain", "Retain")
    for table in created.of_type("AWS::DynamoDB::Table").values():
        assert table["DeletionPolicy"] == "Retain"
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    principals = [json.dumps(s["Principal"], sort_keys=True) for s in statements]
    print(f"\nkey policy: {len(statements)} statements")
    # The account (so that IAM policies grant its uses at all), CloudWatch Logs in this region
    # (for this account's log groups), and log delivery (the machine's logs of encrypted
    # executions, added by CDK): no role is named in the key policy.
    assert len(statements) == 3
    assert ":root" in principals[0]
    logs = statements[1]
    assert "logs." in principals[1]
    assert sorted(logs["Action"]) == [
        "kms:Decrypt*",
        "kms:Describe*",
        "kms:Encrypt*",
        "kms:GenerateDataKey*",
        "kms:ReEncrypt*",
    ]
    context = logs["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
    assert json.dumps(context).endswith(':log-group:*"]]}')
    assert statements[2]["Principal"] == {"Service": "delivery.logs.amazonaws.com"}
    assert statements[2]["Action"] == "kms:Decrypt*"


TABLE = ("kms:Decrypt",)
"""DynamoDB decrypts the table's key as the caller when its cache of it expires; writes use it."""
BLOB_READ = ("kms:Decrypt",)
BLOB_WRITE = ("kms:Decrypt", "kms:GenerateDataKey")
"""S3 asks for a (bucket) data key to write and decrypts it to read."""
EXECUTIONS = ("kms:Decrypt", "kms:GenerateDataKey")
"""Step Functions encrypts what the caller hands an execution, and decrypts a reused data key."""
SECRET = ("kms:Decrypt",)

EXPECTED: dict[str, dict[str, tuple[str, ...]]] = {
    # Every function reads or writes a table. The step also stores and reads blobs, starts
    # child runs and wakes a parent.
    "step": {"dynamodb": TABLE, "s3": BLOB_WRITE, "states": EXECUTIONS},
    # Reads the head, stores a token: tables only; it builds links (the link key).
    "notify": {"dynamodb": TABLE, "secretsmanager:LinkKey": SECRET},
    "decide": {"dynamodb": TABLE},
    # Wakes a parent whose last child failed.
    "mark_failed": {"dynamodb": TABLE, "states": EXECUTIONS},
    # Starts, stops and answers executions; builds links and opens hooks (both keys).
    "api": {
        "dynamodb": TABLE,
        "states": EXECUTIONS,
        "secretsmanager:LinkKey": SECRET,
        "secretsmanager:HookKey": SECRET,
    },
    "rollover": {"dynamodb": TABLE, "states": EXECUTIONS},
    # Answers the parked execution; checks links.
    "approvals": {"dynamodb": TABLE, "states": EXECUTIONS, "secretsmanager:LinkKey": SECRET},
    # Reads a large event payload's blob; answers its own task.
    "open_wait": {"dynamodb": TABLE, "s3": BLOB_READ, "states": EXECUTIONS},
    "record_wait": {"dynamodb": TABLE},
    # Stores a large delivery's payload; wakes the execution; derives hook secrets.
    "hooks": {
        "dynamodb": TABLE,
        "s3": BLOB_WRITE,
        "states": EXECUTIONS,
        "secretsmanager:HookKey": SECRET,
    },
    "schedule": {"dynamodb": TABLE, "states": EXECUTIONS},
    # Reads a blob it delivers; answers, restarts and stops executions.
    "sweep": {"dynamodb": TABLE, "s3": BLOB_READ, "states": EXECUTIONS},
    # Its queries, and CDK's grant for the stream its event source mapping reads (the
    # records are encrypted with the table's key; CDK names no service there).
    "status_events": {"dynamodb": TABLE, "stream": ("kms:Decrypt", "kms:DescribeKey")},
    # CDK's, for the machine's own role: the executions' data (by the machine's encryption
    # context) and the log delivery of its logs.
    "state_machine": {"states-role": EXECUTIONS, "logs-delivery": ("kms:GenerateDataKey",)},
}
"""Each role's KMS statements, by the service that calls KMS for it, and their actions."""

PAYLOAD_WRITE = ("kms:Decrypt", "kms:GenerateDataKey")
"""A function that seals what it stores asks KMS for data keys, and opens what others sealed."""
PAYLOAD_READ = ("kms:Decrypt",)
SEALS_NOTHING = {"status_events", "rollover"}
"""They read the runs' records (the record of a status change, the head to continue from) and
write none."""


def _expected(role: str, *, sealed: bool) -> dict[str, tuple[str, ...]]:
    """`EXPECTED`, and with payloads sealed the codec's own statement ("payload") on every
    function's role: the codec calls KMS itself, not through a service."""
    expected = dict(EXPECTED[role])
    if sealed and role != "state_machine":
        expected["payload"] = PAYLOAD_READ if role in SEALS_NOTHING else PAYLOAD_WRITE
    return expected


def _roles(synth: Synthesized) -> dict[str, str]:
    """Role logical id -> the function whose role it is (or `state_machine`)."""
    by_handler = {handler: name for name, handler in HANDLERS.items()}
    roles = {
        resource["Properties"]["Role"]["Fn::GetAtt"][0]: by_handler[
            resource["Properties"]["Handler"]
        ]
        for resource in synth.of_type("AWS::Lambda::Function").values()
    }
    for machine in synth.of_type("AWS::StepFunctions::StateMachine").values():
        roles[machine["Properties"]["RoleArn"]["Fn::GetAtt"][0]] = "state_machine"
    return roles


def _kms_statements(synth: Synthesized) -> Iterator[tuple[str, dict[str, Any]]]:
    roles = _roles(synth)
    for policy in synth.of_type("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if any(action.startswith("kms:") for action in as_list(statement["Action"])):
                (role,) = policy["Properties"]["Roles"]
                yield roles[role["Ref"]], statement


def _service(synth: Synthesized, statement: dict[str, Any]) -> str:
    """Which service a statement lets use the key, from its conditions."""
    conditions = statement.get("Condition", {}).get("StringEquals", {})
    via = conditions.get("kms:ViaService")
    if via is None and "kms:EncryptionContext:ratchet" in conditions:
        # The payload codec's data keys, and nothing else: KMS gives them only with the
        # codec's encryption context (`KmsCodec.ENCRYPTION_CONTEXT`).
        assert conditions == {"kms:EncryptionContext:ratchet": "payload"}, statement
        return "payload"
    if via is None:
        if "kms:EncryptionContext:aws:states:stateMachineArn" in conditions:
            return "states-role"
        if "kms:EncryptionContext:SourceArn" in conditions:
            return "logs-delivery"
        assert "Condition" not in statement, statement
        return "stream"
    service: str = via["Fn::Join"][1][0].removesuffix(".")
    assert via["Fn::Join"][1][1:] == [{"Ref": "AWS::Region"}, ".amazonaws.com"]
    if service == "secretsmanager":
        secret = conditions["kms:EncryptionContext:SecretARN"]["Ref"]
        names = [
            n
            for n in ("LinkKey", "HookKey")
            if secret.startswith(("Approvals" + n, "Webhooks" + n))
        ]
        return f"secretsmanager:{names[0]}"
    return service


def _context_is_this_stacks(synth: Synthesized, service: str, statement: dict[str, Any]) -> None:
    """S3's and Step Functions' grants hold for this bucket and this machine only."""
    if service not in ("s3", "states", "states-role"):
        return
    conditions = statement["Condition"]["StringEquals"]
    if service == "s3":
        (blobs,) = [i for i in synth.of_type("AWS::S3::Bucket") if i.startswith("StorageBlobs")]
        assert conditions["kms:EncryptionContext:aws:s3:arn"] == {"Fn::GetAtt": [blobs, "Arn"]}
    if service in ("states", "states-role"):
        machine = conditions["kms:EncryptionContext:aws:states:stateMachineArn"]
        assert machine["Fn::Join"][1][-1] == ":stateMachine:Ratchet-agent-run"


def test_each_role_holds_exactly_the_uses_of_the_key_it_needs(
    variant: tuple[Synthesized, Any, bool],
) -> None:
    synth, key, sealed = variant
    held: dict[str, dict[str, tuple[str, ...]]] = {}
    listed = []

    for role, statement in _kms_statements(synth):
        actions = tuple(sorted(as_list(statement["Action"])))
        service = _service(synth, statement)
        listed.append(f"{role:>14} {service:<24} {' '.join(actions)}")
        assert statement["Effect"] == "Allow"
        # The key alone: no `*`, no other key, no wildcard action.
        assert as_list(statement["Resource"]) == [key], statement
        assert all("*" not in action for action in actions), statement
        _context_is_this_stacks(synth, service, statement)
        assert service not in held.setdefault(role, {}), f"{role}: two {service} statements"
        held[role][service] = actions

    print("\n" + "\n".join(sorted(listed)) + f"\n{len(listed)} statements")
    present = {*function_names(synth), "state_machine"}
    assert held == {role: _expected(role, sealed=sealed) for role in sorted(present)}


def test_cdk_nag_finds_nothing_open(variant: tuple[Synthesized, Any, bool]) -> None:
    synth, _, _ = variant

    report = AwsSolutionsChecks().validate_scope(synth.stack)

    assert [v.rule_name for v in report.violations] == []


def test_the_template_passes_cfn_lint(variant: tuple[Synthesized, Any, bool]) -> None:
    synth, _, _ = variant
    template = json.dumps(synth.template.to_json())
    config = ManualArgs(ignore_checks=IGNORED_CFN_LINT, regions=["us-east-1", "eu-west-1"])

    assert [str(match) for match in lint(template, config=config)] == []


@pytest.mark.parametrize(
    "value",
    [
        "alias/ratchet",
        "arn:aws:kms:eu-west-1:123456789012:alias/ratchet",
        "1234abcd-12ab-34cd-56ef-1234567890ab",
        "arn:aws:kms:eu-west-1:123456789012:key/1234abcd",
        "arn:aws:secretsmanager:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "yes",
        42,
        ["create"],
    ],
)
def test_a_malformed_key_is_refused_in_one_line_naming_the_context_key(value: Any) -> None:
    with pytest.raises(ValueError, match="must be a KMS key's ARN") as refused:
        DeployConfig.from_context(App(context={CONTEXT_KEY: value}))

    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"context {CONTEXT_KEY} must be a KMS key's ARN")


def test_the_prop_wins_over_the_context_key_and_a_bad_prop_is_named_as_a_prop() -> None:
    app = App(context={CONTEXT_KEY: KEY_ARN})

    assert DeployConfig.from_context(app, {"kms_key_arn": "create"}).kms_key_arn == "create"
    assert DeployConfig.from_context(app).kms_key_arn == KEY_ARN
    # Spaces around a pasted ARN are forgiven, as for the other settings.
    assert DeployConfig.from_context(app, {"kms_key_arn": f" {KEY_ARN} "}).kms_key_arn == KEY_ARN
    with pytest.raises(ValueError, match=r"^RatchetAgents kms_key_arn must be a KMS key's ARN"):
        DeployConfig.from_context(app, {"kms_key_arn": "alias/ratchet"})


def test_a_key_of_another_region_than_the_stacks_is_refused() -> None:
    app = App(context=template_only_context(**{CONTEXT_KEY: KEY_ARN}))

    with pytest.raises(ValueError, match="is in eu-west-1, the stack in us-east-1") as refused:
        RatchetStack(
            app,
            "Ratchet",
            asl_path=ASL,
            env=Environment(account="123456789012", region="us-east-1"),
        )
    assert "\n" not in str(refused.value)
