"""The local runtime on a Postgres store, for every command but the demo (and the client and
`ratchet serve`), with every part the store's workers share in the database.

`LocalRuntime` wired to the Postgres adapters (`ratchet.adapters.postgres`) in place of the
SQLite ones: checkpoints and heads, the ledger, leases, the mailbox and its book of waits,
approvals, webhooks' book, the webhook deliveries sent and owed, schedules, rate limits, each
run's data, and blobs (in the database, since workers on many hosts share nothing else), and
the approval links' and hooks' keys (sealed under the payload key, if there is one), so that a
link or a hook made on one host is taken by a `ratchet serve` on any other. What stays on this
host's disk is what a process keeps for itself: the outbox's messages, the locks of calls under
way, each run's working folder, and `ratchet serve`'s token and the address it listens at, under
`.ratchet/postgres/<database>` of the working directory (docs/postgres.md). What a host would
make for itself but every host must share is refused in one line: a webhooks' secret
(RATCHET_WEBHOOK_SECRET gives it) and a `local` payload keyring (`file:PATH` or `kms:` names
one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ratchet.adapters.postgres.approvals import PostgresApprovalBook
from ratchet.adapters.postgres.blobs import PostgresBlobStore
from ratchet.adapters.postgres.daily_spend import PostgresDailySpend
from ratchet.adapters.postgres.data import PostgresRunData
from ratchet.adapters.postgres.database import PostgresDatabase, PostgresUrl
from ratchet.adapters.postgres.keys import APPROVAL_LINKS, HOOKS, PostgresKeys
from ratchet.adapters.postgres.leases import PostgresLeases
from ratchet.adapters.postgres.ledger import PostgresLedger
from ratchet.adapters.postgres.rate import PostgresRateLimit
from ratchet.adapters.postgres.store import PostgresCheckpointStore, PostgresWaitBook
from ratchet.adapters.private import private_folder
from ratchet.adapters.secrets import EnvironmentSecrets
from ratchet.approvals.links import new_key
from ratchet.engine import Engine
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.local_approvals import deliver_undelivered, delivery_time
from ratchet.state import RunOptions, utcnow
from ratchet.tools import RunContext

if TYPE_CHECKING:
    from ratchet.adapters.postgres.deliveries import PostgresDeliveries
    from ratchet.adapters.postgres.hooks import PostgresHookBook
    from ratchet.adapters.postgres.housekeeping import PostgresHousekeeping
    from ratchet.adapters.postgres.mailbox import PostgresMailbox
    from ratchet.adapters.postgres.schedules import PostgresScheduleBook
    from ratchet.adapters.postgres.wakeups import PostgresWakeUps
    from ratchet.adapters.sqlite.reencrypt import Reencryption

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

        return PostgresScheduleBook(self.pg, self.codec)

    @property
    def blobs(self) -> PostgresBlobStore:  # type: ignore[override]
        return PostgresBlobStore(self.pg, self.codec)

    one_host = False  # workers on many hosts share the store

    def hook_key(self) -> bytes:
        """The store's hook key, in the database (sealed under the payload key, if there is
        one): every host derives the same hooks."""
        return PostgresKeys(self.pg, self.codec).key(HOOKS, make=new_key)

    def approval_key(self) -> bytes:
        """The store's approval link key, in the database: a link a worker on one host sends
        is verified by a `ratchet serve` on any other. Sealed under the payload key, if there
        is one, as the hook key is."""
        return PostgresKeys(self.pg, self.codec).key(APPROVAL_LINKS, make=new_key)

    @contextmanager
    def readers(self) -> Iterator[PostgresRuntime]:
        """This runtime itself: its pool gives every thread a connection of its own."""
        yield self

    @contextmanager
    def serving(self, url: str) -> Iterator[None]:
        # This host's folder of the store, which nothing may have made yet.
        private_folder(self.root.parent)
        with super().serving(url):
            yield

    def serve_token(self) -> str:
        # Made before serve says where it listens, maybe first on this host: in its folder
        # made owner-only, not one a token file's own would make at the umask's mode.
        private_folder(self.root.parent)
        return super().serve_token()

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
    def deliveries(self) -> PostgresDeliveries:  # type: ignore[override]
        from ratchet.adapters.postgres.deliveries import PostgresDeliveries

        return PostgresDeliveries(self.pg, self.codec)

    @property
    def housekeeping(self) -> PostgresHousekeeping:  # type: ignore[override]
        from ratchet.adapters.postgres.housekeeping import PostgresHousekeeping

        return PostgresHousekeeping(self.pg, self.codec)

    def reencrypt(self, *, dry_run: bool) -> Reencryption:
        """`ratchet migrate --reencrypt`: every sealed text and blob in the database, and every
        sealed message of this host's outbox, under the payload key's newest key
        (`ratchet.adapters.postgres.reencrypt`)."""
        from ratchet.adapters.postgres.reencrypt import reencrypt

        return reencrypt(
            self.pg,
            self.resealing_codec(),
            outbox=Path(f"{self.root}.outbox"),
            dry_run=dry_run,
        )
