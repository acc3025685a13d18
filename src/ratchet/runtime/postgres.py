"""The local runtime on a Postgres store: `ratchet worker`, `run`, `start` and the commands
that read and decide runs, with every part the store's workers share in the database.

`LocalRuntime` wired to the Postgres adapters (`ratchet.adapters.postgres`) in place of the
SQLite ones: checkpoints and heads, the ledger, leases, the mailbox and its book of waits,
approvals, webhooks' book, schedules, rate limits, each run's data, and blobs (in the
database, since workers on many hosts share nothing else). What stays on this host's disk is
what a process keeps for itself: the approval and hook keys, the outbox's messages, the
locks of calls under way and each run's working folder, under `.ratchet/postgres/<database>`
of the working directory (docs/postgres.md). Webhook deliveries (`ratchet deliveries`) and
`ratchet migrate --reencrypt` are not built on Postgres yet: they say so in one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ratchet.adapters.postgres.approvals import PostgresApprovalBook
from ratchet.adapters.postgres.blobs import PostgresBlobStore
from ratchet.adapters.postgres.daily_spend import PostgresDailySpend
from ratchet.adapters.postgres.data import PostgresRunData
from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl
from ratchet.adapters.postgres.leases import PostgresLeases
from ratchet.adapters.postgres.ledger import PostgresLedger
from ratchet.adapters.postgres.rate import PostgresRateLimit
from ratchet.adapters.postgres.store import PostgresCheckpointStore, PostgresWaitBook
from ratchet.adapters.private import private_folder
from ratchet.adapters.secrets import EnvironmentSecrets
from ratchet.engine import Engine
from ratchet.errors import StoreUnavailable
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.local_approvals import deliver_undelivered, delivery_time
from ratchet.state import RunOptions, utcnow
from ratchet.tools import RunContext

if TYPE_CHECKING:
    from ratchet.adapters.postgres.hooks import PostgresHookBook
    from ratchet.adapters.postgres.housekeeping import PostgresHousekeeping
    from ratchet.adapters.postgres.mailbox import PostgresMailbox
    from ratchet.adapters.postgres.schedules import PostgresScheduleBook
    from ratchet.adapters.postgres.wakeups import PostgresWakeUps

_FOLDER_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def files_folder(url: PostgresUrl) -> Path:
    """Where this host keeps what a Postgres store's processes keep on disk: one folder per
    host and database, in the working directory's `.ratchet`, as a local store's files are."""
    return Path(".ratchet") / "postgres" / _FOLDER_NAME.sub("_", url.where)


@dataclass
class PostgresRuntime(LocalRuntime):
    """`LocalRuntime` whose store is a Postgres database (`db`, a `PostgresDatabase`)."""

    @classmethod
    def open(
        cls,
        settings: LocalSettings,
        *,
        create: bool = True,
        any_thread: bool = False,
        clock: Callable[[], datetime] = utcnow,
    ) -> PostgresRuntime:
        """Every thread may use the store's pool: `any_thread` changes nothing here."""
        database = PostgresDatabase(PostgresUrl.parse(settings.store), create=create)
        return cls(database, settings, clock)  # type: ignore[arg-type]

    @property
    def pg(self) -> PostgresDatabase:
        assert isinstance(self.db, PostgresDatabase)
        return self.db

    @property
    def root(self) -> Path:
        return files_folder(self.pg.url) / "ratchet"

    @property
    def store(self) -> PostgresCheckpointStore:  # type: ignore[override]
        return PostgresCheckpointStore(self.pg, self.codec)

    @property
    def ledger(self) -> PostgresLedger:  # type: ignore[override]
        return PostgresLedger(self.pg, codec=self.codec)

    @property
    def leases(self) -> PostgresLeases:  # type: ignore[override]
        return PostgresLeases(self.pg)

    @property
    def approvals(self) -> PostgresApprovalBook:  # type: ignore[override]
        return PostgresApprovalBook(self.pg, self.codec)

    @property
    def mailbox(self) -> PostgresMailbox:  # type: ignore[override]
        from ratchet.adapters.postgres.mailbox import PostgresMailbox

        return PostgresMailbox(self.pg, self.codec)

    @property
    def wait_book(self) -> PostgresWaitBook:  # type: ignore[override]
        return PostgresWaitBook(self.pg)

    @property
    def hook_book(self) -> PostgresHookBook:  # type: ignore[override]
        from ratchet.adapters.postgres.hooks import PostgresHookBook

        return PostgresHookBook(self.pg)

    @property
    def schedules(self) -> PostgresScheduleBook:  # type: ignore[override]
        from ratchet.adapters.postgres.schedules import PostgresScheduleBook

        # Its schedules' inputs are not sealed yet (docs/postgres.md), unlike SQLite's.
        return PostgresScheduleBook(self.pg)

    @property
    def blobs(self) -> PostgresBlobStore:  # type: ignore[override]
        return PostgresBlobStore(self.pg, self.codec)

    def context(self, run_id: str, options: RunOptions) -> RunContext:
        return RunContext(
            run_id=run_id,
            options=options,
            workdir=private_folder(Path(f"{self.root}.data")) / run_id,
            data=PostgresRunData(self.pg, run_id, self.codec),
            secrets=EnvironmentSecrets(),
        )

    def before_prepare(self) -> None:
        """Nothing to take: a Postgres store has no store-wide write lock, and a start that
        another start beats is refused by the run's own row."""

    @property
    def daily_spend(self) -> PostgresDailySpend:
        return PostgresDailySpend(self.pg)

    @property
    def rate_limit(self) -> PostgresRateLimit:
        return PostgresRateLimit(self.pg)

    def decision_delivery(self, engine: Engine) -> Callable[[datetime], list[str]]:
        # A decider on Postgres waits on rows, not on a store-wide lock: it is given as long
        # as a command waits on a busy store before a worker delivers what it left.
        book, after = self.approvals, delivery_time(self.settings.busy_timeout_seconds)
        return lambda now: deliver_undelivered(book, engine, now, after=after)

    def wake_ups(self) -> PostgresWakeUps:
        """A worker's own listening connection: told of new work by `NOTIFY`, it polls only
        as a fallback (`ratchet.adapters.postgres.wakeups`)."""
        from ratchet.adapters.postgres.wakeups import PostgresWakeUps

        return PostgresWakeUps(self.pg, clock=self.clock)

    @property
    def deliveries(self) -> NoReturn:
        _not_yet("webhook deliveries (RATCHET_WEBHOOKS, ratchet deliveries)")

    @property
    def housekeeping(self) -> PostgresHousekeeping:  # type: ignore[override]
        from ratchet.adapters.postgres.housekeeping import PostgresHousekeeping

        return PostgresHousekeeping(self.pg, self.codec)

    def reencrypt(self, *, dry_run: bool) -> NoReturn:
        _not_yet("ratchet migrate --reencrypt")


def _not_yet(what: str) -> NoReturn:
    raise StoreUnavailable(
        f"{what}: not built on a postgresql:// store yet (docs/postgres.md); use a sqlite:// "
        "store for this meanwhile"
    )
