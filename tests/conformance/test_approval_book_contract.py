"""The contract every ApprovalBook backend must honour (`ratchet.ports.ApprovalBook`).

One suite, parametrised over backends (`approval_book` below): SQLite locally, DynamoDB (on
moto) on AWS. Where the backends differ on purpose, the difference is a test of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb.approvals import AwsApprovals, approval_sk
from ratchet.adapters.dynamodb.items import TTL_ATTRIBUTE
from ratchet.adapters.payload_keys import KeyringCodec
from ratchet.adapters.postgres.approvals import PostgresApprovalBook
from ratchet.adapters.sqlite.approvals import SqliteApprovalBook
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.errors import ApprovalDecided, ApprovalError, ApprovalExpired
from ratchet.ports import ApprovalBook
from ratchet.waits import Approval, ApprovalStatus, RecentStep, Verdict
from tests.dynamodb_support import SETTINGS, moto_tables, scan
from tests.postgres_support import scratch_store

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)
TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAfake-task-token-of-the-parked-execution"


@dataclass
class ApprovalBackend:
    name: str
    book: ApprovalBook


@pytest.fixture(scope="module")
def dynamodb() -> Iterator[DynamoDBClient]:
    """One moto DynamoDB for the module (a client costs a fifth of a second to make); each
    test starts from an empty table."""
    with moto_tables() as client:
        yield client


def emptied(client: DynamoDBClient) -> DynamoDBClient:
    for item in scan(client, SETTINGS.checkpoints_table):
        client.delete_item(
            TableName=SETTINGS.checkpoints_table, Key={"run_id": item["run_id"], "sk": item["sk"]}
        )
    return client


@pytest.fixture(
    params=[
        "sqlite",
        "dynamodb",
        "postgres",
        "sqlite-sealed",
        "dynamodb-sealed",
        "postgres-sealed",
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[ApprovalBackend]:
    # "-sealed": with a payload codec (`RATCHET_PAYLOAD_KEY`), which seals each record.
    name, _, sealed = request.param.partition("-")
    codec = KeyringCodec(tmp_path / "payload-keys", create=True) if sealed else None
    if name == "sqlite":
        db = SqliteDatabase(tmp_path / "ratchet.db")
        yield ApprovalBackend("sqlite", SqliteApprovalBook(db, codec))
        db.close()
    elif name == "postgres":
        with scratch_store() as open_store:
            yield ApprovalBackend("postgres", PostgresApprovalBook(open_store(), codec))
    else:
        client = emptied(request.getfixturevalue("dynamodb"))
        yield ApprovalBackend(
            "dynamodb", AwsApprovals(client, SETTINGS.checkpoints_table, codec=codec)
        )


def approval(
    n: int = 1, *, run_id: str = "run-1", step: int = 3, created: datetime = T0
) -> Approval:
    return Approval(
        approval_id=f"approval-{n:04d}-{run_id}-{step}"[:64],
        run_id=run_id,
        step=step,
        created_at=created,
        expires_at=created + DAY,
    )


APPROVE = Verdict(approved=True, by="dana@example.com", comment="go ahead")
REJECT = Verdict(approved=False, by="lee@example.com", comment="not on a Friday")


# --- open, get, of_run -------------------------------------------------------------------------


def test_an_opened_approval_reads_back_as_it_was_opened(backend):
    opened = approval()

    assert backend.book.open(opened) == opened
    assert backend.book.get("run-1", opened.approval_id) == opened
    assert backend.book.of_run("run-1") == [opened]


def test_an_unknown_approval_is_none(backend):
    backend.book.open(approval())

    assert backend.book.get("run-1", "approval-9999-unknown") is None
    assert backend.book.of_run("run-unknown") == []


def test_an_approval_is_found_only_under_its_own_run(backend):
    mine = backend.book.open(approval(run_id="run-1"))

    assert backend.book.get("run-2", mine.approval_id) is None


def test_of_run_lists_the_runs_approvals_oldest_first_and_no_other_runs(backend):
    later = approval(1, step=5, created=T0 + timedelta(hours=2))
    earlier = approval(2, step=3, created=T0)
    other = approval(3, run_id="run-2", created=T0 + timedelta(hours=1))
    for a in (later, other, earlier):
        backend.book.open(a)

    assert backend.book.of_run("run-1") == [earlier, later]
    assert backend.book.of_run("run-2") == [other]


def test_open_is_idempotent_per_run_and_step_locally_and_not_on_aws(backend):
    # The documented difference: locally two workers (or `ratchet link` twice) may open a
    # request for the same parked step, and the second finds the first. On AWS every
    # `AwaitApproval` task has its own token, so each open is a request of its own; the
    # state machine, not the book, makes sure a step parks once.
    first = backend.book.open(approval(1))

    second = backend.book.open(approval(2))

    if backend.name != "dynamodb":  # workers' stores: SQLite, Postgres
        assert second == first
        assert backend.book.of_run("run-1") == [first]
    else:
        assert second == approval(2)
        assert backend.book.of_run("run-1") == [first, second]


def test_a_new_request_for_a_step_is_opened_once_the_last_one_was_decided(backend):
    first = backend.book.open(approval(1))
    backend.book.settle(first, REJECT, channel="link", at=T0)

    again = backend.book.open(approval(2, created=T0 + timedelta(minutes=1)))

    assert again == approval(2, created=T0 + timedelta(minutes=1))
    assert [a.status for a in backend.book.of_run("run-1")] == [
        ApprovalStatus.REJECTED,
        ApprovalStatus.PENDING,
    ]


# --- settle ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verdict", "status"), [(APPROVE, ApprovalStatus.APPROVED), (REJECT, ApprovalStatus.REJECTED)]
)
def test_settle_decides_a_pending_approval_and_records_who_when_how_and_why(
    backend, verdict, status
):
    opened = backend.book.open(approval())
    at = T0 + timedelta(hours=1)

    settled = backend.book.settle(opened, verdict, channel="link", at=at)

    assert settled.status is status
    assert (settled.decided_by, settled.comment) == (verdict.by, verdict.comment)
    assert (settled.decided_at, settled.channel) == (at, "link")
    assert settled.approval_id == opened.approval_id
    assert settled.expires_at == opened.expires_at
    assert backend.book.get("run-1", opened.approval_id) == settled


def test_a_decided_approval_still_holds_what_was_asked(backend):
    # The approval page shows the request once the run has moved on: from the record alone.
    asked = approval().model_copy(
        update={
            "prompt": "Refund A-1042?",
            "details": {"reason": "damaged in transit", "amount": {"eur": 120}},
            "tool": "refund",
            "arguments": {"order_id": "A-1042", "lines": [1, 2]},
        }
    )
    opened = backend.book.open(asked)

    settled = backend.book.settle(opened, APPROVE, channel="link", at=T0 + timedelta(hours=1))

    kept = backend.book.get("run-1", opened.approval_id)
    assert kept == settled
    assert kept is not None
    assert (kept.prompt, kept.details) == (asked.prompt, asked.details)
    assert (kept.tool, kept.arguments) == (asked.tool, asked.arguments)


def test_a_decided_or_closed_approval_still_holds_the_steps_its_page_showed(backend):
    # The page lists, once decided, the steps the person saw pending, from the record alone:
    # by then the run's window has moved on past them.
    recent = [
        RecentStep(step=1, tool="lookup", result="Order A-1042: 2 lines, 120 EUR"),
        RecentStep(step=2, tool="check_stock", result="Line 2 <damaged> & returned"),
    ]
    decided = backend.book.open(approval(1).model_copy(update={"recent": recent}))
    closed = backend.book.open(approval(2, step=4).model_copy(update={"recent": recent[:1]}))

    backend.book.settle(decided, APPROVE, channel="link", at=T0 + timedelta(hours=1))
    backend.book.close("run-1", 4, ApprovalStatus.EXPIRED, at=T0 + DAY)

    kept = {a.approval_id: a for a in backend.book.of_run("run-1")}
    assert kept[decided.approval_id].status is ApprovalStatus.APPROVED
    assert kept[decided.approval_id].recent == recent
    assert kept[closed.approval_id].status is ApprovalStatus.EXPIRED
    assert kept[closed.approval_id].recent == recent[:1]


def test_settle_decides_once_and_a_second_decision_changes_nothing(backend):
    # Two people (or a person and a replayed POST) both read the request while it was pending;
    # the first to write wins.
    opened = backend.book.open(approval())
    first = backend.book.settle(opened, APPROVE, channel="link", at=T0 + timedelta(hours=1))

    with pytest.raises(ApprovalDecided):
        backend.book.settle(opened, REJECT, channel="slack", at=T0 + timedelta(hours=2))
    with pytest.raises(ApprovalDecided):
        backend.book.settle(first, APPROVE, channel="link", at=T0 + timedelta(hours=3))

    assert backend.book.get("run-1", opened.approval_id) == first


def test_the_second_decision_is_told_who_decided_first(backend):
    opened = backend.book.open(approval())
    backend.book.settle(opened, APPROVE, channel="link", at=T0)

    with pytest.raises(ApprovalDecided, match=r"approved by dana@example\.com"):
        backend.book.settle(opened, REJECT, channel="slack", at=T0)


@pytest.mark.parametrize("late", [timedelta(0), timedelta(seconds=1), 30 * DAY])
def test_settle_refuses_an_expired_approval_and_changes_nothing(backend, late):
    opened = backend.book.open(approval())

    with pytest.raises(ApprovalExpired):
        backend.book.settle(opened, APPROVE, channel="link", at=opened.expires_at + late)

    assert backend.book.get("run-1", opened.approval_id) == opened


def test_settle_takes_a_decision_up_to_the_moment_before_expiry(backend):
    opened = backend.book.open(approval())
    at = opened.expires_at - timedelta(microseconds=1)

    assert backend.book.settle(opened, APPROVE, channel="api", at=at).status.is_decided


def test_settle_of_a_closed_approval_is_refused(backend):
    opened = backend.book.open(approval())
    backend.book.close("run-1", 3, ApprovalStatus.CLOSED, at=T0)

    with pytest.raises(ApprovalDecided):
        backend.book.settle(opened, APPROVE, channel="link", at=T0)

    assert backend.book.get("run-1", opened.approval_id).status is ApprovalStatus.CLOSED


def test_settle_of_an_approval_that_was_never_opened_stores_nothing(backend, request):
    never_opened = approval()

    with pytest.raises(ApprovalError):
        backend.book.settle(never_opened, APPROVE, channel="link", at=T0)

    assert backend.book.get("run-1", never_opened.approval_id) is None


# --- reopen ------------------------------------------------------------------------------------


def test_reopen_makes_a_settled_approval_pending_again_and_decidable(backend):
    opened = backend.book.open(approval())
    settled = backend.book.settle(opened, APPROVE, channel="link", at=T0)

    backend.book.reopen(settled)

    assert backend.book.get("run-1", opened.approval_id) == opened
    again = backend.book.settle(opened, REJECT, channel="slack", at=T0 + timedelta(hours=1))
    assert again.status is ApprovalStatus.REJECTED
    assert backend.book.get("run-1", opened.approval_id) == again


def test_reopen_undoes_only_the_decision_it_is_given(backend, request):
    # The desk reopens the decision it settled when the answer could not be delivered. If the
    # stored approval has moved on since (closed as expired by the timeout path, say), the
    # reopen must not bring it back to pending.
    opened = backend.book.open(approval())
    settled = backend.book.settle(opened, APPROVE, channel="link", at=T0)
    backend.book.reopen(settled)
    backend.book.close("run-1", 3, ApprovalStatus.EXPIRED, at=T0 + timedelta(hours=1))

    backend.book.reopen(settled)

    assert backend.book.get("run-1", opened.approval_id).status is ApprovalStatus.EXPIRED


# --- close -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [ApprovalStatus.CLOSED, ApprovalStatus.EXPIRED])
def test_close_marks_the_pending_approvals_of_the_step_and_nothing_else(backend, status):
    # Locally one pending approval per step exists (open is idempotent); on AWS there may
    # be several, and close marks each.
    pending = backend.book.open(approval(1))
    decided = backend.book.settle(
        backend.book.open(approval(2, step=2)), APPROVE, channel="link", at=T0
    )
    other_step = backend.book.open(approval(3, step=4))
    other_run = backend.book.open(approval(4, run_id="run-2"))
    at = T0 + timedelta(hours=5)

    backend.book.close("run-1", 3, status, at=at)

    closed = backend.book.get("run-1", pending.approval_id)
    assert closed is not None
    assert (closed.status, closed.decided_at) == (status, at)
    assert (closed.decided_by, closed.comment, closed.channel) == (None, "", None)
    assert backend.book.get("run-1", decided.approval_id) == decided
    assert backend.book.get("run-1", other_step.approval_id) == other_step
    assert backend.book.get("run-2", other_run.approval_id) == other_run


def test_close_leaves_a_decided_approval_of_the_step_as_it_was(backend):
    opened = backend.book.open(approval())
    settled = backend.book.settle(opened, REJECT, channel="slack", at=T0)

    backend.book.close("run-1", 3, ApprovalStatus.CLOSED, at=T0 + timedelta(hours=1))

    assert backend.book.get("run-1", opened.approval_id) == settled


def test_close_of_a_step_without_approvals_changes_nothing(backend):
    opened = backend.book.open(approval())

    backend.book.close("run-1", 99, ApprovalStatus.CLOSED, at=T0)
    backend.book.close("run-unknown", 3, ApprovalStatus.CLOSED, at=T0)

    assert backend.book.of_run("run-1") == [opened]


# --- AWS: the task token beside the approval ---------------------------------------------------


@pytest.fixture
def aws(dynamodb: DynamoDBClient) -> tuple[AwsApprovals, DynamoDBClient]:
    client = emptied(dynamodb)
    return AwsApprovals(client, SETTINGS.checkpoints_table, retention_days=30), client


def _item(client: DynamoDBClient, approval: Approval) -> dict[str, Any]:
    found = client.get_item(
        TableName=SETTINGS.checkpoints_table,
        Key={"run_id": {"S": approval.run_id}, "sk": {"S": approval_sk(approval.approval_id)}},
        ConsistentRead=True,
    )
    return dict(found["Item"])


def test_aws_keeps_the_task_token_beside_the_approval_and_never_in_its_record(aws):
    book, client = aws
    opened = book.open(approval(), task_token=TOKEN)

    item = _item(client, opened)

    assert item["task_token"] == {"S": TOKEN}
    assert TOKEN not in item["record"]["S"]
    assert TOKEN not in repr(book.get("run-1", opened.approval_id))
    assert book.has_token("run-1", opened.approval_id)


def test_aws_an_approval_opened_without_a_token_has_none(aws):
    book, _ = aws
    opened = book.open(approval())

    assert not book.has_token("run-1", opened.approval_id)


def test_aws_the_item_expires_after_the_request_plus_the_retention(aws):
    book, client = aws
    opened = book.open(approval())

    ttl = int(_item(client, opened)[TTL_ATTRIBUTE]["N"])

    assert ttl == int((opened.expires_at + timedelta(days=30)).timestamp())


def test_aws_settle_keeps_the_token_for_the_answer_to_use(aws):
    book, _ = aws
    opened = book.open(approval(), task_token=TOKEN)

    book.settle(opened, APPROVE, channel="link", at=T0)

    assert book.has_token("run-1", opened.approval_id)


def test_aws_close_drops_every_token_of_the_step_and_no_other(aws):
    book, _ = aws
    pending = book.open(approval(1), task_token=TOKEN + "-1")
    decided = book.open(approval(2), task_token=TOKEN + "-2")
    book.settle(decided, APPROVE, channel="link", at=T0)
    other_step = book.open(approval(3, step=4), task_token=TOKEN + "-3")
    other_run = book.open(approval(4, run_id="run-2"), task_token=TOKEN + "-4")

    book.close("run-1", 3, ApprovalStatus.CLOSED, at=T0)

    assert not book.has_token("run-1", pending.approval_id)
    assert not book.has_token("run-1", decided.approval_id)
    assert book.has_token("run-1", other_step.approval_id)
    assert book.has_token("run-2", other_run.approval_id)


def test_aws_an_approval_id_is_opened_once(aws):
    # The condition makes "a stored token is never overwritten" a property of the write.
    book, _ = aws
    book.open(approval(), task_token=TOKEN)

    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        book.open(approval(), task_token="another token")

    assert book.get("run-1", approval().approval_id) == approval()
