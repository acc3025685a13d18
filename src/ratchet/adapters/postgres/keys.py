"""The keys every host of a Postgres store signs with, one row per key: the approval links'
key and the hooks' key. Kept in the database, not in a file on each host, so that a link a
worker on one host sends is verified by a `ratchet serve` on another, and a hook's URL made
on one host is taken on every other."""

from __future__ import annotations

from collections.abc import Callable

from ratchet.adapters.postgres.database import PostgresDatabase

APPROVAL_LINKS = "approval-links"
HOOKS = "hooks"


class PostgresKeys:
    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    def key(self, name: str, *, make: Callable[[], bytes]) -> bytes:
        """The key `name`, made by `make` on first use: every process of the store gets the
        same one, whichever made it."""
        with self._db.read() as tx:
            row = tx.execute("SELECT secret FROM signing_keys WHERE name = %s", (name,)).fetchone()
        if row is not None:
            return bytes(row[0])
        with self._db.write() as tx:
            # Insert-if-absent: of two processes making the key at once, the second's insert
            # waits for the first's transaction and does nothing, and it reads back the key
            # the first wrote (a new statement, which sees it committed), never its own.
            tx.execute(
                "INSERT INTO signing_keys (name, secret) VALUES (%s, %s) "
                "ON CONFLICT (name) DO NOTHING",
                (name, make()),
            )
            row = tx.execute("SELECT secret FROM signing_keys WHERE name = %s", (name,)).fetchone()
        assert row is not None, "inserted or found in this transaction"
        return bytes(row[0])
