"""One way to assemble a runtime: the engine wired to a store, from the store's URL.

A runtime is what every entry point needs to act on runs: the checkpoint store, the ledger, the
blob store, the binder that loads each run's agent and model, the run's agent context and data,
the approval book. `open_runtime(url)` builds one from a store URL:

- `sqlite:///path.db` (the default: `sqlite:///.ratchet/ratchet.db`): the local runtime, in one
  SQLite file and the folders beside it (`ratchet.runtime.local.LocalRuntime`);
- `dynamodb://TABLE?ledger=TABLE&app=TABLE&region=REGION[&endpoint=URL]`: the tables of a
  deployed stack (`ratchet.runtime.aws.AwsRuntime`), for reading runs, and for working a run in
  process where no state machine does;
- `postgresql://USER@HOST/DATABASE`: the local runtime on a Postgres database that workers on
  many hosts share (`ratchet.runtime.postgres.PostgresRuntime`, docs/postgres.md).

Each runtime also builds its approval desk and notifiers (`LocalRuntime.approval_desk`,
`AwsRuntime.approval_desk`); each run's model is chosen and built in `ratchet.runtime.models`,
and the services the HTTP apps serve with in `ratchet.runtime.services`. The entry points read
their settings (and, on Lambda, secrets and clients) and hand them here.

`connect(url)` (the public `ratchet.connect`) gives a `Client` on the runtime of a store URL:
the client acts through the `Runtime` protocol it defines, and this package, which builds the
runtimes, sits above it and above the apps' service types (`ratchet.runtime.services`): it is
the composition root, below only the entry points (the CLI and the Lambda handlers) that call
it. Layering, checked by import-linter (`make lint`; docs/architecture.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from ratchet.errors import InvalidInput, StoreUnavailable
from ratchet.sealing import SETTING as PAYLOAD_KEY_ENV
from ratchet.sealing import check_setting
from ratchet.store_urls import (
    DEFAULT_STORE,
    DYNAMODB_SCHEME,
    POSTGRES_FORM,
    POSTGRES_SCHEMES,
    SQLITE_SCHEME,
    shown_url,
    store_url,
)
from ratchet.untrusted import is_utf8

if TYPE_CHECKING:
    from pydantic import SecretStr

    from ratchet.client import Client, Runtime
    from ratchet.runtime.local import LocalRuntime, LocalSettings


def connect(
    url: str | None = None,
    *,
    create: bool = True,
    environ: Mapping[str, str] | None = None,
    worker_id: str | None = None,
) -> Client:
    """A client on the store at `url`: `sqlite:///path.db` or the file's plain path (made if
    missing, unless `create=False`), a Postgres database, `postgresql://USER@HOST/DATABASE`, or
    a deployed stack's tables, `dynamodb://TABLE?ledger=TABLE&app=TABLE&region=REGION` (and
    `&endpoint=URL`). Default: `RATCHET_STORE`, else `sqlite:///.ratchet/ratchet.db`. The rest
    (`ANTHROPIC_API_KEY`, ...) is read from `environ`, default the process's."""
    # Loaded here, not with the package: a worker or a Lambda handler opens a runtime without
    # the client's answer models.
    from ratchet.client import Client

    return Client(open_runtime(url, create=create, environ=environ), worker_id=worker_id)


def open_runtime(
    url: str | None = None,
    *,
    create: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Runtime:
    """The runtime of the store at `url` (default: `RATCHET_STORE`, else the local default).

    `create` makes a missing local store (a write command); without it a missing one is
    `StoreUnavailable`. The rest of the configuration is read from `environ` (default: the
    process environment), as the CLI reads it, and only what the URL's scheme needs: a local
    store reads its `LocalSettings` (an Anthropic key, the approval pages' public URL, ...), a
    dynamodb:// store the Anthropic key (boto3 reads the AWS_* variables itself)."""
    env = os.environ if environ is None else environ
    store = store_url(url if url is not None else env.get("RATCHET_STORE") or DEFAULT_STORE)
    if store.startswith(DYNAMODB_SCHEME):
        return DynamoDbStoreUrl.parse(store).open(
            anthropic_api_key=_anthropic_api_key(env), payload_key=_payload_key(env)
        )
    from ratchet.runtime.local import LocalSettings

    settings = LocalSettings.from_env(env).model_copy(update={"store": store})
    return runtime_for(settings, create=create)


def runtime_for(settings: LocalSettings, *, create: bool) -> Runtime:
    """The runtime `settings.store` names (see `open_runtime`), for an entry point that has read
    its settings already (the CLI): of them, a dynamodb:// store takes the Anthropic key only."""
    url = store_url(settings.store)
    if url != settings.store:
        settings = settings.model_copy(update={"store": url})
    if url.startswith(DYNAMODB_SCHEME):
        return DynamoDbStoreUrl.parse(url).open(
            anthropic_api_key=settings.anthropic_api_key, payload_key=settings.payload_key
        )
    return local_runtime(settings, create=create)


def local_runtime(
    settings: LocalSettings, *, create: bool, any_thread: bool = False
) -> LocalRuntime:
    """The local runtime of the sqlite:// or postgresql:// store `settings.store` names, for
    an entry point that uses its local parts (`ratchet serve`, its worker); `any_thread` as
    `LocalRuntime.open` takes it. A dynamodb:// store is `StoreUnavailable`."""
    url = store_url(settings.store)
    if url != settings.store:
        settings = settings.model_copy(update={"store": url})
    if url.startswith(SQLITE_SCHEME):
        from ratchet.runtime.local import LocalRuntime

        return LocalRuntime.open(settings, create=create, any_thread=any_thread)
    if url.startswith(POSTGRES_SCHEMES):
        from ratchet.runtime.postgres import PostgresRuntime

        return PostgresRuntime.open(settings, create=create, any_thread=any_thread)
    raise StoreUnavailable(
        f"unsupported store URL {shown_url(url)!r}: use sqlite:///relative/path.db, "
        f"sqlite:////absolute/path.db, {POSTGRES_FORM} or {DYNAMODB_FORM}"
    )


# --- the tables of a deployed stack ------------------------------------------------------------

DYNAMODB_FORM = "dynamodb://TABLE?ledger=TABLE&app=TABLE&region=REGION[&machine=ARN][&endpoint=URL]"
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_STATE_MACHINE_ARN = re.compile(
    r"^arn:aws[a-z-]*:states:[a-z0-9-]+:\d{12}:stateMachine:[A-Za-z0-9_-]{1,80}$"
)
_DYNAMODB_PARAMETERS = {"ledger", "app", "region", "endpoint", "machine"}


@dataclass(frozen=True)
class DynamoDbStoreUrl:
    """A `dynamodb://` store URL, parsed and checked before any client is made."""

    checkpoints: str
    ledger: str
    app: str
    region: str | None = None
    endpoint: str | None = None
    machine: str | None = None
    """The stack's state machine (its `StateMachineArn` output): with it,
    `ratchet.connect(url).wake(run)` restarts the execution the woken run sleeps in; without
    it the run goes on when its sleep would have ended."""

    @classmethod
    def parse(cls, url: str) -> DynamoDbStoreUrl:
        parts = urlsplit(url)
        try:
            query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError:
            raise InvalidInput(f"malformed store URL {url!r}: use {DYNAMODB_FORM}") from None
        unknown = sorted(set(query) - _DYNAMODB_PARAMETERS)
        if unknown:
            raise InvalidInput(
                f"unknown parameter {unknown[0]!r} in store URL {url!r}: use {DYNAMODB_FORM}"
            )
        repeated = sorted(name for name, values in query.items() if len(values) > 1)
        if repeated:
            raise InvalidInput(f"parameter {repeated[0]!r} is given twice in store URL {url!r}")
        values = {name: found[0] for name, found in query.items()}
        tables = {
            "checkpoints table (dynamodb://TABLE)": parts.netloc,
            "ledger table (ledger=TABLE)": values.get("ledger", ""),
            "app table (app=TABLE)": values.get("app", ""),
        }
        for name, table in tables.items():
            if not _TABLE_NAME.fullmatch(table):
                raise InvalidInput(
                    f"store URL {url!r} needs a valid {name} (3-255 letters, digits, '_', '-' "
                    f"or '.'): use {DYNAMODB_FORM}"
                )
        region = values.get("region") or None
        if region is not None and not _REGION.fullmatch(region):
            raise InvalidInput(f"malformed region {region!r} in store URL {url!r}")
        endpoint = values.get("endpoint") or None
        if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
            raise InvalidInput(f"the endpoint in store URL {url!r} must be an http(s) URL")
        machine = values.get("machine") or None
        if machine is not None and not _STATE_MACHINE_ARN.fullmatch(machine):
            raise InvalidInput(
                f"the machine in store URL {url!r} must be a state machine's ARN "
                "(arn:aws:states:REGION:ACCOUNT:stateMachine:NAME, the stack's StateMachineArn)"
            )
        if parts.path not in ("", "/") or parts.fragment:
            raise InvalidInput(f"malformed store URL {url!r}: use {DYNAMODB_FORM}")
        return cls(parts.netloc, values["ledger"], values["app"], region, endpoint, machine)

    def open(
        self, *, anthropic_api_key: SecretStr | None, payload_key: str | None = None
    ) -> Runtime:
        """The AWS runtime on these tables, with clients for a person waiting on a command: a
        few quick retries, then a clear error. Needs the `aws` extra (boto3). With
        `anthropic_api_key`, runs worked in process may call Claude; with `payload_key`
        (`RATCHET_PAYLOAD_KEY`: `kms:...` or `file:PATH`), sealed records are read and new
        ones sealed."""
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import NoRegionError
        except ImportError:
            raise StoreUnavailable(
                "a dynamodb:// store needs boto3: pip install 'ratchet-agents[aws]'"
            ) from None

        from ratchet.adapters.payload_keys import payload_codec
        from ratchet.runtime.aws import AwsRuntime
        from ratchet.runtime.aws_settings import AwsSettings

        config = Config(
            retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=20
        )
        try:
            dynamodb = boto3.client(
                "dynamodb", region_name=self.region, endpoint_url=self.endpoint, config=config
            )
        except NoRegionError:
            raise InvalidInput(
                "the dynamodb:// store needs a region: add &region=REGION to the URL or set "
                "AWS_REGION"
            ) from None

        def stepfunctions() -> Any:
            return boto3.client(
                "stepfunctions", region_name=self.region, endpoint_url=self.endpoint, config=config
            )

        def kms() -> Any:
            return boto3.client(
                "kms", region_name=self.region, endpoint_url=self.endpoint, config=config
            )

        codec = payload_codec(payload_key, beside=None, kms=kms)
        aws_settings = AwsSettings(
            checkpoints_table=self.checkpoints,
            idempotency_table=self.ledger,
            app_table=self.app,
            state_machine_arn=self.machine,
        )
        return AwsRuntime(
            aws_settings,
            dynamodb,
            anthropic_api_key=anthropic_api_key,
            stepfunctions=stepfunctions,
            codec=codec,
        )


def _payload_key(env: Mapping[str, str]) -> str | None:
    """`RATCHET_PAYLOAD_KEY`, checked as `LocalSettings` checks it."""
    value = env.get(PAYLOAD_KEY_ENV) or None
    if value is None:
        return None
    try:
        return check_setting(value)
    except ValueError as refused:
        raise InvalidInput(f"{PAYLOAD_KEY_ENV} is not valid: {refused}") from None


def _anthropic_api_key(env: Mapping[str, str]) -> SecretStr | None:
    """`ANTHROPIC_API_KEY`, checked as `LocalSettings` checks it (`is_utf8`)."""
    from pydantic import SecretStr

    key = env.get("ANTHROPIC_API_KEY") or None
    if key is None:
        return None
    if not is_utf8(key):
        raise InvalidInput("ANTHROPIC_API_KEY is not valid: not UTF-8 text")
    return SecretStr(key)
