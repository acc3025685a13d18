"""Which DynamoDB refusals are "not now" (retry the step) and which are answers."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from ratchet.adapters.dynamodb import is_transient


def _error(code: str, reasons: list[str] | None = None) -> ClientError:
    response: dict[str, object] = {"Error": {"Code": code, "Message": code}}
    if reasons is not None:
        response["CancellationReasons"] = [{"Code": reason} for reason in reasons]
    return ClientError(response, "TransactWriteItems")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error",
    [
        _error("ProvisionedThroughputExceededException"),
        _error("ThrottlingException"),
        _error("TransactionConflictException"),
        _error("TransactionCanceledException", ["TransactionConflict", "None"]),
        _error("TransactionCanceledException", ["None", "ThrottlingError"]),
    ],
)
def test_throttling_and_conflicts_are_transient(error):
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        _error("TransactionCanceledException", ["ConditionalCheckFailed", "None"]),
        _error("TransactionCanceledException", ["ConditionalCheckFailed", "TransactionConflict"]),
        _error("ConditionalCheckFailedException"),
        _error("ResourceNotFoundException"),
        _error("AccessDeniedException"),
        _error("ValidationException"),
    ],
)
def test_failed_conditions_and_configuration_errors_are_not(error):
    assert not is_transient(error)
