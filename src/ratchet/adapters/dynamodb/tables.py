"""Whose tables a `dynamodb://` store names, and whether the caller may read them: asked once,
before `ratchet serve` reads a deployed stack's runs from a laptop.

Three calls, none of them an item read: DescribeTable (the table exists; its ARN names the
account and region), ListTagsOfResource (the `aws:cloudformation:stack-name` tag CloudFormation
puts on the tables it makes; a caller who may not read tags still gets the dashboard, with the
stack unnamed) and one Query of the runs index asking for one item (the caller may read what
every runs page reads). Each refusal is one `StoreUnavailable` that says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from ratchet.adapters.deployed import CREDENTIALS_REFUSED
from ratchet.adapters.dynamodb.items import RUNS_INDEX, error_code, text_attribute
from ratchet.adapters.dynamodb.store import list_partition
from ratchet.errors import StoreUnavailable
from ratchet.state import RunStatus

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

STACK_TAG = "aws:cloudformation:stack-name"
_NOT_ALLOWED = frozenset({"AccessDeniedException", "AccessDenied", "UnauthorizedOperation"})


@dataclass(frozen=True)
class TablesSeen:
    table: str
    account: str
    region: str
    stack: str | None
    """The CloudFormation stack that made the table; None if its tags do not say, or the
    caller may not read them."""


def describe_tables(client: DynamoDBClient, table: str) -> TablesSeen:
    """The checkpoints table `table` as the caller sees it (see the module's docstring)."""
    try:
        arn = client.describe_table(TableName=table)["Table"]["TableArn"]
        stack = _stack_of(client, arn)
        # What every runs page asks: if this is refused, every page would be.
        partition = list_partition(RunStatus.DONE.value, 0)
        client.query(
            TableName=table,
            IndexName=RUNS_INDEX.name,
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": RUNS_INDEX.partition_key},
            ExpressionAttributeValues={":pk": text_attribute(partition)},
            Limit=1,
        )
    except NoCredentialsError:
        raise StoreUnavailable(
            "no AWS credentials: ratchet serve reads the stack's tables with yours (set "
            "AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or aws sso login)"
        ) from None
    except ClientError as error:
        raise _refusal(error, table) from None
    except BotoCoreError as error:
        raise StoreUnavailable(f"DynamoDB cannot be reached for table {table!r}: {error}") from None
    # arn:aws:dynamodb:REGION:ACCOUNT:table/NAME
    _, _, _, region, account, _ = arn.split(":", 5)
    return TablesSeen(table=table, account=account, region=region, stack=stack)


def _stack_of(client: DynamoDBClient, arn: str) -> str | None:
    try:
        tags = client.list_tags_of_resource(ResourceArn=arn).get("Tags", [])
    except ClientError as error:
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if error_code(error) in _NOT_ALLOWED or status == 403:
            return None  # the stack goes unnamed; its tables are read all the same
        raise
    return next((t["Value"] for t in tags if t["Key"] == STACK_TAG), None)


def _refusal(error: ClientError, table: str) -> StoreUnavailable:
    code = error_code(error)
    operation = error.operation_name
    if code == "ResourceNotFoundException" and operation == "DescribeTable":
        return StoreUnavailable(
            f"no table {table!r} in this account and region: give the stack's StoreUrl "
            "output as --store (and its region, in the URL or AWS_REGION)"
        )
    if operation == "Query" and code in ("ValidationException", "ResourceNotFoundException"):
        return StoreUnavailable(
            f"table {table!r} has no {RUNS_INDEX.name} index: it is not a Ratchet checkpoints "
            "table; give the stack's StoreUrl output as --store"
        )
    if code in CREDENTIALS_REFUSED:
        return StoreUnavailable(f"AWS refused your credentials ({code}): sign in again")
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in _NOT_ALLOWED or status == 403:
        return StoreUnavailable(
            f"your AWS credentials may not read table {table!r} ({operation} refused): "
            "ratchet serve needs dynamodb:DescribeTable and dynamodb:Query on the stack's "
            "tables and their indexes"
        )
    return StoreUnavailable(f"table {table!r} cannot be read: {code or error}")
