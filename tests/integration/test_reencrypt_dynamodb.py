"""`ratchet migrate --reencrypt` on a `dynamodb://` store (issue 37), on moto: a stack's items
and blobs written in clear and under key A, rotated to key B and rewritten, so that A can be
removed with every run still readable; an item a writer changed between the Scan and the write
keeps what the writer wrote; a second run rewrites nothing."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import boto3
import pytest
from typer.testing import CliRunner

from ratchet.adapters.dynamodb import reencrypt as reencryption
from ratchet.adapters.dynamodb.data import DynamoDbRunData
from ratchet.adapters.dynamodb.reencrypt import SEALED_ATTRIBUTES, StackStorage, reencrypt
from ratchet.adapters.payload_keys import KeyringCodec, KmsCodec, new_keyring_line
from ratchet.adapters.s3_blobs import PREFIX
from ratchet.cli.app import app as cli_app
from ratchet.client import Client
from ratchet.errors import PayloadKeyMissing
from ratchet.runtime.aws import AwsRuntime
from ratchet.sealing import PayloadCodec, header_of, is_sealed
from ratchet.state import utcnow
from ratchet.stored import sealed_key_id
from ratchet.waits import Approval, SentEvent
from tests.dynamodb_support import REGION, SETTINGS, moto_tables, scan
from tests.integration.test_sealed_payloads import CARD, SECRET, _state, _work
from tests.support import LOG

BUCKET = "ratchet-reencrypt-blobs"
STORE = (
    f"dynamodb://{SETTINGS.checkpoints_table}?ledger={SETTINGS.idempotency_table}"
    f"&app={SETTINGS.app_table}&region={REGION}"
)
RUNS = ("clear-1", "a-1", "b-1")
"""Written in clear, under key A, and under key B after the rotation."""
KINDS = {"runs", "run_static", "checkpoints", "idempotency", "approvals", "mailbox", "run_data"}
"""Every kind of sealed text `_write_run` writes, named as `--json` counts them."""
TABLES = {
    "checkpoints": SETTINGS.checkpoints_table,
    "idempotency": SETTINGS.idempotency_table,
    "app": SETTINGS.app_table,
}


@pytest.fixture
def aws() -> Iterator[tuple[Any, Any]]:
    with moto_tables() as dynamodb:
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        yield dynamodb, s3


def _ring(path: Path, *lines: str) -> str:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="ascii")
    path.chmod(0o600)
    return f"file:{path}"


def _runtime(dynamodb: Any, s3: Any, codec: PayloadCodec | None) -> AwsRuntime:
    settings = SETTINGS.model_copy(update={"blob_bucket": BUCKET})
    return AwsRuntime(settings, dynamodb, s3=s3, codec=codec)


def _write_run(runtime: AwsRuntime, run_id: str) -> None:
    """A run to its end (heads, static part, records, ledger entries, a blob), with an event in
    its mailbox, an approval request and a value of its data: every kind of sealed text."""
    assert runtime.engine(worker_id="w1", logger=LOG).start(_state(run_id))
    _work(runtime, run_id)
    now = utcnow()
    runtime.mailbox().post(
        SentEvent(run_id=run_id, event_id="e1", name="ci", received_at=now, payload=SECRET)
    )
    runtime.approvals().open(
        Approval(
            approval_id=f"approval-{run_id}-0000",
            run_id=run_id,
            step=1,
            created_at=now,
            expires_at=now + timedelta(days=1),
            prompt=f"may I export {SECRET}?",
        )
    )
    _data(runtime, run_id).put("customer", SECRET)


def _data(runtime: AwsRuntime, run_id: str) -> DynamoDbRunData:
    """The run's data as its context gives it (`AwsRuntime.context`)."""
    return DynamoDbRunData(runtime.dynamodb, SETTINGS.app_table, run_id, codec=runtime._codec)


def _texts_by_key(dynamodb: Any) -> dict[str | None, int]:
    """How many sealed attributes of the stack's items each key seals (None: in clear)."""
    found: dict[str | None, int] = {}
    for attribute in SEALED_ATTRIBUTES:
        for item in scan(dynamodb, TABLES[attribute.role]):
            text = item.get(attribute.attribute, {}).get("S")
            if text is not None and attribute.holds(item):
                key_id = sealed_key_id(text)
                found[key_id] = found.get(key_id, 0) + 1
    return found


def _blob_keys(s3: Any) -> list[str | None]:
    keys: list[str | None] = []
    for listed in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX).get("Contents", []):
        data = s3.get_object(Bucket=BUCKET, Key=listed["Key"])["Body"].read()
        keys.append(header_of(data)[0] if is_sealed(data) else None)
    return keys


def _ratchet(*args: str, key: str) -> Any:
    return CliRunner().invoke(cli_app, ["--store", STORE, *args], env={"RATCHET_PAYLOAD_KEY": key})


def _reads_whole(runtime: AwsRuntime, run_id: str) -> None:
    client = Client(runtime)
    head = client.head(run_id)
    assert head.summary == f"exported the orders of {SECRET}"
    assert any(CARD in (c.result or "") for c in client.history(run_id))
    (blob,) = [r.blob for r in head.tool_results if r.blob is not None]
    assert f"order 199 for {SECRET}".encode() in runtime.blobs.get(blob)
    assert runtime.mailbox().get(run_id, "e1").payload == SECRET  # type: ignore[union-attr]
    (approval,) = runtime.approvals().of_run(run_id)
    assert SECRET in approval.prompt
    assert _data(runtime, run_id).get("customer") == SECRET


def test_a_stack_written_in_clear_and_under_key_a_is_rewritten_under_b_and_a_can_go(
    aws, tmp_path: Path
):
    dynamodb, s3 = aws
    key_a, key_b = new_keyring_line(), new_keyring_line()
    ring = tmp_path / "payload-keys"
    # Given a run written in clear, one under key A, and one under B after the rotation
    _write_run(_runtime(dynamodb, s3, None), "clear-1")
    _ring(ring, key_a)
    codec_a = KeyringCodec(ring, create=False)
    _write_run(_runtime(dynamodb, s3, codec_a), "a-1")
    both = _ring(ring, key_b, key_a)
    codec_b = KeyringCodec(ring, create=False)
    _write_run(_runtime(dynamodb, s3, codec_b), "b-1")
    before = _texts_by_key(dynamodb)
    assert set(before) == {None, codec_a.key_id, codec_b.key_id}

    # When A is removed before the store is rewritten: one line naming A
    only_b = _ring(tmp_path / "only-b", key_b)
    refused = _ratchet("status", "a-1", key=only_b)
    assert isinstance(refused.exception, PayloadKeyMissing)
    assert refused.exception.key_id == codec_a.key_id
    assert codec_a.key_id in str(refused.exception)
    assert "\n" not in str(refused.exception)

    # When a dry run counts what a run would rewrite: every kind of sealed text, nothing written
    dry = _ratchet("migrate", "--reencrypt", "--dry-run", "--json", "--bucket", BUCKET, key=both)
    counted = json.loads(dry.output)
    print(f"\ndry run: {counted}")
    assert set(counted["resealed"]) == set(counted["sealed"]) == KINDS
    assert (counted["blobs_resealed"], counted["blobs_sealed"]) == (1, 1)
    assert _texts_by_key(dynamodb) == before

    # When the store is rewritten with both keys (B first)
    done = _ratchet("migrate", "--reencrypt", "--bucket", BUCKET, key=both)
    print(f"\nbefore: {before}\n{done.output}")
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0].startswith("rewrote ")
    assert lines[0].endswith(f"under key {codec_b.key_id}")
    assert _texts_by_key(dynamodb) == {codec_b.key_id: sum(before.values())}
    assert set(_blob_keys(s3)) == {codec_b.key_id}
    assert len(_blob_keys(s3)) == 3

    # Then, A removed, the client and the commands read every run
    reader = _runtime(dynamodb, s3, KeyringCodec(tmp_path / "only-b", create=False))
    for run_id in RUNS:
        _reads_whole(reader, run_id)
        status = _ratchet("status", run_id, key=only_b)
        history = _ratchet("history", run_id, key=only_b)
        assert (status.exit_code, history.exit_code) == (0, 0), status.output + history.output
        assert SECRET in history.output

    # and a second run rewrites nothing
    again = _ratchet("migrate", "--reencrypt", "--json", "--bucket", BUCKET, key=only_b)
    report = json.loads(again.output)
    print(f"second run: {report}")
    assert again.exit_code == 0
    assert (report["records"], report["blobs"], report["current"]) == (0, 0, sum(before.values()))
    assert report["blobs_current"] == 3


class _WriterBetween:
    """The stack's DynamoDB client, through which a writer changes `run_id`'s run data value
    right after the first Scan page of the app table is read: between the reencryption's read
    and its write of that item."""

    def __init__(self, client: Any, write: Any) -> None:
        self._client = client
        self._write = write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def scan(self, **request: Any) -> Any:
        page = self._client.scan(**request)
        if request["TableName"] == SETTINGS.app_table and self._write is not None:
            write, self._write = self._write, None
            write()
        return page


def test_an_item_a_writer_changed_after_the_scan_keeps_what_the_writer_wrote(
    aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    dynamodb, s3 = aws
    key_a, key_b = new_keyring_line(), new_keyring_line()
    ring = tmp_path / "payload-keys"
    _ring(ring, key_a)
    _write_run(_runtime(dynamodb, s3, KeyringCodec(ring, create=False)), "a-1")
    both = _ring(ring, key_b, key_a)
    codec_b = KeyringCodec(ring, create=False)

    # Given a writer that puts a new value in the run's data, under B, after the Scan read it
    def writer() -> None:
        data = DynamoDbRunData(dynamodb, SETTINGS.app_table, "a-1", codec=codec_b)
        data.put("customer", "written meanwhile")

    def interleaved(client: Any, *rest: Any) -> StackStorage:
        return StackStorage(cast("Any", _WriterBetween(client, writer)), *rest)

    monkeypatch.setattr(reencryption, "StackStorage", interleaved)

    # When the store is rewritten
    done = _ratchet("migrate", "--reencrypt", "--bucket", BUCKET, key=both)
    print(f"\n{done.output}")

    # Then the write conditional on the value read is refused and counted (exit 1), and the
    # item holds what the writer wrote
    assert done.exit_code == 1
    assert "  1 record changed while it ran: run it again to finish" in done.output
    data = DynamoDbRunData(dynamodb, SETTINGS.app_table, "a-1", codec=codec_b)
    assert data.get("customer") == "written meanwhile"
    # and every other text is under B, so a second run rewrites nothing
    monkeypatch.undo()
    again = reencrypt(StackStorage(dynamodb, TABLES, s3, BUCKET), codec_b)
    print(f"second run: {again.to_json()}")
    assert (again.records, again.moved, again.blobs) == (0, 0, 0)
    assert set(_texts_by_key(dynamodb)) == {codec_b.key_id}


def test_with_kms_keys_the_newest_is_the_named_key_and_the_old_one_can_be_disabled(aws):
    dynamodb, s3 = aws
    kms = boto3.client("kms", region_name=REGION)
    key_a = kms.create_key()["KeyMetadata"]["Arn"]
    key_b = kms.create_key()["KeyMetadata"]["Arn"]
    # Given a run sealed under KMS key A, and one under B by another process (its own data key)
    _write_run(_runtime(dynamodb, s3, KmsCodec(kms, key_a)), "a-1")
    _write_run(_runtime(dynamodb, s3, KmsCodec(kms, key_b)), "b-1")

    # When the store is rewritten with B named
    done = _ratchet("migrate", "--reencrypt", "--json", "--bucket", BUCKET, key=f"kms:{key_b}")
    report = json.loads(done.output)
    print(f"\n{report}")

    # Then A's texts and blob are rewritten, and B's, under another data key of B, are already
    # under the newest key
    assert done.exit_code == 0, done.output
    assert report["key_id"] == key_b
    assert (report["records"], report["current"]) == (12, 12)
    assert (report["blobs_resealed"], report["blobs_current"]) == (1, 1)
    assert set(_texts_by_key(dynamodb)) == {key_b}
    # and every run reads without KMS being asked to decrypt anything with A: A may be disabled
    # (moto's KMS decrypts with a disabled key, so what the reads ask of it is counted instead)
    asked: list[str] = []
    reader_kms = boto3.client("kms", region_name=REGION)
    reader_kms.meta.events.register(
        "provide-client-params.kms.Decrypt", lambda params, **_: asked.append(params["KeyId"])
    )
    reader = _runtime(dynamodb, s3, KmsCodec(reader_kms, key_b))
    for run_id in ("a-1", "b-1"):
        _reads_whole(reader, run_id)
    print(f"Decrypt calls of the reads, by key: {Counter(asked)}")
    assert set(asked) == {key_b}
