"""`--store dynamodb://...`: the URL parser and the commands that refuse such a store, with no
I/O (no client is made for a refused command or a malformed URL); and a store URL as a line
shows it, without its password."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ratchet.cli.app import app
from ratchet.errors import InvalidInput
from ratchet.runtime import DynamoDbStoreUrl as DynamoDbStore
from ratchet.runtime import open_runtime
from ratchet.store_urls import shown_url

GOOD = "dynamodb://ratchet-checkpoints?ledger=ratchet-idempotency&app=ratchet-app"


def test_a_full_url_is_parsed_into_its_tables_region_and_endpoint():
    store = DynamoDbStore.parse(f"{GOOD}&region=eu-west-1&endpoint=http://127.0.0.1:8000")

    assert store == DynamoDbStore(
        checkpoints="ratchet-checkpoints",
        ledger="ratchet-idempotency",
        app="ratchet-app",
        region="eu-west-1",
        endpoint="http://127.0.0.1:8000",
    )


def test_region_and_endpoint_are_optional_and_may_be_percent_encoded():
    assert DynamoDbStore.parse(GOOD).region is None
    encoded = DynamoDbStore.parse(f"{GOOD}&endpoint=http%3A%2F%2Flocalhost%3A8000")
    assert encoded.endpoint == "http://localhost:8000"


def test_the_state_machine_is_optional_and_reaches_the_runtimes_settings():
    arn = "arn:aws:states:eu-west-1:123456789012:stateMachine:RatchetRuns-a1B2"
    store = DynamoDbStore.parse(f"{GOOD}&region=eu-west-1&machine={arn}")
    assert (DynamoDbStore.parse(GOOD).machine, store.machine) == (None, arn)
    runtime = store.open(anthropic_api_key=None)
    assert runtime.settings.state_machine_arn == arn  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "mention"),
    [
        ("dynamodb://ratchet-checkpoints?app=a-app", "ledger"),
        ("dynamodb://ratchet-checkpoints?ledger=l-ledger", "app"),
        ("dynamodb://ratchet-checkpoints", "ledger"),
        ("dynamodb://?ledger=l-ledger&app=a-app", "checkpoints table"),
        ("dynamodb://xy?ledger=l-ledger&app=a-app", "checkpoints table"),
        ("dynamodb://bad/table?ledger=l-ledger&app=a-app", "malformed"),
        ("dynamodb://user@host?ledger=l-ledger&app=a-app", "checkpoints table"),
        (f"{GOOD}&legder=x", "legder"),
        (f"{GOOD}&app=again", "twice"),
        (f"{GOOD}&region=Mars", "region"),
        (f"{GOOD}&endpoint=file:///tmp/db", "endpoint"),
        (f"{GOOD}&endpoint=localhost:8000", "endpoint"),
        (f"{GOOD}&machine=ratchet-machine", "state machine's ARN"),
        (f"{GOOD}&machine=arn:aws:lambda:eu-west-1:123456789012:function:f", "machine"),
        ("dynamodb://ratchet-checkpoints?ledger", "malformed"),
    ],
)
def test_a_malformed_url_is_refused_with_what_is_wrong(url, mention):
    with pytest.raises(InvalidInput, match=mention):
        DynamoDbStore.parse(url)


@pytest.mark.parametrize(
    "args",
    [
        ("start", "--scenario", "migration", "--run-id", "r1"),
        ("run", "--scenario", "migration", "--run-id", "r1"),
        ("worker", "--until-idle"),
        ("approve", "r1"),
        ("reject", "r1"),
        ("demo",),
    ],
    ids=lambda args: args[0],
)
def test_commands_that_write_refuse_a_dynamodb_store(args, monkeypatch):
    monkeypatch.delenv("RATCHET_STORE", raising=False)

    result = CliRunner().invoke(app, ["--store", GOOD, *args])

    assert isinstance(result.exception, InvalidInput)
    assert f"ratchet {args[0]} needs a local sqlite:// store" in str(result.exception)


def test_an_anthropic_key_that_is_not_utf8_is_refused_before_a_client_is_made():
    # Python hands the byte 0xff of an environment variable over as a lone surrogate.
    with pytest.raises(InvalidInput, match=r"^ANTHROPIC_API_KEY is not valid: not UTF-8 text$"):
        open_runtime(GOOD, environ={"ANTHROPIC_API_KEY": "sk-\udcff"})


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://ops:s3cret@db.internal/ratchet", "postgresql://ops:***@db.internal/ratchet"),
        (
            "postgres://ops:s3cret@db:5432/r?sslmode=require&password=s3cret",
            "postgres://ops:***@db:5432/r?sslmode=require&password=***",
        ),
        (
            "postgresql://db/r?PassWord=s3cret&pool_size=4",
            "postgresql://db/r?PassWord=***&pool_size=4",
        ),
        # A password holding `@` or a `/` its writer did not escape: all of it is hidden.
        ("postgresql://ops:s3@c/ret@db/r", "postgresql://ops:***@db/r"),
        ("postgresql://:s3cret@db/r#x", "postgresql://:***@db/r#x"),
        # Nothing to hide: as given.
        ("postgresql://ops@db/r?host=/tmp/sock", "postgresql://ops@db/r?host=/tmp/sock"),
        ("dynamodb://runs?region=eu-west-1", "dynamodb://runs?region=eu-west-1"),
        ("sqlite:///odd:name@x.db", "sqlite:///odd:name@x.db"),
        ("runs.db", "runs.db"),
    ],
)
def test_a_shown_store_url_hides_its_password(url: str, shown: str) -> None:
    assert shown_url(url) == shown
    assert "s3cret" not in shown_url(url)
