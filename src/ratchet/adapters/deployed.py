"""A deployed stack as AWS describes it to the caller, for `ratchet doctor`: its tables' keys,
indexes and TTL, its state machine and the functions it invokes, their environments, the
secrets they name, and its runs API, called with a SigV4 signature as any program calls it.

Only reads, with the caller's own credentials, except `api` with a POST (the doctor's opt-in
run). What AWS answers is translated here: a thing that is not there is None (or False); no
credentials, credentials AWS refuses, or an endpoint that does not answer is
`StackUnreachable` (nothing else can be checked then); any other refusal of one call
(a permission the caller lacks) is `StackPartUnreadable`, naming the call.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from ratchet.errors import StackPartUnreadable, StackUnreachable

CREDENTIALS_REFUSED = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidSignatureException",
        "MissingAuthenticationTokenException",
        "SignatureDoesNotMatch",
        "AuthFailure",
    }
)
_NOT_FOUND = frozenset(
    {"ResourceNotFoundException", "StateMachineDoesNotExist", "ParameterNotFound"}
)
_LAMBDA_TASK = re.compile(r"^arn:aws[a-z-]*:states:::lambda:invoke")
API_TIMEOUT_SECONDS = 30.0
"""API Gateway ends an integration at 29 s: a call that takes longer will not be answered."""


@dataclass(frozen=True)
class TableShape:
    """A table as DescribeTable and DescribeTimeToLive tell it."""

    name: str
    status: str
    keys: tuple[str | None, str | None]
    """(partition key, sort key) by attribute name."""
    key_types: Mapping[str, str]
    """Attribute name -> S, N or B, for every attribute a key or an index uses."""
    indexes: Mapping[str, tuple[str | None, str | None]] = field(default_factory=dict)
    """Global secondary index name -> its (partition key, sort key)."""
    index_status: Mapping[str, str] = field(default_factory=dict)
    ttl_attribute: str | None = None
    """The TTL attribute while TTL is on (or being turned on); None otherwise."""


@dataclass(frozen=True)
class Machine:
    """A state machine and the Lambda functions its definition invokes, by ARN."""

    name: str
    status: str
    functions: tuple[str, ...]


@dataclass(frozen=True)
class ApiAnswer:
    status: int
    body: Any
    """The answer's JSON, or its text when it is not JSON."""


class DeployedStack:
    """Reads a deployed stack in one region, with the clients `client` makes (one per
    service) and `credentials` to sign calls of its API."""

    def __init__(self, client: Any, credentials: Any, region: str, endpoint: str | None) -> None:
        self._client = client
        self._credentials = credentials
        self.region = region
        self.endpoint = endpoint

    @classmethod
    def connect(cls, region: str | None, endpoint: str | None) -> DeployedStack:
        """With the caller's credentials (the usual AWS_* variables, profile, SSO, role);
        `StackUnreachable` if there are none, or no region."""
        session = boto3.Session(region_name=region)
        chosen = region or session.region_name
        if chosen is None:
            raise StackUnreachable(
                "the dynamodb:// store needs a region: add &region=REGION to the URL or set "
                "AWS_REGION"
            )
        try:
            credentials = session.get_credentials()
        except BotoCoreError as error:
            raise StackUnreachable(f"the AWS credentials cannot be read: {error}") from None
        if credentials is None:
            raise StackUnreachable(
                "no AWS credentials: ratchet doctor reads the stack with yours (set "
                "AWS_PROFILE, or the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY variables, "
                "or sign in with aws sso login)"
            )
        # A person waits on each call: a few quick retries, then a clear answer.
        config = Config(
            retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=20
        )
        clients: dict[str, Any] = {}

        def client(service: str) -> Any:
            if service not in clients:
                clients[service] = session.client(
                    service,  # type: ignore[call-overload]  # a service named at run time
                    region_name=chosen,
                    endpoint_url=endpoint,
                    config=config,
                )
            return clients[service]

        return cls(client, credentials, chosen, endpoint)

    def table(self, name: str) -> TableShape | None:
        """The table's shape; None if there is no table of that name."""
        described = self._call("dynamodb", "describe_table", f"table {name}", TableName=name)
        if described is None:
            return None
        table = described["Table"]
        ttl = self._call("dynamodb", "describe_time_to_live", f"table {name}'s TTL", TableName=name)
        ttl_description = (ttl or {}).get("TimeToLiveDescription", {})
        on = ttl_description.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        indexes = table.get("GlobalSecondaryIndexes", [])
        attributes = table.get("AttributeDefinitions", [])
        return TableShape(
            name=name,
            status=table.get("TableStatus", ""),
            keys=_keys(table.get("KeySchema", [])),
            key_types={a["AttributeName"]: a["AttributeType"] for a in attributes},
            indexes={i["IndexName"]: _keys(i.get("KeySchema", [])) for i in indexes},
            index_status={i["IndexName"]: i.get("IndexStatus", "") for i in indexes},
            ttl_attribute=ttl_description.get("AttributeName") if on else None,
        )

    def state_machine(self, arn: str) -> Machine | None:
        """The state machine and the functions its definition names; None if it is not there."""
        described = self._call(
            "stepfunctions", "describe_state_machine", f"state machine {arn}", stateMachineArn=arn
        )
        if described is None:
            return None
        try:
            definition = json.loads(described.get("definition", "{}"))
        except ValueError:
            raise StackPartUnreadable(f"state machine {arn}: its definition is not JSON") from None
        return Machine(
            name=described.get("name", arn),
            status=described.get("status", ""),
            functions=tuple(sorted(set(_function_names(definition)))),
        )

    def function_environment(self, function: str) -> Mapping[str, str] | None:
        """The function's environment variables; None if there is no such function."""
        found = self._call(
            "lambda", "get_function_configuration", f"function {function}", FunctionName=function
        )
        if found is None:
            return None
        variables: Mapping[str, str] = found.get("Environment", {}).get("Variables", {})
        return variables

    def secret_exists(self, reference: str) -> bool:
        """Whether the secret is there: a Secrets Manager ARN, or `ssm:NAME` for a Systems
        Manager parameter (read by name only, never its value)."""
        if reference.startswith("ssm:"):
            name = reference.removeprefix("ssm:")
            found = self._call(
                "ssm",
                "describe_parameters",
                f"parameter {name}",
                ParameterFilters=[{"Key": "Name", "Values": [name]}],
            )
            return bool(found and found.get("Parameters"))
        arn = reference.removeprefix("secretsmanager:")
        found = self._call("secretsmanager", "describe_secret", f"secret {arn}", SecretId=arn)
        return found is not None and "DeletedDate" not in found

    def api(self, method: str, url: str, body: Mapping[str, Any] | None = None) -> ApiAnswer:
        """Call the stack's API as a program does, signed with SigV4 for `execute-api`."""
        data = json.dumps(body).encode("utf-8") if body is not None else None
        headers = {"content-type": "application/json"} if data is not None else {}
        request = AWSRequest(method=method, url=url, data=data, headers=headers)
        SigV4Auth(self._credentials.get_frozen_credentials(), "execute-api", self.region).add_auth(
            request
        )
        prepared = request.prepare()
        sent = urllib.request.Request(
            prepared.url, data=data, headers=dict(prepared.headers), method=method
        )
        try:
            with urllib.request.urlopen(sent, timeout=API_TIMEOUT_SECONDS) as answer:
                return ApiAnswer(answer.status, _body(answer.read()))
        except urllib.error.HTTPError as refused:
            return ApiAnswer(refused.code, _body(refused.read()))
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise StackPartUnreadable(f"{method} {url}: cannot reach it ({reason})") from None

    def _call(self, service: str, operation: str, what: str, **arguments: Any) -> Any:
        try:
            return getattr(self._client(service), operation)(**arguments)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            message = error.response.get("Error", {}).get("Message", "")
            if code in _NOT_FOUND:
                return None
            if code in CREDENTIALS_REFUSED:
                raise StackUnreachable(f"AWS refused the credentials ({code}: {message})") from None
            raise StackPartUnreadable(f"{what}: {code}: {message}") from None
        except NoCredentialsError:
            raise StackUnreachable(
                "no AWS credentials: ratchet doctor reads the stack with yours"
            ) from None
        except NoRegionError:
            raise StackUnreachable("no AWS region: add &region=REGION to the store URL") from None
        except (EndpointConnectionError, BotocoreConnectionError) as error:
            where = self.endpoint or f"{service} in {self.region}"
            raise StackUnreachable(f"cannot reach AWS at {where}: {error}") from None


def _keys(schema: list[Mapping[str, str]]) -> tuple[str | None, str | None]:
    kinds = {k["KeyType"]: k["AttributeName"] for k in schema}
    return kinds.get("HASH"), kinds.get("RANGE")


def _function_names(definition: Any) -> list[str]:
    """The functions a definition's tasks invoke (`Parameters.FunctionName` of Lambda tasks),
    in every state, nested ones included."""
    found = []
    if isinstance(definition, dict):
        resource = definition.get("Resource")
        parameters = definition.get("Parameters")
        if (
            isinstance(resource, str)
            and _LAMBDA_TASK.match(resource)
            and isinstance(parameters, dict)
            and isinstance(parameters.get("FunctionName"), str)
        ):
            found.append(parameters["FunctionName"])
        for value in definition.values():
            found += _function_names(value)
    elif isinstance(definition, list):
        for value in definition:
            found += _function_names(value)
    return found


def _body(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text
