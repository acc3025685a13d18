"""The deployed stack with payloads sealed (`ratchet:payloadEncryption`, docs/security.md): every
function given `RATCHET_PAYLOAD_KEY=kms:<the stack's key>`, as the stack gives it
(tests/infra/test_payload_encryption.py), and the state machine run on moto through a person's
approval to its end. A secret given as the run's input, returned by its tools (inline and in a
blob), asked about and typed in the person's comment is in no DynamoDB item and no S3 object,
while the client and `ratchet status` / `history` with the setting show it, and without it
refuse in one line naming the key.

Moto's KMS makes and decrypts real data keys; what the functions' roles may ask of it is held
by tests/infra/test_kms.py."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from bench.dynamodb_cost import ENGINE, DynamoDbBenchRun
from ratchet.cli.app import app as cli_app
from ratchet.errors import PayloadKeyMissing
from ratchet.handlers import _wiring
from ratchet.runtime import connect
from ratchet.state import RunStatus
from tests.integration.aws.harness import AGENTS, APP_TABLE, APPROVER, REGION, TABLES, Stack

SECRET = "Zanzibar-Quokka-7731"
CARD = "4111 1111 1111 1111"
COMMENT = f"fine, the auditor may see {SECRET}'s orders"
BUCKET = "ratchet-sealed-stack-blobs"
STORE = (
    f"dynamodb://{TABLES['checkpoints']}?ledger={TABLES['idempotency']}&app={APP_TABLE}"
    f"&region={REGION}"
)


def _objects(s3: Any) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def _ratchet(*args: str, key: str | None) -> Any:
    env = {"RATCHET_PAYLOAD_KEY": key} if key else {"RATCHET_PAYLOAD_KEY": ""}
    return CliRunner().invoke(cli_app, ["--store", STORE, *args], env=env)


def test_a_sealed_stack_runs_a_run_through_its_approval_and_stores_no_secret(stack: Stack):
    # Given the stack's functions sealing with a KMS key of the deployment, and its bucket
    key = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["Arn"]
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    registered = {**AGENTS, "sealed": "tests.integration.aws.agents:sealed"}
    stack.configure(payload_key=f"kms:{key}", blob_bucket=BUCKET, agents=json.dumps(registered))

    # When a run is started with the secret through the API, parks on its question, and a
    # person approves it from the emailed link with a comment that says it again
    status, started = stack.post_run(
        {"agent": "sealed", "run_id": "sealed-1", "input": {"customer": SECRET}}
    )
    assert (status, started["created"]) == (201, True)
    stack.parked("sealed-1")
    page = stack.open(stack.link("sealed-1"))
    assert SECRET in page.text  # the page shows the question it read
    answered = stack.submit(page.form_action, "approve", COMMENT)
    assert answered.status == 200

    # Then the execution ends and the run is done
    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"
    assert stack.head("sealed-1").status is RunStatus.DONE

    # and no item of any table, and no object of the bucket, holds the secret or the card
    items = stack.items()
    objects = _objects(s3)
    stored = {f"{table} items": json.dumps(found) for table, found in items.items()}
    stored |= {f"object {name}": data.decode("latin-1") for name, data in objects.items()}
    print(
        f"\n{sum(len(found) for found in items.values())} items, {len(objects)} objects, "
        f"{sum(len(text) for text in stored.values()):,} B read"
    )
    assert len(objects) == 1, "the export's output is a blob"
    assert any("APPROVAL#" in json.dumps(item) for item in items[TABLES["checkpoints"]])
    for where, data in stored.items():
        for text in (SECRET, CARD, "auditor"):
            assert text not in data, where

    # while the client with the setting shows every part of it
    client = connect(STORE, environ={"RATCHET_PAYLOAD_KEY": f"kms:{key}"})
    head = client.head("sealed-1")
    assert head.options.params == {"customer": SECRET}
    assert head.summary == f"exported the orders of {SECRET}"
    history = client.history("sealed-1")
    assert any(CARD in (c.result or "") for c in history)
    decided = [(c.by, c.comment) for c in history if c.event == "decided"]
    assert decided == [(APPROVER, COMMENT)]
    # (a store URL names no bucket: the blob as the functions read it back)
    (blob,) = [r.blob for r in head.tool_results if r.blob is not None]
    assert f"order 199 for {SECRET}".encode() in _wiring.runtime().blobs.get(blob)

    # and so do the commands
    shown = _ratchet("status", "sealed-1", "--json", key=f"kms:{key}")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["summary"] == f"exported the orders of {SECRET}"
    listed = _ratchet("history", "sealed-1", "--json", key=f"kms:{key}")
    assert listed.exit_code == 0, listed.output
    assert COMMENT in listed.stdout
    assert CARD in listed.stdout

    # and without the setting, a read is refused in one line naming the key
    with pytest.raises(PayloadKeyMissing) as refused:
        connect(STORE, environ={}).head("sealed-1")
    assert refused.value.key_id == key
    # (the command ends on that error, which the CLI's `main` says in one line)
    unsealed = _ratchet("status", "sealed-1", key=None)
    assert isinstance(unsealed.exception, PayloadKeyMissing)
    assert unsealed.exception.key_id == key
    assert SECRET not in unsealed.output


SEALED_STEPS = 20
MAX_SEALED_WRITE_UNITS = 16
"""What a sealed step of the scripted agent may cost in write units (10 in clear; 16 measured:
a sealed text is base64 in a JSON envelope, a third larger, with its key id and the data key
KMS wrapped, so the transaction's head and record each cross one more 1 KB unit, and the
ledger's entry, its arguments' hash sealed too, one more)."""


def test_a_sealed_step_sends_the_same_requests_and_the_run_asks_kms_for_one_data_key():
    # Given the scripted agent's run, stepped as the step function steps it, in clear and sealed
    with DynamoDbBenchRun(batches=SEALED_STEPS + 2, scripted=True) as plain:
        clear = plain.advance_to(SEALED_STEPS)
    with DynamoDbBenchRun(batches=SEALED_STEPS + 2, scripted=True, sealed=True) as run:
        sealed = run.advance_to(SEALED_STEPS)

    # Then each sealed step sends the requests a step in clear sends, within a bound of write
    # units, and the whole run (its start and its steps, in one process) seals with one data key
    pairs = list(zip(clear, sealed, strict=True))
    units = [(c.write_units(ENGINE), s.write_units(ENGINE)) for c, s in pairs]
    print(f"\nwrite units a step, clear | sealed: {units[0]} at step 1, {units[-1]} at step 20")
    print(f"KMS requests: {dict(run.kms_requests)}")
    for c, s in pairs:
        assert s.by_operation(ENGINE) == c.by_operation(ENGINE), s.step
        assert c.write_units(ENGINE) <= s.write_units(ENGINE) <= MAX_SEALED_WRITE_UNITS, s.step
    assert run.kms_requests == Counter({"GenerateDataKey": 1})
