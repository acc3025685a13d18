"""The local runtime: the engine wired to a SQLite store, a blob folder and per-run agent data.

`sqlite:///.ratchet/ratchet.db` keeps everything in and beside that file: the checkpoints, the
ledger and each run's `RunData` in the database, blobs in `ratchet.blobs/`, and a folder per
run for an agent that keeps files (the migration demo's app database) in `ratchet.data/<run_id>/`.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ratchet.adapters.call_locks import FileCallLocks
from ratchet.adapters.file_blobs import FileBlobStore
from ratchet.adapters.payload_keys import payload_codec
from ratchet.adapters.private import private_folder
from ratchet.adapters.secrets import EnvironmentSecrets
from ratchet.adapters.sqlite.approvals import SqliteApprovalBook
from ratchet.adapters.sqlite.daily_spend import SqliteDailySpend
from ratchet.adapters.sqlite.data import SqliteRunData
from ratchet.adapters.sqlite.database import DEFAULT_BUSY_TIMEOUT_SECONDS, SqliteDatabase
from ratchet.adapters.sqlite.leases import SqliteLeases
from ratchet.adapters.sqlite.ledger import SqliteLedger
from ratchet.adapters.sqlite.rate import SqliteRateLimit
from ratchet.adapters.sqlite.store import SqliteCheckpointStore, SqliteWaitBook
from ratchet.agents import AgentRegistry, declared_events
from ratchet.approvals.links import LinkSigner, key_file, token_file
from ratchet.children import CHILDREN_SWEEP_SECONDS, ChildRunDesk
from ratchet.engine import Binding, Engine
from ratchet.errors import InvalidInput, StoreUnavailable
from ratchet.faults import NO_FAULTS, FaultPlan
from ratchet.limits import (
    MAX_CONCURRENT_ENV,
    MAX_REQUESTS_PER_MINUTE,
    ConcurrencyLimits,
    parse_overrides,
    resolve_overrides,
)
from ratchet.runs import RunRequest, new_run
from ratchet.runtime.local_approvals import (
    LocalResumer,
    deliver_undelivered,
    delivery_time,
    expire_overdue,
)
from ratchet.sealing import SETTING as PAYLOAD_KEY_ENV
from ratchet.sealing import PayloadCodec, check_setting
from ratchet.store_urls import DEFAULT_STORE, POSTGRES_FORM, shown_url, store_url
from ratchet.untrusted import is_utf8
from ratchet.waits import DEFAULT_APPROVAL_SECONDS, ApprovalStatus, Verdict
from ratchet.webhook_urls import parse_webhook_urls

if TYPE_CHECKING:
    from ratchet.adapters.outbox import OutboxNotifier
    from ratchet.adapters.sqlite.deliveries import SqliteDeliveries
    from ratchet.adapters.sqlite.hooks import SqliteHookBook
    from ratchet.adapters.sqlite.housekeeping import SqliteHousekeeping
    from ratchet.adapters.sqlite.mailbox import SqliteMailbox
    from ratchet.adapters.sqlite.reencrypt import Reencryption
    from ratchet.adapters.sqlite.schedules import SqliteScheduleBook
    from ratchet.approvals.desk import ApprovalDesk
    from ratchet.ports import DailySpend, Notifier, RateLimit
    from ratchet.runtime.hooks import Hooks
    from ratchet.schedules import Starter
    from ratchet.waiting.desk import EventDesk
    from ratchet.waiting.hooks import HookKeys
    from ratchet.worker import StepReport, WakeUps, Worker
from ratchet.runtime.models import Bindings
from ratchet.state import (
    EMAIL_PATTERN,
    MAX_NOTIFY_EMAILS,
    SLACK_CHANNEL_PATTERN,
    ChildrenWait,
    NotifyTargets,
    RunOptions,
    RunState,
    RunStatus,
    utcnow,
)
from ratchet.tools import Agent, RunContext

DEFAULT_PORT = 8765
DEFAULT_PUBLIC_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
MAX_APPROVAL_SECONDS = 365 * 24 * 3600
MAX_BUSY_TIMEOUT_SECONDS = 600.0


class LocalSettings(BaseModel):
    """Configuration of the local entry points, read from the environment once, at start."""

    model_config = ConfigDict(frozen=True)

    store: str = DEFAULT_STORE
    anthropic_api_key: SecretStr | None = None
    anthropic_base_url: str | None = None
    fault: str | None = None
    """A fault plan (`ratchet.faults`), parsed here so a bad one is refused before any write."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    public_url: str = Field(default=DEFAULT_PUBLIC_URL, pattern=r"^https?://[^\s?#]+$")
    """Where `ratchet serve` is reached: the base of every approval link."""
    public_url_set: bool = False
    """Whether `RATCHET_PUBLIC_URL` gave `public_url`; if not, `ratchet serve` points the links
    it makes at the address it listens on (`serving_at`)."""
    slack_signing_secret: SecretStr | None = None
    """Lets `ratchet serve` take Slack's button presses (a tunnel to it as the Request URL)."""
    approval_timeout_seconds: int = Field(
        default=DEFAULT_APPROVAL_SECONDS, ge=60, le=MAX_APPROVAL_SECONDS
    )
    """How long a person has to answer a request (`RATCHET_APPROVAL_TIMEOUT_SECONDS`), unless
    the run was started with its own (`--approval-timeout`); a worker expires it after."""
    busy_timeout_seconds: float = Field(
        default=DEFAULT_BUSY_TIMEOUT_SECONDS, ge=0, le=MAX_BUSY_TIMEOUT_SECONDS
    )
    """How long a command waits on a store another process has locked before it says the
    store is busy. Workers racing on one store need the default; a person may want less."""
    max_concurrent: dict[str, int] = Field(default_factory=dict)
    """Bounds on concurrent runs (`RATCHET_MAX_CONCURRENT`, a JSON object), over each agent's
    own `max_concurrent`, by the import path (or built-in scenario) of the agent: a worker
    checks that each names an agent when it starts (`concurrency_limits`, `ratchet.limits`)."""
    requests_per_minute: int | None = Field(default=None, ge=1, le=MAX_REQUESTS_PER_MINUTE)
    """Model calls a minute shared by every worker on the store
    (`RATCHET_REQUESTS_PER_MINUTE`): see `ratchet.limits`."""
    webhooks: tuple[str, ...] = ()
    """Where each change of a run's status is POSTed, signed, beside its agent's own URLs
    (`RATCHET_WEBHOOKS`: URLs separated by commas or spaces), by every `ratchet worker`,
    `ratchet serve` and `ratchet run` that has them (`ratchet.runtime.webhooks`)."""
    webhook_secret: SecretStr | None = None
    """The webhooks' signing secret (`RATCHET_WEBHOOK_SECRET`); by default one made and kept
    beside the store (`<store>.webhook-secret`)."""
    notify_emails: tuple[str, ...] = ()
    """Who is asked when a run names nobody (`RATCHET_NOTIFY_EMAILS`, comma-separated), as on
    AWS; the operator's own link is printed by the worker all the same."""
    notify_slack_channel: str | None = None
    """The Slack channel asked when a run names none (`RATCHET_NOTIFY_SLACK_CHANNEL`)."""
    slack_bot_token: SecretStr | None = None
    """Posts each request with its buttons to the run's Slack channel (`RATCHET_SLACK_BOT_TOKEN`,
    `chat:write`); unset, Slack's message is only written to the outbox."""
    slack_api_url: str = Field(default="https://slack.com/api", pattern=r"^https?://[^\s?#]+$")
    """Slack's Web API (`RATCHET_SLACK_API_URL`): a stand-in's, in tests."""
    smtp_url: SecretStr | None = None
    """The SMTP server each recipient's email is sent through (`RATCHET_SMTP_URL`, see
    `ratchet.adapters.smtp`): a secret as a whole, since it holds the password."""
    email_sender: str | None = Field(default=None, validate_default=True)
    """Who the emails are from (`RATCHET_EMAIL_SENDER`): required with `RATCHET_SMTP_URL`."""
    payload_key: str | None = None
    """Seals what runs' records carry about the world before it is stored
    (`RATCHET_PAYLOAD_KEY`: `local`, `file:PATH` or `kms:<key ARN or alias>`, see
    `ratchet.sealing`); unset, nothing is sealed."""

    @field_validator("*", mode="before")
    @classmethod
    def _valid_text(cls, value: Any) -> Any:
        if isinstance(value, str) and not is_utf8(value):
            raise ValueError("not UTF-8 text")
        return value

    @field_validator("max_concurrent", mode="before")
    @classmethod
    def _parsed_bounds(cls, value: Any) -> Any:
        return parse_overrides(value) if isinstance(value, str) else value

    @field_validator("webhooks", mode="before")
    @classmethod
    def _parsed_webhooks(cls, value: Any) -> Any:
        try:
            return parse_webhook_urls(value) if isinstance(value, str) else value
        except InvalidInput as refused:
            raise ValueError(str(refused)) from None

    @field_validator("notify_emails", mode="before")
    @classmethod
    def _listed_emails(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        listed = tuple(dict.fromkeys(e.strip() for e in value.split(",") if e.strip()))
        for address in listed:
            if not re.fullmatch(EMAIL_PATTERN, address):
                raise ValueError(f"{address!r} is not an email address (name@example.com)")
        # The defaults become a run's `NotifyTargets`, which holds this many, as on AWS.
        if len(listed) > MAX_NOTIFY_EMAILS:
            raise ValueError(f"names {len(listed)} addresses; at most {MAX_NOTIFY_EMAILS}")
        return listed

    @field_validator("notify_slack_channel")
    @classmethod
    def _valid_channel(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(SLACK_CHANNEL_PATTERN, value):
            raise ValueError("not a Slack channel (an id such as C0123ABCD, or #name)")
        return value

    @field_validator("smtp_url")
    @classmethod
    def _valid_smtp_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            # Loaded only when set: `ratchet start` need not load smtplib (issue 36).
            from ratchet.adapters.smtp import SmtpServer

            SmtpServer.from_url(value.get_secret_value())
        return value

    @field_validator("email_sender")
    @classmethod
    def _sender_with_server(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            if info.data.get("smtp_url") is not None:
                raise ValueError(
                    "required with RATCHET_SMTP_URL (who the approval emails are from)"
                )
            return None
        from ratchet.adapters.smtp import sender_address

        sender_address(value)
        return value

    @field_validator("payload_key")
    @classmethod
    def _valid_payload_key(cls, value: str | None) -> str | None:
        return None if value is None else check_setting(value)

    @field_validator("fault")
    @classmethod
    def _valid_fault(cls, value: str | None) -> str | None:
        FaultPlan.parse(value)
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LocalSettings:
        env = os.environ if environ is None else environ
        try:
            return cls._from(env)
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            name = _ENV_NAMES.get(str(first["loc"][0]), str(first["loc"][0]))
            message = str(first["msg"]).removeprefix("Value error, ")
            raise InvalidInput(f"{name} is not valid: {message}") from None

    def serving_at(self, url: str) -> LocalSettings:
        """These settings for a server reached at `url`: its links point there, unless
        `RATCHET_PUBLIC_URL` says where the server is reached (a tunnel, a proxy)."""
        return self if self.public_url_set else self.model_copy(update={"public_url": url})

    @classmethod
    def _from(cls, env: Mapping[str, str]) -> LocalSettings:
        return cls(
            store=store_url(env.get("RATCHET_STORE") or DEFAULT_STORE),
            anthropic_api_key=env.get("ANTHROPIC_API_KEY") or None,
            anthropic_base_url=env.get("ANTHROPIC_BASE_URL") or None,
            fault=env.get("RATCHET_FAULT") or None,
            log_level=env.get("RATCHET_LOG_LEVEL") or "INFO",
            public_url=env.get("RATCHET_PUBLIC_URL") or DEFAULT_PUBLIC_URL,
            public_url_set=bool(env.get("RATCHET_PUBLIC_URL")),
            slack_signing_secret=env.get("RATCHET_SLACK_SIGNING_SECRET") or None,
            approval_timeout_seconds=env.get("RATCHET_APPROVAL_TIMEOUT_SECONDS")
            or DEFAULT_APPROVAL_SECONDS,
            busy_timeout_seconds=env.get("RATCHET_BUSY_TIMEOUT_SECONDS")
            or DEFAULT_BUSY_TIMEOUT_SECONDS,
            max_concurrent=env.get(MAX_CONCURRENT_ENV) or {},
            requests_per_minute=env.get("RATCHET_REQUESTS_PER_MINUTE") or None,
            webhooks=env.get("RATCHET_WEBHOOKS") or (),
            webhook_secret=env.get("RATCHET_WEBHOOK_SECRET") or None,
            notify_emails=env.get("RATCHET_NOTIFY_EMAILS") or (),
            notify_slack_channel=env.get("RATCHET_NOTIFY_SLACK_CHANNEL") or None,
            slack_bot_token=env.get("RATCHET_SLACK_BOT_TOKEN") or None,
            slack_api_url=env.get("RATCHET_SLACK_API_URL") or "https://slack.com/api",
            smtp_url=env.get("RATCHET_SMTP_URL") or None,
            email_sender=env.get("RATCHET_EMAIL_SENDER") or None,
            payload_key=env.get(PAYLOAD_KEY_ENV) or None,
        )


_ENV_NAMES = {
    "store": "RATCHET_STORE",
    "anthropic_api_key": "ANTHROPIC_API_KEY",
    "anthropic_base_url": "ANTHROPIC_BASE_URL",
    "fault": "RATCHET_FAULT",
    "log_level": "RATCHET_LOG_LEVEL",
    "public_url": "RATCHET_PUBLIC_URL",
    "slack_signing_secret": "RATCHET_SLACK_SIGNING_SECRET",
    "approval_timeout_seconds": "RATCHET_APPROVAL_TIMEOUT_SECONDS",
    "busy_timeout_seconds": "RATCHET_BUSY_TIMEOUT_SECONDS",
    "max_concurrent": MAX_CONCURRENT_ENV,
    "requests_per_minute": "RATCHET_REQUESTS_PER_MINUTE",
    "webhooks": "RATCHET_WEBHOOKS",
    "webhook_secret": "RATCHET_WEBHOOK_SECRET",
    "notify_emails": "RATCHET_NOTIFY_EMAILS",
    "notify_slack_channel": "RATCHET_NOTIFY_SLACK_CHANNEL",
    "slack_bot_token": "RATCHET_SLACK_BOT_TOKEN",
    "slack_api_url": "RATCHET_SLACK_API_URL",
    "smtp_url": "RATCHET_SMTP_URL",
    "email_sender": "RATCHET_EMAIL_SENDER",
    "payload_key": PAYLOAD_KEY_ENV,
}


def concurrency_limits(settings: LocalSettings) -> ConcurrencyLimits:
    """The bound on each agent's concurrent runs for a local worker: `InvalidInput` (one line)
    if `RATCHET_MAX_CONCURRENT` names an agent a worker could not load, since such a key
    would bound nothing. A local worker loads a run's agent by its import path or a built-in
    scenario's name (`AgentRegistry.local`), so those are the names an override takes."""
    local = AgentRegistry.local()
    return ConcurrencyLimits(local, resolve_overrides(settings.max_concurrent, local))


def _kms_client() -> Any:
    try:
        import boto3
    except ImportError:
        raise InvalidInput(
            "RATCHET_PAYLOAD_KEY=kms:... needs boto3: pip install 'ratchet-agents[aws]'"
        ) from None
    return boto3.client("kms")


def log_failures(failures: Sequence[str], run_id: str, logger: Any) -> None:
    """The channels an approval request could not be sent through, logged as on AWS
    (`ratchet.handlers.notify`): the request is open all the same."""
    for failure in failures:
        logger.error("approval notification failed", extra={"run_id": run_id, "error": failure})


def sqlite_path(url: str) -> Path:
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise StoreUnavailable(
            f"unsupported store URL {shown_url(url)!r}: locally use sqlite:///relative/path.db, "
            f"sqlite:////absolute/path.db or {POSTGRES_FORM}"
        )
    return Path(url[len(prefix) :])


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class LocalRuntime:
    db: SqliteDatabase
    settings: LocalSettings
    clock: Callable[[], datetime] = utcnow
    """The time by which the runtime's engine, workers and desks reckon: when a wait is due,
    a timeout passes, an at-most-once call's deadline. The real time, but for a test's fake
    clock (`ratchet.testing.FakeClock`), on which a week's sleep takes no time."""
    _bindings: Bindings = field(init=False)

    def __post_init__(self) -> None:
        self._bindings = Bindings(
            self.context,
            anthropic_api_key=self.settings.anthropic_api_key,
            anthropic_base_url=self.settings.anthropic_base_url,
        )

    @classmethod
    def open(
        cls,
        settings: LocalSettings,
        *,
        create: bool = True,
        any_thread: bool = False,
        clock: Callable[[], datetime] = utcnow,
    ) -> LocalRuntime:
        """With `any_thread`, the store's connection may be used from any thread, one at a
        time (see `SqliteDatabase`); `clock` is the runtime's time (`LocalRuntime.clock`)."""
        database = SqliteDatabase(
            sqlite_path(settings.store),
            create=create,
            busy_timeout=settings.busy_timeout_seconds,
            any_thread=any_thread,
        )
        return cls(database, settings, clock)

    @cached_property
    def codec(self) -> PayloadCodec | None:
        """What seals runs' records and blobs (`RATCHET_PAYLOAD_KEY`), or None: its keyring
        read (and, for `local`, made) once, when first needed. A `local` keyring is kept
        beside the store only when every process of it runs here (`one_host`): on a store many
        hosts share, each would make its own, and open none of the others' records."""
        beside = self.root if self.one_host else None
        return payload_codec(self.settings.payload_key, beside=beside, kms=_kms_client)

    @property
    def store(self) -> SqliteCheckpointStore:
        return SqliteCheckpointStore(self.db, self.codec)

    @property
    def ledger(self) -> SqliteLedger:
        return SqliteLedger(self.db, codec=self.codec)

    @property
    def leases(self) -> SqliteLeases:
        return SqliteLeases(self.db)

    @property
    def approvals(self) -> SqliteApprovalBook:
        return SqliteApprovalBook(self.db, self.codec)

    @property
    def mailbox(self) -> SqliteMailbox:
        # This and the books below are loaded by the commands that use them, not by a start
        # or a decision (issue 36).
        from ratchet.adapters.sqlite.mailbox import SqliteMailbox

        return SqliteMailbox(self.db, self.codec)

    @property
    def wait_book(self) -> SqliteWaitBook:
        return SqliteWaitBook(self.db)

    @property
    def hook_book(self) -> SqliteHookBook:
        from ratchet.adapters.sqlite.hooks import SqliteHookBook

        return SqliteHookBook(self.db)

    @property
    def hook_keys(self) -> HookKeys:
        """Hook ids and secrets, derived from a key kept beside the store (`<store>.hook-key`,
        made on first use, owner-only, as the approval link key is): its own key, so that
        rotating one revokes only its own (links, or hooks)."""
        from ratchet.waiting.hooks import HookKeys

        return HookKeys(self.hook_key)

    one_host = True
    """Whether every process of this store runs on this host (a SQLite file's do): then what a
    process makes for the store may be kept beside it, as its keys are."""

    def hook_key(self) -> bytes:
        """The key the hooks derive from: `<store>.hook-key`, made on first use."""
        return key_file(Path(f"{self.root}.hook-key"))

    def approval_key(self) -> bytes:
        """The key approval links are signed with: `<store>.approval-key`, made on first use."""
        return key_file(Path(f"{self.root}.approval-key"))

    @property
    def serve_token_file(self) -> Path:
        """Where `ratchet serve` keeps the bearer token its runs API takes when it listens
        beyond this machine: `<store>.serve-token`, beside the store's keys, owner-only."""
        return Path(f"{self.root}.serve-token")

    @property
    def serve_file(self) -> Path:
        """Where a `ratchet serve` of this store says where its links point, while it runs:
        `<store>.serve`, read by every other command's links (`public_url`)."""
        return Path(f"{self.root}.serve")

    @contextmanager
    def serving(self, url: str) -> Iterator[None]:
        """While a `ratchet serve` reached at `url` runs, the links every other process of
        this store makes point there (not at the default port, which may be another
        project's serve)."""
        said = json.dumps({"url": url, "pid": os.getpid()})
        self.serve_file.write_text(said, encoding="utf-8")
        try:
            yield
        finally:
            # A later serve of this store may have written its own since: only ours goes.
            try:
                if self.serve_file.read_text(encoding="utf-8") == said:
                    self.serve_file.unlink()
            except OSError:
                pass

    @property
    def public_url(self) -> str:
        """The base of this store's links: `RATCHET_PUBLIC_URL`; else where a live `ratchet
        serve` of this store listens; else the default address."""
        if self.settings.public_url_set:
            return self.settings.public_url
        try:
            served = json.loads(self.serve_file.read_text(encoding="utf-8"))
            url = str(served["url"])
            os.kill(int(served["pid"]), 0)  # a serve killed outright left its file behind
        except PermissionError:  # alive, and another user's
            return url
        except (OSError, ValueError, KeyError, TypeError):
            return self.settings.public_url
        return url

    def serve_token(self) -> str:
        """The token in `serve_token_file`, made on first use and kept for the next start."""
        return token_file(self.serve_token_file)

    @contextmanager
    def readers(self) -> Iterator[LocalRuntime]:
        """The runtime `ratchet serve`'s feeds and long polls read through, on their
        connections' threads: one whose store gives each thread a connection of its own
        (this one's, opened with `any_thread`, serves the app's one thread)."""
        readers = type(self).open(self.settings, create=False, clock=self.clock)
        try:
            yield readers
        finally:
            readers.close()

    def hooks(self, agents: AgentRegistry) -> Hooks:
        """The store's webhooks (`ratchet hook`, `POST /runs/{id}/hooks/{name}`), reached on
        `RATCHET_PUBLIC_URL` (`ratchet serve`'s)."""
        from ratchet.runtime.hooks import local_hooks

        return local_hooks(self, agents)

    @property
    def deliveries(self) -> SqliteDeliveries:
        """The webhooks' deliveries (`ratchet.runtime.webhooks`, `ratchet deliveries`)."""
        from ratchet.adapters.sqlite.deliveries import SqliteDeliveries

        return SqliteDeliveries(self.db, self.codec)

    @property
    def housekeeping(self) -> SqliteHousekeeping:
        """The store's side of `ratchet migrate` and `ratchet gc` (`ratchet.housekeeping`)."""
        from ratchet.adapters.sqlite.housekeeping import SqliteHousekeeping

        return SqliteHousekeeping(self.db, self.codec, blob_root=Path(f"{self.root}.blobs"))

    def reencrypt(self, *, dry_run: bool) -> Reencryption:
        """`ratchet migrate --reencrypt`: every sealed record, blob and outbox message of the
        store under the payload key's newest key (`ratchet.adapters.sqlite.reencrypt`)."""
        from ratchet.adapters.sqlite.reencrypt import reencrypt

        return reencrypt(
            self.db,
            Path(f"{self.root}.blobs"),
            self.resealing_codec(),
            outbox=Path(f"{self.root}.outbox"),
            dry_run=dry_run,
        )

    def resealing_codec(self) -> PayloadCodec:
        """The codec `reencrypt` seals under: refused in one line if there is none."""
        if self.codec is None:
            raise InvalidInput(
                "ratchet migrate --reencrypt seals under the payload key: set "
                "RATCHET_PAYLOAD_KEY (the keyring with the new key first)"
            )
        return self.codec

    @property
    def root(self) -> Path:
        return self.db.path.parent / self.db.path.stem

    def context(self, run_id: str, options: RunOptions) -> RunContext:
        return RunContext(
            run_id=run_id,
            options=options,
            # The runs' folders are private to the store's owner, as the store is.
            workdir=private_folder(Path(f"{self.root}.data")) / run_id,
            data=SqliteRunData(self.db, run_id, self.codec),
            secrets=EnvironmentSecrets(),
        )

    @property
    def blobs(self) -> FileBlobStore:
        return FileBlobStore(Path(f"{self.root}.blobs"), self.codec)

    @property
    def anthropic_configured(self) -> bool:
        return self.settings.anthropic_api_key is not None

    @property
    def daily_spend(self) -> DailySpend:
        """The agents' daily spend, one counter per agent and day for every worker here."""
        return SqliteDailySpend(self.db)

    @property
    def rate_limit(self) -> RateLimit:
        """The deployment's bound on model requests a minute, shared by every worker here."""
        return SqliteRateLimit(self.db)

    def before_prepare(self) -> None:
        """Take the store's write lock once before an agent's prepare hook writes a new run's
        data: a store another process holds refuses the start here, with nothing written."""
        with self.db.write():
            pass

    def check_agent(self, agent: Agent) -> None:
        """Every agent runs locally: the data folder beside the store lasts."""

    def check_model(self, model: str) -> None:
        """Locally a model is called with the person's own credentials: nothing to check."""

    def engine(self, *, worker_id: str, logger: Any, faults: FaultPlan = NO_FAULTS) -> Engine:
        engine = Engine(
            store=self.store,
            ledger=self.ledger,
            blobs=self.blobs,
            bind=self.bind,
            unbind=self._bindings.forget,
            worker_id=worker_id,
            logger=logger,
            faults=faults,
            clock=self.clock,
            rate=self.rate_limit,
            requests_per_minute=self.settings.requests_per_minute,
            # Every process working this store finds the store's calls under way there.
            call_locks=FileCallLocks(Path(f"{self.root}.calls")),
            daily_spend=self.daily_spend,
        )
        engine.attach_children(self.child_runs(engine, worker_id=worker_id, logger=logger))
        return engine

    def child_runs(self, engine: Engine, *, worker_id: str, logger: Any) -> ChildRunDesk:
        """The runs this store's runs start (`start_runs`): checked and created as `ratchet
        start` creates a run (any agent the CLI could start), their ends settled with
        `engine`, and cancelled with their parent through `cancel`."""
        from ratchet.client import Client

        agents = AgentRegistry.local()

        def check(request: RunRequest) -> RunState:
            return new_run(request, has_anthropic_key=self.anthropic_configured, agents=agents)

        def create(state: RunState) -> None:
            Client(self, agents=agents, worker_id=worker_id, logger=logger).create(state)

        def cancel(run_id: str, by: str, reason: str) -> RunState:
            return self.cancel(run_id, by=by, reason=reason, worker_id=worker_id, logger=logger)

        return ChildRunDesk(
            store=self.store,
            engine=engine,
            new_run=check,
            create=create,
            cancel=cancel,
            logger=logger,
            faults=engine.faults,
        )

    def bind(self, state: RunState) -> Binding:
        """The run's agent, model and opened resources, built once per process and run."""
        return self._bindings(state)

    @property
    def outbox(self) -> OutboxNotifier:
        """Every approval request's messages, as files beside the store."""
        # Imported here: the messages' templates are loaded by the runs that park for a
        # person, not by every command (`ratchet start` has none to write: bench/cli_start.py).
        from ratchet.adapters.outbox import OutboxNotifier

        return OutboxNotifier(Path(f"{self.root}.outbox"), self.codec)

    def _approval_opener(self, worker_id: str, logger: Any) -> Callable[[str], None]:
        """Opens the approval request of a run parked for a person, notifying who it names
        (another wait has no request: nothing to open)."""

        def open_request(run_id: str) -> None:
            head = self.store.load_head(run_id)
            if head is None or head.waiting is None or head.waiting.kind != "person":
                return
            desk = self.approval_desk(worker_id=worker_id, logger=logger)
            opened = desk.open(run_id, timeout_seconds=self.settings.approval_timeout_seconds)
            log_failures(opened.failures, run_id, logger)

        return open_request

    def approval_desk(self, *, worker_id: str, logger: Any) -> ApprovalDesk:
        """Approvals decided through signed links to `ratchet serve`, signed with a key kept
        beside the store (`<store>.approval-key`, made on first use, owner-only)."""
        from ratchet.approvals.desk import ApprovalDesk  # loaded by what opens or decides one

        return ApprovalDesk(
            book=self.approvals,
            resumer=LocalResumer(self.engine(worker_id=worker_id, logger=logger)),
            store=self.store,
            clock=self.clock,
            signer=LinkSigner(self.approval_key),
            public_url=self.public_url,
            # The outbox first, and always: whatever another channel does, the messages are
            # kept on this host and the worker prints the operator's link.
            notifiers=[self.outbox, *self.notifiers()],
            default_targets=NotifyTargets(
                email=list(self.settings.notify_emails),
                slack_channel=self.settings.notify_slack_channel,
            ),
            faults=FaultPlan.parse(self.settings.fault),
        )

    def notifiers(self) -> list[Notifier]:
        """The channels that reach people beyond this host, as on AWS: email through the SMTP
        server of `RATCHET_SMTP_URL`, and Slack with `RATCHET_SLACK_BOT_TOKEN`. Each failure is
        its own (`Opened.failures`): one channel down never keeps a message from another."""
        settings = self.settings
        channels: list[Notifier] = []
        if settings.smtp_url is not None and settings.email_sender is not None:
            from ratchet.adapters.smtp import SmtpNotifier, SmtpServer

            server = SmtpServer.from_url(settings.smtp_url.get_secret_value())
            channels.append(SmtpNotifier(server, sender=settings.email_sender))
        if settings.slack_bot_token is not None:
            from ratchet.adapters.slack import SlackNotifier

            channels.append(SlackNotifier(settings.slack_bot_token, api_url=settings.slack_api_url))
        return channels

    @property
    def schedules(self) -> SqliteScheduleBook:
        # Imported here: the schedules load croniter, which only the commands and workers that
        # read or fire schedules need (not `ratchet start` or `approve`: bench/cli_start.py).
        from ratchet.adapters.sqlite.schedules import SqliteScheduleBook

        return SqliteScheduleBook(self.db, self.codec)

    def schedule_firer(self, start: Starter, *, logger: Any) -> Callable[[datetime], Sequence[str]]:
        """What a worker calls to fire the store's due schedules, each run started by
        `start` (the client's own start path)."""
        from ratchet.schedules import fire_due

        book = self.schedules
        return lambda now: fire_due(book, start, now, logger=logger)

    def worker(
        self,
        *,
        worker_id: str,
        logger: Any,
        lease_seconds: float | None = None,
        on_park: Callable[[str], None] | None = None,
        on_step: Callable[[StepReport], None] | None = None,
        on_wait: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
    ) -> Worker:
        """`ratchet worker`'s worker on this store (and `ratchet serve`'s): it claims every
        runnable run, expires overdue approvals, settles due waits and fires due schedules,
        under the fault plan of `RATCHET_FAULT`. `stop` ends its loop after the current step."""
        from ratchet.worker import DEFAULT_LEASE_SECONDS, Worker

        engine = self.engine(
            worker_id=worker_id, logger=logger, faults=FaultPlan.parse(self.settings.fault)
        )
        return Worker(
            engine,
            self.leases,
            logger,
            lease_seconds=DEFAULT_LEASE_SECONDS if lease_seconds is None else lease_seconds,
            on_park=on_park,
            on_step=on_step,
            on_wait=on_wait,
            clock=self.clock,
            expire_approvals=self.approval_expiry(engine),
            deliver_decisions=self.decision_delivery(engine),
            settle_waits=self.wait_settler(engine),
            limits=self.limits(),
            fire_schedules=self.schedule_firer(
                self._schedule_starter(worker_id, logger), logger=logger
            ),
            stop=stop or threading.Event(),
            wake_ups=self.wake_ups(),
        )

    def wake_ups(self) -> WakeUps | None:
        """Where this store's idle workers wait for word of work: none on SQLite, whose
        workers look every `POLL_SECONDS` (a read of a local file costs little)."""
        return None

    def _schedule_starter(self, worker_id: str, logger: Any) -> Starter:
        """How a worker starts a schedule's fire: the client's own start path, so the run is
        checked and prepared as any other start."""
        from ratchet.client import Client

        client = Client(self, worker_id=worker_id, logger=logger, channel="cli")

        def start(run_id: str, spec: Any, _: Any) -> None:
            client.start(run_id=run_id, agent=spec.agent, input=spec.input)

        return start

    def limits(self) -> ConcurrencyLimits:
        """The bound on each agent's concurrent runs, for this process's workers."""
        return concurrency_limits(self.settings)

    def work(
        self,
        run_id: str,
        *,
        worker_id: str,
        logger: Any,
        faults: FaultPlan = NO_FAULTS,
        on_step: Callable[[StepReport], None] | None = None,
        on_wait: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
        lease_seconds: float | None = None,
        on_park: Callable[[str], None] | None = None,
    ) -> None:
        """Work the run in this process, as a worker holding its lease: until it is done,
        waiting or failed, or another worker holds it. `on_step`, `on_wait` and `on_park` are
        the worker's (`ratchet run` prints its progress through them); by default a run parked
        for a person has its approval request opened and its people notified, as a worker's
        would (a script's `client.run` asks someone too). `stop` ends the work after the
        current step (`ratchet.testing` sets it when it crashes a step on purpose), and
        `lease_seconds` is the lease's length (a process expected to die soon takes a short
        one, so the next process need not wait long for it to lapse)."""
        from ratchet.worker import DEFAULT_LEASE_SECONDS, Worker

        stop = stop or threading.Event()
        engine = self.engine(worker_id=worker_id, logger=logger, faults=faults)
        worker = Worker(
            engine,
            self.leases,
            logger,
            lease_seconds=DEFAULT_LEASE_SECONDS if lease_seconds is None else lease_seconds,
            stop=stop,
            clock=self.clock,
            on_step=on_step,
            on_wait=on_wait,
            on_park=on_park or self._approval_opener(worker_id, logger),
            expire_approvals=self.approval_expiry(engine),
            deliver_decisions=self.decision_delivery(engine),
            settle_waits=self.wait_settler(engine),
            limits=self.limits(),
        )
        while not stop.is_set():
            worker.run(until_idle=True, run_id=run_id)
            if run_id in worker.unloadable:
                raise worker.unloadable[run_id]
            # A run waiting for its children: work them here too, as `ratchet run` would be
            # expected to, until the run goes on (or one waits, for a person, say).
            head = self.store.load_head(run_id)
            waiting = head.waiting.request if head and head.waiting else None
            if head is None or head.status is not RunStatus.WAITING:
                return
            if not isinstance(waiting, ChildrenWait):
                return
            for child in waiting.children:
                self.work(
                    child,
                    worker_id=worker_id,
                    logger=logger,
                    faults=faults,
                    on_step=on_step,
                    on_wait=on_wait,
                    stop=stop,
                    lease_seconds=lease_seconds,
                    on_park=on_park,
                )
                head = self.store.load_head(run_id)
                if stop.is_set() or head is None or head.status is not RunStatus.WAITING:
                    break
            else:
                return  # worked every child, and the run still waits (a child waits)

    def event_desk(self, engine: Engine) -> EventDesk:
        """Events sent to runs (`ratchet send`, `ratchet serve`), settled with `engine`."""
        from ratchet.waiting.desk import EventDesk

        return EventDesk(
            store=self.store,
            mailbox=self.mailbox,
            blobs=self.blobs,
            engine=engine,
            events_of=declared_events,
            faults=FaultPlan.parse(self.settings.fault),
            clock=self.clock,
        )

    def wait_settler(self, engine: Engine) -> Callable[[datetime], list[str]]:
        """What a worker calls between claims (its `settle_waits`): settle the waits due by
        then (timers, event timeouts) and those whose event is in the mailbox; and every
        `CHILDREN_SWEEP_SECONDS`, the children waits whose children ended without telling
        (their process died between the end and the telling)."""
        desk, book = self.event_desk(engine), self.wait_book
        children = self.child_runs(engine, worker_id=engine.worker_id, logger=None)
        swept: list[datetime] = []

        def settle(now: datetime) -> list[str]:
            resumed = desk.settle_due(book, now)
            if not swept or (now - swept[0]).total_seconds() >= CHILDREN_SWEEP_SECONDS:
                swept[:] = [now]
                resumed += children.settle_open(book.children())
            return resumed

        return settle

    def approval_expiry(self, engine: Engine) -> Callable[[datetime], list[str]]:
        """What a worker calls to expire the requests nobody answered in time (its
        `expire_approvals`), recording each expiry with `engine`."""
        book = self.approvals
        return lambda now: expire_overdue(book, engine, now)

    def decision_delivery(self, engine: Engine) -> Callable[[datetime], list[str]]:
        """What a worker calls to record the decisions their deciders left undelivered (its
        `deliver_decisions`), with `engine`: those older than a live decider can take."""
        book, after = self.approvals, delivery_time(self.db.busy_timeout)
        return lambda now: deliver_undelivered(book, engine, now, after=after)

    def decide(
        self, run_id: str, verdict: Verdict, *, channel: str, worker_id: str, logger: Any
    ) -> None:
        """Through the run's open approval request, so its links and page show the decision;
        a run parked by a worker that died before opening one is decided directly."""
        from ratchet.approvals.desk import Decider

        engine = self.engine(
            worker_id=worker_id, logger=logger, faults=FaultPlan.parse(self.settings.fault)
        )
        decider = Decider(
            self.approvals, LocalResumer(engine), self.store, self.clock, faults=engine.faults
        )
        decider.decide_or_record(
            run_id,
            verdict,
            channel=channel,
            engine=engine,
        )

    def cancel(self, run_id: str, *, by: str, reason: str, worker_id: str, logger: Any) -> RunState:
        """Cancel the run (and, through its engine, the child runs it started that have not
        ended), then close its pending approval requests: a worker holding it finds it
        cancelled at its next commit (a stale version) and leaves it."""
        head = self.engine(worker_id=worker_id, logger=logger).cancel(run_id, by=by, reason=reason)
        self.approvals.close(run_id, head.step, ApprovalStatus.CLOSED, at=utcnow())
        return head

    def resume(self, run_id: str, *, logger: Any) -> None:
        """Nothing to start: no execution works a local run, and any worker takes a running
        one."""

    def close(self) -> None:
        self.db.close()
