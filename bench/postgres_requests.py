"""What this process's psycopg connections send to the Postgres server: statements, round trips
and transactions, counted by kind, for `bench.step_cost --compare-postgres`.

It wraps psycopg 3.3's own senders for the measurement only, and puts them back after: every
request to the server goes out through one of them.

- `BaseCursor._execute_send`: a statement (`execute`, and `Connection.execute`, which runs
  it on a cursor of its own);
- `BaseCursor._send_prepare` and `_send_query_prepared`: a statement psycopg prepares, once
  it has sent it `prepare_threshold` times on a connection, is sent as a prepare, answered on
  its own, and then executed; later uses send only the execute;
- `BaseConnection._exec_command`: the statements psycopg sends itself, as statements of their
  own: a transaction's BEGIN and COMMIT or ROLLBACK (`connection.transaction()` on an
  autocommit connection), and DEALLOCATE when its cache of prepared statements is full;
- `BasePipeline._enqueue_sync`: outside a pipeline each request waits for its answer, one
  round trip each; in a pipeline (`executemany`) requests are queued and go out together,
  one round trip a sync.

A transaction is a BEGIN, or a statement sent outside one (on an autocommit connection each
such statement is a transaction of its own). The wrapped names are psycopg's private ones: a
psycopg that renames them fails here, at `__enter__`, rather than counting nothing."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

_VERB = re.compile(rb"\s*(\w+)")
_TABLE_AFTER = re.compile(rb"\b(?:FROM|INTO|UPDATE)\s+(\w+)", re.IGNORECASE)


@dataclass(frozen=True)
class Requests:
    """What was sent over a span: requests by kind (`SELECT runs`, `BEGIN`, `prepare INSERT
    checkpoints`...), round trips and transactions."""

    by_kind: Counter[str] = field(default_factory=Counter)
    round_trips: int = 0
    transactions: int = 0

    @property
    def prepares(self) -> int:
        """Round trips that only prepared a statement: once a statement and connection."""
        return sum(n for kind, n in self.by_kind.items() if kind.startswith("prepare "))

    def __sub__(self, other: Requests) -> Requests:
        return Requests(
            self.by_kind - other.by_kind,
            self.round_trips - other.round_trips,
            self.transactions - other.transactions,
        )


class PostgresRequests:
    """Counts, while entered and not `paused`, what this process's psycopg connections send."""

    def __init__(self) -> None:
        self._by_kind: Counter[str] = Counter()
        self._round_trips = 0
        self._transactions = 0
        self._paused = False
        self._restore: list[tuple[type, str, Any]] = []

    def take(self) -> Requests:
        """What was sent so far; the difference of two takes is what a span sent."""
        return Requests(Counter(self._by_kind), self._round_trips, self._transactions)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """What the bench itself sends in between (reading the WAL position) is not counted."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def __enter__(self) -> PostgresRequests:
        from psycopg._connection_base import BaseConnection
        from psycopg._cursor_base import BaseCursor
        from psycopg._pipeline_base import BasePipeline
        from psycopg.pq import TransactionStatus

        idle = TransactionStatus.IDLE

        def connection_of(sender: Any) -> Any:
            return sender if isinstance(sender, BaseConnection) else sender._conn

        def statement(owner: type, method: str, query_at: int, prefix: str) -> Callable[..., Any]:
            original = getattr(owner, method)

            def counted(sender: Any, *args: Any, **kwargs: Any) -> Any:
                connection = connection_of(sender)
                if not self._paused:
                    query = args[query_at]
                    self._count(
                        prefix + _kind(_bytes_of(query, connection)),
                        pipelined=connection._pipeline is not None,
                        # Idle: not inside a transaction, so this statement starts one (a
                        # BEGIN), or is one of its own. A prepare is not a transaction.
                        starts=not prefix and connection.pgconn.transaction_status == idle,
                    )
                return original(sender, *args, **kwargs)

            return counted

        original_sync = BasePipeline._enqueue_sync

        def sync(pipeline: Any) -> None:
            if not self._paused:
                self._round_trips += 1
            original_sync(pipeline)

        patches: list[tuple[type, str, Callable[..., Any]]] = [
            (owner, method, statement(owner, method, query_at, prefix))
            for owner, method, query_at, prefix in (
                (BaseCursor, "_execute_send", 0, ""),
                (BaseCursor, "_send_prepare", 1, "prepare "),
                (BaseCursor, "_send_query_prepared", 1, ""),
                (BaseConnection, "_exec_command", 0, ""),
            )
        ]
        patches.append((BasePipeline, "_enqueue_sync", sync))
        for owner, method, replacement in patches:
            self._restore.append((owner, method, getattr(owner, method)))
            setattr(owner, method, replacement)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for owner, method, original in reversed(self._restore):
            setattr(owner, method, original)
        self._restore.clear()

    def _count(self, kind: str, *, pipelined: bool, starts: bool) -> None:
        self._by_kind[kind] += 1
        if not pipelined:
            self._round_trips += 1
        if starts:
            self._transactions += 1


def _bytes_of(query: Any, connection: Any) -> bytes:
    """The statement's text: a `PostgresQuery`'s, or a command's (bytes, str or `sql.SQL`)."""
    text = getattr(query, "query", query)
    if isinstance(text, bytes):
        return text
    if isinstance(text, str):
        return text.encode()
    return bytes(text.as_bytes(connection))


def _kind(text: bytes) -> str:
    """A statement's verb and the first table it names: `SELECT runs`, `INSERT checkpoints`,
    `BEGIN`."""
    verb = _VERB.match(text)
    table = _TABLE_AFTER.search(text)
    words = [verb.group(1).upper() if verb else b"?"]
    if table:
        words.append(table.group(1).lower())
    return " ".join(w.decode() for w in words)
