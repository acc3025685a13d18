"""Which DynamoDB failures are "not now" (retry the step), which are "never" (the store cannot
be used), and which are answers; the adapter raises each under Ratchet's name."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from ratchet.adapters.dynamodb.approvals import AwsApprovals
from ratchet.adapters.dynamodb.items import is_transient, store_error
from ratchet.adapters.dynamodb.ledger import DynamoDbLedger
from ratchet.adapters.dynamodb.mailbox import DynamoMailbox
from ratchet.adapters.dynamodb.store import DynamoDbCheckpointStore
from ratchet.errors import StaleVersion, StoreBusy, StoreUnavailable
from ratchet.ports import LedgerEntry
from ratchet.state import utcnow
from ratchet.waits import Approval, ApprovalStatus, SentEvent, Verdict

ENDPOINT = "https://dynamodb.us-east-1.amazonaws.com"


def _error(code: str, reasons: list[str] | None = None) -> ClientError:
    response: dict[str, object] = {"Error": {"Code": code, "Message": code}}
    if reasons is not None:
        response["CancellationReasons"] = [{"Code": reason} for reason in reasons]
    return ClientError(response, "TransactWriteItems")  # type: ignore[arg-type]


THROTTLES_AND_CONFLICTS: list[Exception] = [
    _error("ProvisionedThroughputExceededException"),
    _error("ThrottlingException"),
    _error("RequestLimitExceeded"),
    _error("InternalServerError"),
    _error("TransactionConflictException"),
    _error("TransactionCanceledException", ["TransactionConflict", "None"]),
    _error("TransactionCanceledException", ["None", "ThrottlingError"]),
]
CONNECTIONS: list[Exception] = [
    EndpointConnectionError(endpoint_url=ENDPOINT),
    ConnectTimeoutError(endpoint_url=ENDPOINT),
    ConnectionClosedError(endpoint_url=ENDPOINT),
    ReadTimeoutError(endpoint_url=ENDPOINT),
]
PERMANENT: list[Exception] = [
    _error("ResourceNotFoundException"),
    _error("AccessDeniedException"),
    _error("UnrecognizedClientException"),
    NoCredentialsError(),
]
UNNAMED: list[Exception] = [
    _error("TransactionCanceledException", ["ConditionalCheckFailed", "None"]),
    _error("TransactionCanceledException", ["ConditionalCheckFailed", "TransactionConflict"]),
    _error("ValidationException"),
    ParamValidationError(report="bad"),
]
"""A failed condition is an answer the adapter gives itself; a malformed request is a bug."""


@pytest.mark.parametrize("error", THROTTLES_AND_CONFLICTS)
def test_throttling_and_conflicts_are_transient(error):
    assert is_transient(error)


@pytest.mark.parametrize("error", [e for e in UNNAMED + PERMANENT if isinstance(e, ClientError)])
def test_failed_conditions_and_configuration_errors_are_not(error):
    assert not is_transient(error)


@pytest.mark.parametrize("error", THROTTLES_AND_CONFLICTS + CONNECTIONS)
def test_what_may_succeed_if_sent_again_is_store_busy_naming_the_table(error):
    translated = store_error(error, "ratchet-checkpoints")

    assert isinstance(translated, StoreBusy)
    assert "ratchet-checkpoints" in str(translated)


@pytest.mark.parametrize("error", PERMANENT)
def test_what_retrying_cannot_fix_is_store_unavailable(error):
    assert isinstance(store_error(error, "ratchet-checkpoints"), StoreUnavailable)


@pytest.mark.parametrize("error", UNNAMED)
def test_what_has_no_name_in_ratchet_stays_as_it_is(error):
    assert store_error(error, "ratchet-checkpoints") is error


class _Failing:
    """A DynamoDB client whose every call fails with `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls: list[str] = []

    def __getattr__(self, operation: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(operation)
            raise self.error

        return call


def _store(client: _Failing) -> DynamoDbCheckpointStore:
    return DynamoDbCheckpointStore(
        client,  # type: ignore[arg-type]
        table="ratchet-checkpoints",
        ledger_table="ratchet-idempotency",
    )


def _book(client: _Failing) -> AwsApprovals:
    return AwsApprovals(client, "ratchet-checkpoints")  # type: ignore[arg-type]


def _approval() -> Approval:
    now = utcnow()
    return Approval(
        approval_id="a1a1a1a1a1a1a1a1",
        run_id="r",
        step=1,
        prompt="May I?",
        created_at=now,
        expires_at=now + timedelta(hours=1),
    )


def _mailbox(client: _Failing) -> DynamoMailbox:
    return DynamoMailbox(client, "ratchet-checkpoints")  # type: ignore[arg-type]


def _event() -> SentEvent:
    return SentEvent(run_id="r", event_id="e1", name="ci-finished", received_at=utcnow())


def _verdict() -> Verdict:
    return Verdict(approved=True, by="dana")


def _entry() -> LedgerEntry:
    return LedgerEntry(key="r/step-1", run_id="r", step=1, args_hash="h", decision={})


@pytest.mark.parametrize(
    "call",
    [
        lambda client: _store(client).load_head("r"),
        lambda client: _store(client).begin_attempt("r", 3),
        lambda client: DynamoDbLedger(client, table="ratchet-idempotency").begin(_entry()),
        lambda client: DynamoDbLedger(client, table="ratchet-idempotency").get("r/step-1"),
        lambda client: DynamoDbLedger(client, table="ratchet-idempotency").complete("k", "x"),
        lambda client: _book(client).open(_approval()),
        lambda client: _book(client).get("r", "a1a1a1a1a1a1a1a1"),
        lambda client: _book(client).of_run("r"),
        lambda client: _book(client).settle(_approval(), _verdict(), channel="link", at=utcnow()),
        lambda client: _book(client).close("r", 1, ApprovalStatus.CLOSED, at=utcnow()),
        lambda client: _book(client).task_token(_approval()),
        lambda client: _book(client).forget_token("r", "a1a1a1a1a1a1a1a1"),
        lambda client: _mailbox(client).post(_event()),
        lambda client: _mailbox(client).get("r", "e1"),
        lambda client: _mailbox(client).of_run("r"),
        lambda client: _mailbox(client).next_for("r", "ci-finished"),
        lambda client: _mailbox(client).refuse("r", "e1", "no"),
    ],
    ids=[
        "load_head",
        "begin_attempt",
        "begin",
        "get",
        "complete",
        "approval-open",
        "approval-get",
        "approval-of_run",
        "approval-settle",
        "approval-close",
        "approval-task_token",
        "approval-forget_token",
        "mailbox-post",
        "mailbox-get",
        "mailbox-of_run",
        "mailbox-next_for",
        "mailbox-refuse",
    ],
)
@pytest.mark.parametrize(
    ("error", "named"),
    [
        (EndpointConnectionError(endpoint_url=ENDPOINT), StoreBusy),
        (_error("ThrottlingException"), StoreBusy),
        (_error("ResourceNotFoundException"), StoreUnavailable),
    ],
    ids=["connection", "throttled", "no-table"],
)
def test_every_call_of_the_adapters_raises_the_failure_under_its_ratchet_name(call, error, named):
    client = _Failing(error)

    with pytest.raises(named) as raised:
        call(client)

    assert raised.value.__cause__ is error, "the backend's error is kept as the cause"
    assert client.calls, "the call never reached the client"


def test_a_failed_condition_is_still_the_adapters_own_answer():
    old_head = {"Item": {"version": {"N": "4"}}}
    refused = ClientError(
        {"Error": {"Code": "ConditionalCheckFailedException", "Message": "no"}, **old_head},  # type: ignore[typeddict-item]
        "UpdateItem",
    )

    with pytest.raises(StaleVersion):
        _store(_Failing(refused)).begin_attempt("r", 3)
