"""`ratchet doctor` against a deployed stack's parts on moto's server: the stack's three tables
(`create_tables`), the functions its state machine invokes with the environments the stack
gives them, the secrets they name, the state machine itself, and the runs API (the real
function behind a local stand-in of API Gateway, `tests.api_gateway`, refusing what is not
signed). The command runs as a user runs it, in a process of its own, with the store URL the
stack outputs. Each broken part is one failed line, and exit code 1; a whole stack passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from ratchet.handlers import api
from ratchet.runtime.aws_settings import ENVIRONMENT
from tests.api_gateway import Gateway, local_gateway
from tests.dynamodb_support import REGION, create_tables, moto_server
from tests.integration.aws.harness import FUNCTIONS, FakeContext, _clear_wiring, quick_definition

RATCHET = Path(sys.executable).with_name("ratchet")
TIMEOUT = 60


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


def _client(endpoint: str, service: str) -> Any:
    return boto3.client(  # type: ignore[call-overload]  # a service named at run time
        service,
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="module")
def gateway(endpoint: str) -> Iterator[Gateway]:
    """The runs API function, in this process, on the tables of the stack each test makes: the
    test points it at them (`Deployed.serve`)."""
    saved = dict(os.environ)
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
    )
    try:
        with local_gateway(api.handler, FakeContext("ratchet-api", "arn:ratchet-api")) as running:
            yield running
    finally:
        os.environ.clear()
        os.environ.update(saved)
        _clear_wiring()


@dataclass
class Deployed:
    """One stack's parts on the moto server, named after `prefix`."""

    endpoint: str
    prefix: str
    machine: str
    functions: dict[str, str]
    secrets: dict[str, str]

    @property
    def tables(self) -> dict[str, str]:
        return {role: f"{self.prefix}-{role}" for role in ("checkpoints", "idempotency", "app")}

    @property
    def store_url(self) -> str:
        tables = self.tables
        return (
            f"dynamodb://{tables['checkpoints']}?ledger={tables['idempotency']}"
            f"&app={tables['app']}&region={REGION}&machine={self.machine}"
            f"&endpoint={self.endpoint}"
        )

    def client(self, service: str) -> Any:
        return _client(self.endpoint, service)

    def doctor(self, *args: str, env: dict[str, str] | None = None) -> Any:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        environment.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        environment.update(env or {})
        return subprocess.run(
            [str(RATCHET), "doctor", "--store", self.store_url, *args],
            env=environment,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )


def deploy(endpoint: str, public_url: str) -> Deployed:
    """The stack's parts, as the stack makes them, under a prefix of their own."""
    prefix = f"s{uuid.uuid4().hex[:8]}"
    create_tables(
        _client(endpoint, "dynamodb"),
        checkpoints=f"{prefix}-checkpoints",
        idempotency=f"{prefix}-idempotency",
        app=f"{prefix}-app",
    )
    secrets = _client(endpoint, "secretsmanager")
    link_key = secrets.create_secret(Name=f"{prefix}/link-key", SecretString="k" * 64)["ARN"]
    payments = secrets.create_secret(Name=f"{prefix}/payments", SecretString="p")["ARN"]
    _client(endpoint, "ssm").put_parameter(
        Name=f"/{prefix}/refunds-url", Value="https://refunds.example.com", Type="String"
    )
    environments = {
        "step": {
            ENVIRONMENT["secrets"]: json.dumps(
                {
                    "PAYMENTS_KEY": f"secretsmanager:{payments}",
                    "REFUNDS_URL": f"ssm:/{prefix}/refunds-url",
                }
            )
        },
        "notify": {
            ENVIRONMENT["public_url"]: public_url,
            ENVIRONMENT["link_key_secret_arn"]: link_key,
        },
    }
    role = _client(endpoint, "iam").create_role(
        RoleName=f"{prefix}-role", AssumeRolePolicyDocument="{}"
    )["Role"]["Arn"]
    aws_lambda = _client(endpoint, "lambda")
    arns = {}
    for variable, (name, _) in FUNCTIONS.items():
        short = name.removeprefix("ratchet-")
        arns[variable] = aws_lambda.create_function(
            FunctionName=f"{prefix}-{short}",
            Runtime="python3.11",
            Role=role,
            Handler=f"ratchet_functions.{short}.handler",
            Code={"ZipFile": b"PK\x05\x06" + b"\0" * 18},
            Environment={"Variables": environments.get(short, {})},
        )["FunctionArn"]
    machine = _client(endpoint, "stepfunctions").create_state_machine(
        name=f"{prefix}-agent-run", definition=quick_definition(arns), roleArn=role
    )["stateMachineArn"]
    return Deployed(
        endpoint,
        prefix,
        machine,
        functions={name.removeprefix("ratchet-"): arns[v] for v, (name, _) in FUNCTIONS.items()},
        secrets={"link_key": link_key, "payments": payments},
    )


@pytest.fixture
def deployed(endpoint: str, gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> Deployed:
    stack = deploy(endpoint, gateway.url)
    tables = stack.tables
    monkeypatch.setenv(ENVIRONMENT["checkpoints_table"], tables["checkpoints"])
    monkeypatch.setenv(ENVIRONMENT["idempotency_table"], tables["idempotency"])
    monkeypatch.setenv(ENVIRONMENT["app_table"], tables["app"])
    monkeypatch.setenv(ENVIRONMENT["state_machine_arn"], stack.machine)
    _clear_wiring()
    gateway.refuse_with = None
    gateway.requests.clear()
    return stack


def _lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return done.stdout.splitlines()


def test_a_whole_stack_passes_every_check_and_writes_nothing(deployed: Deployed, gateway: Gateway):
    before = _everything(deployed)

    done = deployed.doctor()

    assert (done.returncode, done.stderr) == (0, ""), done.stdout + done.stderr
    lines = _lines(done)
    checkpoints, idempotency, app = deployed.tables.values()
    link_key, payments = _name(deployed.secrets["link_key"]), _name(deployed.secrets["payments"])
    assert lines == [
        f"ok    table {checkpoints}: keys run_id and sk; indexes runs-by-status, wakes-owed; "
        "TTL on expires_at",
        f"ok    table {idempotency}: keys key; TTL on expires_at",
        f"ok    table {app}: keys pk and sk",
        f"ok    state machine {deployed.prefix}-agent-run: ACTIVE; its 6 functions are there",
        f"ok    secret RATCHET_LINK_KEY_SECRET_ARN: {link_key} is there",
        f"ok    secret RATCHET_SECRETS PAYMENTS_KEY: {payments} is there",
        f"ok    secret RATCHET_SECRETS REFUNDS_URL: /{deployed.prefix}/refunds-url is there",
        f"ok    API: GET {gateway.url}/runs answers 200",
        "skip  run: not started: --run starts one through the API (it writes a run)",
    ]
    # The API was called as a program calls it: signed for execute-api in the stack's region.
    assert gateway.requests == [("GET", "/v1/runs?limit=1", REGION)]
    assert _everything(deployed) == before


def _name(arn: str) -> str:
    """A secret's name as its ARN ends: the name and Secrets Manager's six-character suffix."""
    return arn.rsplit(":", 1)[-1]


def _everything(deployed: Deployed) -> dict[str, Any]:
    dynamodb = deployed.client("dynamodb")
    return {name: dynamodb.scan(TableName=name)["Items"] for name in deployed.tables.values()}


def _drop_ledger(deployed: Deployed) -> str:
    deployed.client("dynamodb").delete_table(TableName=deployed.tables["idempotency"])
    table = deployed.tables["idempotency"]
    return f"table {table}: missing: the idempotency table of the StoreUrl is not there"


def _drop_wakes_index(deployed: Deployed) -> str:
    deployed.client("dynamodb").update_table(
        TableName=deployed.tables["checkpoints"],
        GlobalSecondaryIndexUpdates=[{"Delete": {"IndexName": "wakes-owed"}}],
    )
    return f"table {deployed.tables['checkpoints']}: it has no index wakes-owed"


def _ttl_off(deployed: Deployed) -> str:
    deployed.client("dynamodb").update_time_to_live(
        TableName=deployed.tables["idempotency"],
        TimeToLiveSpecification={"Enabled": False, "AttributeName": "expires_at"},
    )
    return (
        f"table {deployed.tables['idempotency']}: its TTL is off, not on expires_at (old "
        "records would be kept for ever)"
    )


def _drop_machine(deployed: Deployed) -> str:
    deployed.client("stepfunctions").delete_state_machine(stateMachineArn=deployed.machine)
    machine = f"state machine {deployed.prefix}-agent-run"
    return f"{machine}: missing: the StoreUrl's machine is not there"


def _drop_function(deployed: Deployed) -> str:
    deployed.client("lambda").delete_function(FunctionName=deployed.functions["decide"])
    machine = f"state machine {deployed.prefix}-agent-run"
    return f"{machine}: function {deployed.prefix}-decide is missing"


def _drop_secret(deployed: Deployed) -> str:
    deployed.client("secretsmanager").delete_secret(
        SecretId=deployed.secrets["payments"], ForceDeleteWithoutRecovery=True
    )
    named = _name(deployed.secrets["payments"])
    return f"secret RATCHET_SECRETS PAYMENTS_KEY: {named} is missing (or deleted)"


BROKEN = {
    "a-table-missing": _drop_ledger,
    "an-index-missing": _drop_wakes_index,
    "ttl-off": _ttl_off,
    "the-state-machine-missing": _drop_machine,
    "a-function-missing": _drop_function,
    "a-secret-missing": _drop_secret,
}


@pytest.mark.parametrize("breaking", BROKEN.values(), ids=BROKEN.keys())
def test_each_broken_part_is_one_failed_line_and_exit_1(deployed: Deployed, breaking: Any):
    expected = breaking(deployed)

    done = deployed.doctor()

    assert done.returncode == 1, done.stdout + done.stderr
    failed = [line for line in _lines(done) if line.startswith("FAIL")]
    assert failed == [f"FAIL  {expected}"]
    assert _lines(done)[-1] == "1 check failed"


def test_an_api_that_refuses_the_caller_fails_its_check(deployed: Deployed, gateway: Gateway):
    gateway.refuse_with = 403

    done = deployed.doctor()

    assert done.returncode == 1, done.stdout + done.stderr
    failed = [line for line in _lines(done) if line.startswith("FAIL")]
    assert failed == [f"FAIL  API: GET {gateway.url}/runs answers 403: Forbidden"]


def test_an_api_that_does_not_answer_fails_its_check(endpoint: str, gateway: Gateway):
    # A port nothing listens on: the stack's URL, but no API there.
    stack = deploy(endpoint, "http://127.0.0.1:9/v1")

    done = stack.doctor()

    assert done.returncode == 1, done.stdout + done.stderr
    (failed,) = [line for line in _lines(done) if line.startswith("FAIL")]
    assert failed.startswith("FAIL  API: cannot be read: GET http://127.0.0.1:9/v1/runs?limit=1: ")
    assert "cannot reach it" in failed
