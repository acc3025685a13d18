"""The webhooks of the local SQLite store: one row per hook id (`ratchet.ports.HookBook`)."""

from __future__ import annotations

from ratchet.adapters.sqlite.database import HOOKS_SCHEMA, SqliteDatabase
from ratchet.ports import Hook


class SqliteHookBook:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db
        if not db.read_only and not db.has_table("hooks"):
            # A store made before webhooks existed gets the table on first use.
            db.connection.executescript(HOOKS_SCHEMA)

    def add(self, hook: Hook) -> tuple[Hook, bool]:
        with self._db.write() as tx:
            # Insert-or-read under the write lock: of two processes making the same hook, the
            # second reads what the first wrote.
            row = tx.execute(
                "SELECT record FROM hooks WHERE hook_id = ?", (hook.hook_id,)
            ).fetchone()
            if row is not None:
                return Hook.model_validate_json(row[0]), False
            tx.execute(
                "INSERT INTO hooks (hook_id, run_id, name, record) VALUES (?, ?, ?, ?)",
                (hook.hook_id, hook.run_id, hook.name, hook.model_dump_json()),
            )
        return hook, True

    def get(self, hook_id: str) -> Hook | None:
        if not self._db.has_table("hooks"):
            return None
        row = self._db.connection.execute(
            "SELECT record FROM hooks WHERE hook_id = ?", (hook_id,)
        ).fetchone()
        return Hook.model_validate_json(row[0]) if row else None
