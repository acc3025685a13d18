"""The state machine as the stack deploys it with the deployment's own KMS key
(`ratchet:kmsKeyArn`, docs/security.md): created with Step Functions' customer-managed
encryption configuration, and a run worked through it from start, over its approval, to its
end.

Moto keeps the configuration and describes it back, but encrypts nothing and checks no key
(it accepts a key that does not exist): this holds that the configuration the stack gives is
one Step Functions takes and that the definition runs under it, not what KMS allows. Which
role may use the key is held by tests/infra/test_kms.py."""

from __future__ import annotations

import boto3

from ratchet.adapters.stepfunctions import ApprovalAnswer
from ratchet.state import RunStatus
from tests.integration.aws.harness import REGION, Stack

ENCRYPTION = {"type": "CUSTOMER_MANAGED_KMS_KEY", "kmsDataKeyReusePeriodSeconds": 300}
"""What `sfn.CustomerManagedEncryptionConfiguration(key)` synthesizes (tests/infra/test_kms.py
holds the template to it), less the key."""


def test_a_run_goes_through_its_approval_to_its_end_on_the_encrypted_machine(stack: Stack):
    # Given the machine's definition, deployed with a key of the deployment's own
    key = boto3.client("kms", region_name=REGION).create_key(Description="ratchet")
    key_arn = key["KeyMetadata"]["Arn"]
    deployed = stack.sfn.describe_state_machine(stateMachineArn=stack.state_machine_arn)
    machine = stack.sfn.create_state_machine(
        name="ratchet-agent-run-encrypted",
        definition=deployed["definition"],
        roleArn=deployed["roleArn"],
        encryptionConfiguration={**ENCRYPTION, "kmsKeyId": key_arn},
    )["stateMachineArn"]
    encrypted = Stack(
        stack.sfn,
        stack.dynamodb,
        machine,
        stack.monkeypatch,
        stack.lambdas,
        stack.link_key,
        faults_os=stack.faults_os,
    )
    encrypted.configure(state_machine_arn=machine)
    described = stack.sfn.describe_state_machine(stateMachineArn=machine)
    assert described["encryptionConfiguration"] == {**ENCRYPTION, "kmsKeyId": key_arn}

    try:
        # When a run that asks a person is started through the API and approved
        status, started = encrypted.post_run({"scenario": "migration", "run_id": "kms-1"})
        assert (status, started["created"]) == (201, True)
        encrypted.parked("kms-1")
        stack.sfn.send_task_success(
            taskToken=encrypted.token("kms-1"),
            output=ApprovalAnswer(by="alice", comment="go").model_dump_json(),
        )

        # Then its execution, on the encrypted machine, ends with the run done
        assert encrypted.finished(started["execution_name"])["status"] == "SUCCEEDED"
    finally:
        # The harness stops what is left running on its own machine only: an execution left
        # parked here would wait past the test.
        running = [e["name"] for e in encrypted.executions() if e["status"] == "RUNNING"]
        if running:
            encrypted.stop(*running)
    assert [e["stateMachineArn"] for e in encrypted.executions()] == [machine]
    assert stack.executions() == []
    assert encrypted.head("kms-1").status is RunStatus.DONE
    encrypted.assert_settled("kms-1")
