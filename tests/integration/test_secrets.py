"""The secrets a project's tools read (`RunContext.secrets`): on AWS from Secrets Manager and
SSM Parameter Store (moto), fetched on first use and cached for the container (a rotated value
arrives after the cache's time), a name the project does not declare refused naming it, a
store's refusal said without a value; locally the environment variable of the name. No value
is ever in a repr, a log line or a run's state."""

from __future__ import annotations

import logging

import boto3
import pytest
from moto import mock_aws

from ratchet.adapters.secrets import AwsSecrets, EnvironmentSecrets, SecretUnavailable
from ratchet.runtime.aws_settings import AwsSettings
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions

REGION = "eu-west-1"
KEY = "sk_live_do-not-print-me"


@pytest.fixture
def stores():
    with mock_aws():
        sm = boto3.client("secretsmanager", region_name=REGION)
        ssm = boto3.client("ssm", region_name=REGION)
        arn = sm.create_secret(Name="billing/payments-api-key", SecretString=KEY)["ARN"]
        ssm.put_parameter(Name="/erp/token", Value="erp-token", Type="SecureString")
        calls: list[str] = []
        for client in (sm, ssm):
            client.meta.events.register(
                "before-call.*.*", lambda model, **_: calls.append(model.name)
            )
        yield sm, ssm, arn, calls


def _secrets(sm, ssm, arn, clock=lambda: 0.0) -> AwsSecrets:
    settings = AwsSettings.from_env(
        {
            "RATCHET_CHECKPOINTS_TABLE": "ckp",
            "RATCHET_IDEMPOTENCY_TABLE": "idm",
            "RATCHET_APP_TABLE": "app",
            "RATCHET_SECRETS": f'{{"PAYMENTS_API_KEY": "secretsmanager:{arn}", '
            '"ERP_TOKEN": "ssm:/erp/token"}',
        }
    )
    return AwsSecrets(settings.secrets, secretsmanager=lambda: sm, ssm=lambda: ssm, clock=clock)


def test_each_secret_is_fetched_once_and_its_value_shown_nowhere(stores, caplog):
    sm, ssm, arn, calls = stores
    secrets = _secrets(sm, ssm, arn)
    caplog.set_level(logging.DEBUG, logger="ratchet")

    first = [secrets["PAYMENTS_API_KEY"], secrets["ERP_TOKEN"]]
    again = [secrets["PAYMENTS_API_KEY"], secrets["ERP_TOKEN"]]

    assert first == again == [KEY, "erp-token"]
    assert calls == ["GetSecretValue", "GetParameter"]  # the second reads came from the cache
    assert sorted(secrets) == ["ERP_TOKEN", "PAYMENTS_API_KEY"]
    assert KEY not in repr(secrets)
    assert KEY not in "".join(
        r.getMessage() for r in caplog.records if r.name.startswith("ratchet")
    )


def test_a_rotated_secret_arrives_after_the_cache_time(stores):
    sm, ssm, arn, _ = stores
    now = [0.0]
    secrets = _secrets(sm, ssm, arn, clock=lambda: now[0])
    assert secrets["PAYMENTS_API_KEY"] == KEY

    sm.put_secret_value(SecretId=arn, SecretString="sk_live_rotated")
    now[0] = 299.0
    cached = secrets["PAYMENTS_API_KEY"]
    now[0] = 301.0

    assert (cached, secrets["PAYMENTS_API_KEY"]) == (KEY, "sk_live_rotated")


def test_an_undeclared_name_and_a_refusal_say_which_secret_and_no_value(stores):
    sm, ssm, arn, _ = stores
    secrets = _secrets(sm, ssm, arn)
    sm.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)

    with pytest.raises(SecretUnavailable, match="'STRIPE_KEY': the project declares no such"):
        secrets["STRIPE_KEY"]
    with pytest.raises(SecretUnavailable) as refused:
        secrets["PAYMENTS_API_KEY"]
    assert str(refused.value) == "secret 'PAYMENTS_API_KEY': secretsmanager refused: " + (
        "ResourceNotFoundException"
    )


def test_a_bad_reference_in_the_environment_fails_at_cold_start():
    with pytest.raises(ValueError, match="KEY: not a secretsmanager: or ssm: reference"):
        AwsSettings.from_env(
            {
                "RATCHET_CHECKPOINTS_TABLE": "ckp",
                "RATCHET_IDEMPOTENCY_TABLE": "idm",
                "RATCHET_APP_TABLE": "app",
                "RATCHET_SECRETS": '{"KEY": "vault:kv/a"}',
            }
        )


def test_locally_a_secret_is_the_environment_variable_of_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("PAYMENTS_API_KEY", KEY)
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db"))
    try:
        context = runtime.context("r1", RunOptions())
    finally:
        runtime.close()

    assert context.secrets["PAYMENTS_API_KEY"] == KEY
    assert KEY not in repr(context)
    with pytest.raises(SecretUnavailable, match="'MISSING': not in this process's environment"):
        EnvironmentSecrets({})["MISSING"]
