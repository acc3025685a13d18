"""A run's own data (`RunData`) in a Postgres store: table `run_data`. Tools call it from the
agent's thread, hooks from the caller's, an abandoned attempt's thread maybe at once: each call
takes a connection of its own from the store's pool, so any thread may call."""

from __future__ import annotations

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.adapters.run_data import checked_key, checked_prefix, checked_value
from ratchet.sealing import PayloadCodec
from ratchet.stored import opened_value, sealed_value


class PostgresRunData:
    """`RunData` for one run (see `ratchet.ports.RunData` for the contract)."""

    def __init__(
        self, db: PostgresDatabase, run_id: str, codec: PayloadCodec | None = None
    ) -> None:
        self._db = db
        self._run_id = run_id
        self._codec = codec  # seals each value, bound to its run and key

    def get(self, key: str) -> str | None:
        checked_key(key)
        with self._db.read() as tx:
            row = tx.execute(
                "SELECT value FROM run_data WHERE run_id = %s AND key = %s",
                (self._run_id, key.encode()),
            ).fetchone()
        return None if row is None else self._opened(key, bytes(row[0]).decode())

    def put(self, key: str, value: str) -> None:
        checked_key(key)
        checked_value(value)
        with self._db.write() as tx:
            tx.execute(
                "INSERT INTO run_data (run_id, key, value) VALUES (%s, %s, %s) "
                "ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
                (self._run_id, key.encode(), self._sealed(key, value)),
            )

    def put_once(self, key: str, value: str) -> bool:
        checked_key(key)
        checked_value(value)
        with self._db.write() as tx:
            # Insert-if-absent: of two writers of one key (a step retried while its first
            # attempt still runs, here or on another machine), the second's insert waits for
            # the first's transaction, then changes nothing and is told so.
            inserted = tx.execute(
                "INSERT INTO run_data (run_id, key, value) VALUES (%s, %s, %s) "
                "ON CONFLICT (run_id, key) DO NOTHING",
                (self._run_id, key.encode(), self._sealed(key, value)),
            ).rowcount
        return bool(inserted)

    def delete(self, key: str) -> None:
        checked_key(key)
        with self._db.write() as tx:
            tx.execute(
                "DELETE FROM run_data WHERE run_id = %s AND key = %s", (self._run_id, key.encode())
            )

    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        checked_prefix(prefix)
        # Keys are UTF-8 bytes, in byte order: the order of Python's str. The keys with the
        # prefix are one range of the primary key's index, from the prefix up to the prefix
        # and a byte 0xFF, which no UTF-8 text holds.
        start = prefix.encode()
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT key, value FROM run_data WHERE run_id = %s AND key >= %s AND key < %s "
                "ORDER BY key",
                (self._run_id, start, start + b"\xff"),
            ).fetchall()
        found = []
        for raw_key, value in rows:
            key = bytes(raw_key).decode()
            found.append((key, self._opened(key, bytes(value).decode())))
        return found

    def _sealed(self, key: str, value: str) -> bytes:
        return sealed_value(value, self._codec, part=f"data:{key}", run_id=self._run_id).encode()

    def _opened(self, key: str, value: str) -> str:
        return opened_value(value, self._codec, part=f"data:{key}", run_id=self._run_id)
