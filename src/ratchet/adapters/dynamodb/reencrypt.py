"""`ratchet migrate --reencrypt` on a deployed stack's tables and bucket: every sealed attribute
of every item, and every blob, rewritten under the codec's newest key, and every one written in
clear before the codec was turned on sealed, as `ratchet.adapters.sqlite.reencrypt` does for a
local store (which decides each text and blob, and holds the report).

Each table is read with a paginated Scan of `PAGE_ITEMS` items. An item's texts that are not
under the newest key are sealed anew and written in one UpdateItem, conditional on each of them
still being the text the Scan read: a worker that rewrote one meanwhile (a commit's head, an
approval decided) wrote it under the newest key anyway, and keeps what it wrote; an item deleted
meanwhile (expired, collected) is not made again. So nothing is rewritten from a stale read, a
run killed part-way has written whole items, and a second run rewrites only what the first did
not reach.

What "the newest key" is: for a keyring (`file:PATH`), its first line; for KMS (`kms:...`), the
key `RATCHET_PAYLOAD_KEY` names, by the ARN KMS returns with its data keys. A KMS key's own
rotation changes its backing material and not its ARN, and KMS decrypts with the old material
for as long as the key lives: nothing needs rewriting for it. Rotating to another key is naming
it in `RATCHET_PAYLOAD_KEY` while the old one may still be used to decrypt (there is no keyring
of KMS keys: a sealed value names the key that wrapped its data key, and KMS is asked for that
one); after this has run, the old key may be disabled. A value under the newest key's ARN but an
older data key is already under it.

A blob is rewritten in place, under the same object key, as on disk: a blob sealed under an old
key keeps its keyed name, one written in clear keeps its SHA-256. Blobs are named by their
content, so no worker writes other bytes under a blob's name: there is no race to condition on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from ratchet.adapters.dynamodb.approvals import APPROVAL_PREFIX
from ratchet.adapters.dynamodb.data import DATA_PREFIX
from ratchet.adapters.dynamodb.items import TABLES, store_error
from ratchet.adapters.dynamodb.mailbox import MAIL_PREFIX
from ratchet.adapters.dynamodb.store import CHECKPOINT_PREFIX, HEAD_SK
from ratchet.adapters.s3_blobs import PREFIX as BLOB_PREFIX
from ratchet.adapters.sqlite.reencrypt import (
    SEALED_COLUMNS,
    Reencryption,
    SealedColumn,
    resealed_blob,
    resealed_text,
)
from ratchet.sealing import PayloadCodec

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    Item = dict[str, AttributeValueTypeDef]

PAGE_ITEMS = 100
"""Items one Scan page returns: each is rewritten before the next page is read."""


def _sort_key_begins(prefix: str) -> Callable[[Item], bool]:
    return lambda item: item.get("sk", {}).get("S", "").startswith(prefix)


def _head(item: Item) -> bool:
    # A head is sealed only beside its static part: one stored whole (schema 2 and earlier)
    # is read as it is, and `ratchet migrate` rewrites it in today's form, sealed.
    return item.get("sk", {}).get("S") == HEAD_SK and "static" in item


def _partition_begins(prefix: str) -> Callable[[Item], bool]:
    return lambda item: item.get("pk", {}).get("S", "").startswith(prefix)


def _always(item: Item) -> bool:
    return True


def _run_id(item: Item) -> str:
    return item.get("run_id", {}).get("S", "")


def _data_run_id(item: Item) -> str:
    return item["pk"]["S"].removeprefix(DATA_PREFIX)


@dataclass(frozen=True)
class SealedAttribute:
    """An attribute of sealed texts: in which of the stack's tables (its role in
    `ratchet.adapters.dynamodb.items.TABLES`), on which items, and the local store's column of
    the same texts, which says how each is counted (its table's name is the kind), bound, sealed
    and opened: a text is sealed alike in both stores."""

    role: str
    holds: Callable[[Item], bool]
    attribute: str
    column: SealedColumn
    run_id: Callable[[Item], str] = _run_id


def _local(table: str, column: str) -> SealedColumn:
    return next(c for c in SEALED_COLUMNS if (c.table, c.column) == (table, column))


SEALED_ATTRIBUTES = (
    SealedAttribute("checkpoints", _head, "state", _local("runs", "state")),
    SealedAttribute("checkpoints", _head, "static", _local("run_static", "state")),
    SealedAttribute(
        "checkpoints", _sort_key_begins(CHECKPOINT_PREFIX), "event", _local("checkpoints", "event")
    ),
    SealedAttribute(
        "checkpoints", _sort_key_begins(APPROVAL_PREFIX), "record", _local("approvals", "record")
    ),
    SealedAttribute(
        "checkpoints", _sort_key_begins(MAIL_PREFIX), "record", _local("mailbox", "record")
    ),
    SealedAttribute("idempotency", _always, "decision", _local("idempotency", "decision")),
    SealedAttribute("idempotency", _always, "args_hash", _local("idempotency", "args_hash")),
    # A value's part is `data:<its key>`, the item's sort key: the local column's part reads it
    # as the second of the row's keys, and an item's keys are (pk, sk).
    SealedAttribute(
        "app",
        _partition_begins(DATA_PREFIX),
        "value",
        _local("run_data", "value"),
        run_id=_data_run_id,
    ),
)
"""Every attribute a codec seals on the stack's tables (`ratchet.stored`, and the ledger's,
mailbox's, approval book's and run data's adapters); tests/integration/test_reencrypt_dynamodb.py
checks that a store sealed under an old key holds no text left under it after a run."""


@dataclass(frozen=True)
class StackStorage:
    """What a deployed stack stores runs in: its three tables, by role, and its blob bucket."""

    dynamodb: DynamoDBClient
    tables: dict[str, str]
    """Each table's name by its role (`checkpoints`, `idempotency`, `app`)."""
    s3: Any
    """A boto3 S3 client (the S3 stubs are not a dependency of this project)."""
    bucket: str


def reencrypt(storage: StackStorage, codec: PayloadCodec, *, dry_run: bool = False) -> Reencryption:
    """Rewrite every sealed attribute of the stack's items and every blob of its bucket under
    `codec`'s newest key, sealing those written in clear (see the module's docstring). A text
    under a key the codec cannot open stops it with `PayloadKeyMissing` naming that key: what
    was rewritten before stays rewritten, and a second run after the key is back finishes."""
    report = Reencryption(codec.key_id, dry_run)
    for role in ("checkpoints", "idempotency", "app"):
        attributes = [a for a in SEALED_ATTRIBUTES if a.role == role]
        for item in _scan(storage.dynamodb, storage.tables[role]):
            _reencrypt_item(storage, role, item, attributes, codec, report)
    _reencrypt_blobs(storage, codec, report)
    return report


def _scan_page(client: DynamoDBClient, table: str, start: Any) -> Any:
    request: dict[str, Any] = {"TableName": table, "Limit": PAGE_ITEMS, "ConsistentRead": True}
    if start:
        request["ExclusiveStartKey"] = start
    with _translated(table):
        return client.scan(**request)


def _scan(client: DynamoDBClient, table: str) -> Iterator[Item]:
    start: Any = None
    while True:
        page = _scan_page(client, table, start)
        yield from page.get("Items", [])
        start = page.get("LastEvaluatedKey")
        if not start:
            return


def _reencrypt_item(
    storage: StackStorage,
    role: str,
    item: Item,
    attributes: list[SealedAttribute],
    codec: PayloadCodec,
    report: Reencryption,
) -> None:
    key = _key(role, item)
    writes: list[tuple[SealedAttribute, str, str, dict[str, int]]] = []
    for attribute in attributes:
        text = item.get(attribute.attribute, {}).get("S")
        if text is None or not attribute.holds(item):
            continue
        key_values = tuple(value["S"] for value in key.values())
        run_id = attribute.run_id(item)
        rewrite = resealed_text(attribute.column, key_values, run_id, text, codec, report)
        if rewrite is not None:
            writes.append((attribute, text, *rewrite))
    if not writes:
        return
    names = {f"#a{n}": write[0].attribute for n, write in enumerate(writes)}
    values: dict[str, Any] = {}
    for n, (_, old, new, _) in enumerate(writes):
        values[f":old{n}"] = {"S": old}
        values[f":new{n}"] = {"S": new}
    if _written(storage, role, key, names, values):
        for attribute, _, _, counts in writes:
            kind = attribute.column.table
            counts[kind] = counts.get(kind, 0) + 1
    else:
        report.moved += len(writes)


def _written(
    storage: StackStorage, role: str, key: Item, names: dict[str, str], values: dict[str, Any]
) -> bool:
    client, table = storage.dynamodb, storage.tables[role]
    with _translated(table):
        try:
            client.update_item(
                TableName=table,
                Key=key,
                UpdateExpression="SET " + ", ".join(f"{name} = :new{name[2:]}" for name in names),
                # Conditional on every text read: a worker that rewrote one meanwhile (under
                # the newest key, as every write now is) keeps what it wrote, and an item
                # deleted meanwhile is not made again from the Scan's copy.
                ConditionExpression=" AND ".join(f"{name} = :old{name[2:]}" for name in names),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except client.exceptions.ConditionalCheckFailedException:
            return False
    return True


def _key(role: str, item: Item) -> Item:
    spec = TABLES[role]
    names = (spec.partition_key,) if spec.sort_key is None else (spec.partition_key, spec.sort_key)
    return {name: item[name] for name in names}


@contextmanager
def _translated(table: str) -> Iterator[None]:
    """DynamoDB's failures under Ratchet's names (`store_error`), as every adapter raises them;
    a refused condition is the caller's to catch, and passes as it is."""
    try:
        yield
    except (ClientError, BotocoreConnectionError, HTTPClientError, NoCredentialsError) as error:
        translated = store_error(error, table)
        if translated is error:
            raise
        raise translated from error


def _reencrypt_blobs(storage: StackStorage, codec: PayloadCodec, report: Reencryption) -> None:
    pages = storage.s3.get_paginator("list_objects_v2").paginate(
        Bucket=storage.bucket, Prefix=BLOB_PREFIX
    )
    for page in pages:
        for listed in page.get("Contents", []):
            object_key = listed["Key"]
            body = storage.s3.get_object(Bucket=storage.bucket, Key=object_key)["Body"].read()
            data = resealed_blob(object_key.removeprefix(BLOB_PREFIX), body, codec, report)
            if data is not None:
                storage.s3.put_object(
                    Bucket=storage.bucket,
                    Key=object_key,
                    Body=data,
                    ContentType="application/octet-stream",
                )
