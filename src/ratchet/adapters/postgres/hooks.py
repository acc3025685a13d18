"""The webhooks of a Postgres store: one row per hook id (`ratchet.ports.HookBook`)."""

from __future__ import annotations

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.ports import Hook


class PostgresHookBook:
    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    def add(self, hook: Hook) -> tuple[Hook, bool]:
        with self._db.write() as tx:
            # Insert-if-absent: of two processes making the same hook, the second's insert
            # waits for the first's transaction and does nothing; it reads back what the
            # first wrote (a new statement, which sees it committed).
            inserted = tx.execute(
                "INSERT INTO hooks (hook_id, run_id, name, record) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (hook_id) DO NOTHING",
                (hook.hook_id, hook.run_id, hook.name, hook.model_dump_json()),
            ).rowcount
            if inserted:
                return hook, True
            row = tx.execute(
                "SELECT record FROM hooks WHERE hook_id = %s", (hook.hook_id,)
            ).fetchone()
        assert row is not None
        return Hook.model_validate_json(row[0]), False

    def get(self, hook_id: str) -> Hook | None:
        with self._db.read() as tx:
            row = tx.execute("SELECT record FROM hooks WHERE hook_id = %s", (hook_id,)).fetchone()
        return Hook.model_validate_json(row[0]) if row else None
