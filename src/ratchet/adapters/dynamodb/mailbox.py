"""The events sent to runs on AWS: the twin of `ratchet.adapters.sqlite.mailbox`, kept in the
run's partition of the checkpoints table, outside the checkpoint store's range (`CP#...` to
`HEAD`), which never reads them.

Items (partition key `run_id`, sort key `sk`):

- `MAIL#<event id>`: one per event id, so "accepted once" is the condition of the put that
  creates it (`attribute_not_exists`), whoever races. `status` is `pending`, `consumed` or
  `refused`: what the conditions test and the filters select, so a pending event is told from
  the others without reading its record. `seq` is its place in the run's order of arrival,
  `name` its name, `record` the `SentEvent` as JSON (without `consumed_step` and `refused`,
  which are attributes of their own, set when it stops being pending), and `expires_at` (the
  table's TTL attribute) is set only then.
- `MAILBOX`: the run's counter, `seq`: how many events the run has accepted in all.

Order of arrival is the per-run sequence, not `received_at`: that is the sending function's
clock, and two functions' clocks differ by more than the microseconds between two events (a
time can repeat, too). The sequence is the order in which the mailbox accepted them: a post's
transaction takes the next number and puts the event, conditional on the counter being where
the post read it, so no two events share a number, and `of_run` sorts by it (a Query returns
the items by event id).

The same condition puts a run's posts in one line, which is what makes `MAX_MAILBOX_EVENTS`
exact under any number of senders: the pending count a post reads (of its event's room: its
name's own, or the one the names it was not given as reserved share) can only fall before its
transaction lands (a commit consumes an event, a wait refuses one), never rise. The count is
read only once the run has accepted that many events in all (fewer cannot fill it), so a post
is one read and one transaction, and a sender's retry of a known id is found by the put's
condition. A post that lost its place to another post reads again and tries again.

Consuming is the checkpoint store's commit (`consumption`, in its transaction): the event's
update is conditional on it being pending, so it is consumed once, by the step whose wait it
settles, or the commit does not land.

Retention: a pending event has no TTL: it waits, like its run's head, for a wait of its name
(there are at most `MAX_MAILBOX_EVENTS` of them in each room). A consumed event expires with
the checkpoint that consumed it, a refused one `retention_days` after the refusal.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.items import (
    DEFAULT_RETENTION_DAYS,
    TTL_ATTRIBUTE,
    cancellation_reasons,
    check_size,
    epoch_seconds,
    error_code,
    number_attribute,
    text_attribute,
    translated_errors,
)
from ratchet.errors import StoreBusy
from ratchet.ports import Consumption
from ratchet.sealing import PayloadCodec
from ratchet.state import utcnow
from ratchet.stored import open_record_text, sealed_record_text
from ratchet.waits import MAX_MAILBOX_EVENTS, SentEvent, mailbox_full

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef, TransactWriteItemTypeDef

    from ratchet.adapters.dynamodb.items import Item

MAIL_PREFIX = "MAIL#"
MAILBOX_SK = "MAILBOX"
"""The run's counter; it does not begin with `MAIL#`, so no event Query reads it."""

MAX_POST_TRIES = 50
"""Posts a sender makes before it gives up (`StoreBusy`) when others keep taking the run's next
place first; each round lets at least one of them in."""
RACE_PAUSE_SECONDS = 0.005
"""The most a post waits, per try so far, before it tries again after losing a race."""

_RACES = frozenset({"ConditionalCheckFailed", "TransactionConflict", "None", None})
"""The reasons a post's transaction is cancelled when another post or commit got there first."""

_RECORD = "#record, #seq, #status, #consumed_step, #refused"
_NAMES = {
    "#record": "record",
    "#seq": "seq",
    "#status": "status",
    "#consumed_step": "consumed_step",
    "#refused": "refused",
}


class MailStatus(StrEnum):
    PENDING = "pending"
    CONSUMED = "consumed"
    REFUSED = "refused"


def mail_sk(event_id: str) -> str:
    return f"{MAIL_PREFIX}{event_id}"


def mail_key(run_id: str, event_id: str) -> Item:
    return {"run_id": text_attribute(run_id), "sk": text_attribute(mail_sk(event_id))}


def consumption(
    table: str, run_id: str, consumes: Consumption, *, expires_at: datetime
) -> TransactWriteItemTypeDef:
    """The update a commit's transaction makes to consume an event: marked consumed by the
    step, expiring at `expires_at` (the consuming checkpoint's), and only if it is pending: a
    consumed, refused or unknown event cancels the whole transaction."""
    return {
        "Update": {
            "TableName": table,
            "Key": mail_key(run_id, consumes.event_id),
            "UpdateExpression": "SET #status = :consumed, #consumed_step = :step, "
            "#expires_at = :expires_at",
            "ConditionExpression": "#status = :pending",
            "ExpressionAttributeNames": {
                "#status": "status",
                "#consumed_step": "consumed_step",
                "#expires_at": TTL_ATTRIBUTE,
            },
            "ExpressionAttributeValues": {
                ":consumed": text_attribute(MailStatus.CONSUMED.value),
                ":pending": text_attribute(MailStatus.PENDING.value),
                ":step": number_attribute(consumes.step),
                ":expires_at": number_attribute(epoch_seconds(expires_at)),
            },
        }
    }


class DynamoMailbox:
    """`Mailbox` on DynamoDB (see `ratchet.ports.Mailbox` for the contract it honours; the
    module's docstring for the items). Reads are strongly consistent. A DynamoDB failure its
    methods do not answer themselves is raised under Ratchet's name (`StoreBusy`,
    `StoreUnavailable`), as the store's are."""

    def __init__(
        self,
        client: DynamoDBClient,
        table: str,
        *,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        codec: PayloadCodec | None = None,
    ) -> None:
        self._client = client
        self._table = table
        self._retention = timedelta(days=retention_days)
        self._codec = codec  # seals each event's record: its payload, who sent it

    @translated_errors
    def post(self, event: SentEvent, *, reserved: Collection[str] = ()) -> tuple[SentEvent, bool]:
        run_id = event.run_id
        for tries in range(MAX_POST_TRIES):
            accepted = self._accepted(run_id)
            if accepted >= MAX_MAILBOX_EVENTS:
                pending = self._pending(run_id, event.name, reserved)
                if pending >= MAX_MAILBOX_EVENTS:
                    known = self.get(run_id, event.event_id)
                    if known is not None:
                        return known, False  # a sender's retry: answered even when full
                    raise mailbox_full(run_id, event.name, pending, reserved=reserved)
            item = self._item(event, seq=accepted + 1)
            check_size(f"run {run_id} event {event.event_id}", item)
            try:
                self._client.transact_write_items(
                    TransactItems=[
                        {"Update": self._next_place(run_id, accepted)},
                        {
                            "Put": {
                                "TableName": self._table,
                                "Item": item,
                                "ConditionExpression": "attribute_not_exists(sk)",
                            }
                        },
                    ]
                )
                return event, True
            except ClientError as error:
                reasons = {r.get("Code") for r in cancellation_reasons(error)}
                if not reasons or not reasons <= _RACES:
                    raise
            # The event is there (a concurrent retry of it put it first), or another event
            # took the place this post read: which one decides.
            known = self.get(run_id, event.event_id)
            if known is not None:
                return known, False
            time.sleep(random.uniform(0, RACE_PAUSE_SECONDS * (tries + 1)))
        raise StoreBusy(
            f"the store is busy: {MAX_POST_TRIES} posts to run {run_id!r} went in before this "
            f"one (DynamoDB table {self._table}); try again"
        )

    @translated_errors
    def get(self, run_id: str, event_id: str) -> SentEvent | None:
        found = self._client.get_item(
            TableName=self._table,
            Key=mail_key(run_id, event_id),
            ConsistentRead=True,
            ProjectionExpression=_RECORD,
            ExpressionAttributeNames=_NAMES,
        ).get("Item")
        return _event(found, self._codec) if found else None

    @translated_errors
    def of_run(self, run_id: str) -> list[SentEvent]:
        return [_event(item, self._codec) for item in self._events(run_id)]

    @translated_errors
    def next_for(self, run_id: str, name: str) -> SentEvent | None:
        pending = self._events(
            run_id,
            only="#status = :pending AND #name = :name",
            names={"#name": "name"},
            values={
                ":pending": text_attribute(MailStatus.PENDING.value),
                ":name": text_attribute(name),
            },
        )
        return _event(pending[0], self._codec) if pending else None

    @translated_errors
    def refuse(self, run_id: str, event_id: str, reason: str) -> None:
        refusal = {"refused": text_attribute(reason)}
        check_size(f"run {run_id} event {event_id} refusal", refusal)
        try:
            self._client.update_item(
                TableName=self._table,
                Key=mail_key(run_id, event_id),
                UpdateExpression="SET #status = :refused, #refused = :reason, "
                "#expires_at = :expires_at",
                ConditionExpression="#status = :pending",
                ExpressionAttributeNames={
                    "#status": "status",
                    "#refused": "refused",
                    "#expires_at": TTL_ATTRIBUTE,
                },
                ExpressionAttributeValues={
                    ":refused": text_attribute(MailStatus.REFUSED.value),
                    ":pending": text_attribute(MailStatus.PENDING.value),
                    ":reason": refusal["refused"],
                    ":expires_at": number_attribute(epoch_seconds(utcnow() + self._retention)),
                },
            )
        except ClientError as error:
            # Consumed, refused already, or unknown: as the SQLite mailbox, nothing changes.
            if error_code(error) != "ConditionalCheckFailedException":
                raise

    # --- reads -----------------------------------------------------------------------------

    def _accepted(self, run_id: str) -> int:
        found = self._client.get_item(
            TableName=self._table,
            Key=self._counter_key(run_id),
            ConsistentRead=True,
            ProjectionExpression="#seq",
            ExpressionAttributeNames={"#seq": "seq"},
        ).get("Item")
        return int(found["seq"]["N"]) if found else 0

    def _pending(self, run_id: str, name: str, reserved: Collection[str]) -> int:
        """How many of the run's events are pending in the room of `name` (`Mailbox.post`): a
        count (it reads, and is billed for, every event item of the run still stored; only a
        post past `MAX_MAILBOX_EVENTS` accepted events asks)."""
        room, names, values = _room(name, reserved)
        pages = self._client.get_paginator("query").paginate(
            TableName=self._table,
            KeyConditionExpression="#run_id = :run_id AND begins_with(#sk, :prefix)",
            FilterExpression=" AND ".join(["#status = :pending", *room]),
            ExpressionAttributeNames={
                "#run_id": "run_id",
                "#sk": "sk",
                "#status": "status",
                **names,
            },
            ExpressionAttributeValues={
                ":run_id": text_attribute(run_id),
                ":prefix": text_attribute(MAIL_PREFIX),
                ":pending": text_attribute(MailStatus.PENDING.value),
                **values,
            },
            Select="COUNT",
            ConsistentRead=True,
        )
        return sum(page.get("Count", 0) for page in pages)

    def _events(
        self,
        run_id: str,
        *,
        only: str | None = None,
        names: dict[str, str] | None = None,
        values: Item | None = None,
    ) -> list[dict[str, AttributeValueTypeDef]]:
        """The run's event items (those matching `only`), in order of arrival."""
        query: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#run_id = :run_id AND begins_with(#sk, :prefix)",
            "ProjectionExpression": _RECORD,
            "ExpressionAttributeNames": {
                "#run_id": "run_id",
                "#sk": "sk",
                **_NAMES,
                **(names or {}),
            },
            "ExpressionAttributeValues": {
                ":run_id": text_attribute(run_id),
                ":prefix": text_attribute(MAIL_PREFIX),
                **(values or {}),
            },
            "ConsistentRead": True,
        }
        if only is not None:
            query["FilterExpression"] = only
        pages = self._client.get_paginator("query").paginate(**query)
        items = [item for page in pages for item in page.get("Items", [])]
        return sorted(items, key=lambda item: int(item["seq"]["N"]))

    # --- items -----------------------------------------------------------------------------

    @staticmethod
    def _counter_key(run_id: str) -> Item:
        return {"run_id": text_attribute(run_id), "sk": text_attribute(MAILBOX_SK)}

    def _next_place(self, run_id: str, accepted: int) -> Any:
        """The counter moved from `accepted` to the next place, only if it is still there."""
        if accepted == 0:
            condition, values = "attribute_not_exists(#seq)", {}
        else:
            condition, values = "#seq = :seq", {":seq": number_attribute(accepted)}
        return {
            "TableName": self._table,
            "Key": self._counter_key(run_id),
            "UpdateExpression": "SET #seq = :next",
            "ConditionExpression": condition,
            "ExpressionAttributeNames": {"#seq": "seq"},
            "ExpressionAttributeValues": {":next": number_attribute(accepted + 1), **values},
        }

    def _item(self, event: SentEvent, *, seq: int) -> Item:
        return {
            **mail_key(event.run_id, event.event_id),
            "seq": number_attribute(seq),
            "name": text_attribute(event.name),
            "status": text_attribute(MailStatus.PENDING.value),
            "record": text_attribute(
                sealed_record_text(
                    event.model_dump_json(exclude={"consumed_step", "refused"}),
                    self._codec,
                    part="mail",
                    run_id=event.run_id,
                )
            ),
        }


def _room(name: str, reserved: Collection[str]) -> tuple[list[str], dict[str, str], Item]:
    """The filter's conditions (with their names and values) that select the events of the
    room of `name`: its own if `reserved` holds it, else the one every other name shares."""
    if name in reserved:
        return ["#name = :name"], {"#name": "name"}, {":name": text_attribute(name)}
    others = sorted(reserved)
    if not others:
        return [], {}, {}
    placeholders = [f":r{n}" for n in range(len(others))]
    # IN takes at most 100 operands: a clause per hundred names.
    clauses = [
        f"NOT (#name IN ({', '.join(placeholders[start : start + 100])}))"
        for start in range(0, len(placeholders), 100)
    ]
    values = {p: text_attribute(other) for p, other in zip(placeholders, others, strict=True)}
    return clauses, {"#name": "name"}, values


def _event(item: dict[str, AttributeValueTypeDef], codec: PayloadCodec | None) -> SentEvent:
    consumed = item.get("consumed_step")
    refused = item.get("refused")
    opened = open_record_text(item["record"]["S"], codec, part="mail")
    return SentEvent.model_validate_json(opened).model_copy(
        update={
            "consumed_step": int(consumed["N"]) if consumed else None,
            "refused": refused["S"] if refused else None,
        }
    )
