"""The deployment's own KMS key (`ratchet:kmsKeyArn`): every store of the stack encrypted with it,
and each role given exactly the uses of it that its calls make AWS's services ask for.

Without the setting nothing here is built and the stores keep their AWS managed or AWS owned
keys. docs/security.md says what each store uses and why each role holds what it holds.

Each role's statements name the key's ARN and the service that calls KMS on its behalf
(`kms:ViaService`): the key cannot be used directly by any function, only through DynamoDB,
S3, Step Functions or Secrets Manager (only CDK's grant for the status-events function's
stream names none). S3, Step Functions and Secrets Manager also pass an
encryption context that names the bucket, the state machine or the secret, so those grants
hold for this stack's only. CloudWatch Logs uses the key as its own service principal, which
a created key's policy lets in; docs/security.md says what an imported key's must allow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import ArnFormat, RemovalPolicy, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from ratchet.cdk import contract
from ratchet.cdk.config import CREATE_KMS_KEY

TABLE_KEY_ACTIONS = ("kms:Decrypt",)
"""What a principal reading or writing a table needs: DynamoDB keeps each table's data key
encrypted under the KMS key and decrypts it, as the caller, when its cache of it (five minutes)
has expired; a write encrypts items with that table key, asking KMS for nothing new. Stream
records are encrypted with the same table key."""

BLOB_READ_ACTIONS = ("kms:Decrypt",)
BLOB_WRITE_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey")
"""S3 asks KMS, as the caller, for a data key to write an object (`GenerateDataKey`) and to
decrypt one to read it. With a bucket key S3 does so for the bucket key, which it caches, not
for every object. Writers also read (a blob is checked before it is stored again)."""

EXECUTION_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey")
"""Step Functions encrypts what a caller hands an execution (StartExecution's input,
SendTaskSuccess's output) with a data key it asks KMS for as that caller, and decrypts a data
key it reuses (up to five minutes by default) and the execution's data for StopExecution."""

SECRET_ACTIONS = ("kms:Decrypt",)
"""Reading a secret's value: Secrets Manager decrypts its data key as the caller. The stack
makes the secrets' values itself (CloudFormation, as the deployer), so no function encrypts."""

PAYLOAD_READ_ACTIONS = ("kms:Decrypt",)
PAYLOAD_WRITE_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey")
"""The payload codec (`ratchet:payloadEncryption`) calls KMS itself, not through a service: a
function that seals a record asks for a data key (`GenerateDataKey`, reused for five minutes);
every function opens records sealed under other data keys (`Decrypt`, each kept once opened)."""

LOGS_KEY_ACTIONS = (
    "kms:Encrypt*",
    "kms:Decrypt*",
    "kms:ReEncrypt*",
    "kms:GenerateDataKey*",
    "kms:Describe*",
)
"""What CloudWatch Logs' regional service principal needs on a key that encrypts log groups (as
the CloudWatch Logs user guide's key policy gives it), for this account's log groups only."""


@dataclass(frozen=True)
class StoreKey:
    """The key, and how a role is granted its uses of it through one service."""

    key: kms.IKey

    @classmethod
    def of(cls, scope: Construct, setting: str) -> StoreKey:
        """The key that `setting` (`create`, or a key's ARN, checked by `DeployConfig`) names."""
        stack = Stack.of(scope)
        if setting != CREATE_KMS_KEY:
            region = setting.split(":")[3]
            if not Token.is_unresolved(stack.region) and region != stack.region:
                raise ValueError(
                    f"the KMS key {setting} is in {region}, the stack in {stack.region}: "
                    "DynamoDB, S3 and Step Functions use a key of their own region only"
                )
            return cls(kms.Key.from_key_arn(scope, "StoreKey", setting))
        key = kms.Key(
            scope,
            "StoreKey",
            description=f"Ratchet ({stack.stack_name}): encrypts the runs' tables, blobs, "
            "executions, logs and secrets",
            enable_key_rotation=True,
            # Like the tables and the bucket: what it encrypts outlives the stack, and would be
            # unreadable without it.
            removal_policy=RemovalPolicy.RETAIN,
        )
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
                actions=list(LOGS_KEY_ACTIONS),
                resources=["*"],
                conditions={
                    "ArnLike": {
                        "kms:EncryptionContext:aws:logs:arn": stack.format_arn(
                            service="logs",
                            resource="log-group",
                            resource_name="*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    }
                },
            )
        )
        return cls(key)

    def grant_tables(self, grantee: iam.IGrantable) -> None:
        self._grant(grantee, TABLE_KEY_ACTIONS, "dynamodb")

    def grant_blobs(self, grantee: iam.IGrantable, bucket_arn: str, *, writes: bool) -> None:
        # With a bucket key, S3's encryption context is the bucket's ARN: this bucket only.
        self._grant(
            grantee,
            BLOB_WRITE_ACTIONS if writes else BLOB_READ_ACTIONS,
            "s3",
            {"kms:EncryptionContext:aws:s3:arn": bucket_arn},
        )

    def grant_executions(self, grantee: iam.IGrantable, state_machine_arn: str) -> None:
        self._grant(
            grantee,
            EXECUTION_ACTIONS,
            "states",
            {"kms:EncryptionContext:aws:states:stateMachineArn": state_machine_arn},
        )

    def grant_secret(self, grantee: iam.IGrantable, secret_arn: str) -> None:
        # Secrets Manager's encryption context names the secret: this one only.
        self._grant(
            grantee,
            SECRET_ACTIONS,
            "secretsmanager",
            {"kms:EncryptionContext:SecretARN": secret_arn},
        )

    def grant_payloads(self, grantee: iam.IGrantable, *, writes: bool) -> None:
        # Called directly, so no service to name: the codec's encryption context instead,
        # without which KMS gives none of these data keys (nor any other use of the key).
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(PAYLOAD_WRITE_ACTIONS if writes else PAYLOAD_READ_ACTIONS),
            resource_arns=[self.key.key_arn],
            conditions={
                "StringEquals": {
                    f"kms:EncryptionContext:{name}": value
                    for name, value in contract.PAYLOAD_ENCRYPTION_CONTEXT.items()
                }
            },
        )

    def _grant(
        self,
        grantee: iam.IGrantable,
        actions: Sequence[str],
        service: str,
        context: dict[str, str] | None = None,
    ) -> None:
        region = Stack.of(self.key).region
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(actions),
            resource_arns=[self.key.key_arn],
            conditions={
                "StringEquals": {
                    "kms:ViaService": f"{service}.{region}.amazonaws.com",
                    **(context or {}),
                }
            },
        )
