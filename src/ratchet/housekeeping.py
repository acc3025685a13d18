"""Housekeeping of a local store: `ratchet migrate` and `ratchet gc`.

`migrate` reads every stored head with its checkpoint records, upgrades it in memory
(`ratchet.migrations`) and, unless it is a dry run, rewrites the heads an older Ratchet wrote in
the current stored form (`ratchet.stored`: a lean head and its static part), each under the
version it read. A head that changed meanwhile is skipped, never overwritten.

`gc` is the local counterpart of the TTL on AWS. A finished run (done, failed, stopped,
cancelled) whose head is older than the retention keeps exactly what loading it reads: the
head, its static part, its first record (the state it was created with) and every record and
ledger entry from its window's first step on (`stored.window_start`). So it still loads, shows
and can be retried as before; only its older history goes. Running and waiting runs are never
touched. Blobs that no remaining head, record, ledger entry, approval or mailbox event
references are deleted, unless a write put them less than `BLOB_GRACE` ago (files beside a
SQLite store, rows of a Postgres one).

The backend (`ratchet.ports.HousekeepingStore`: for SQLite
`ratchet.adapters.sqlite.housekeeping.SqliteHousekeeping`, for Postgres
`ratchet.adapters.postgres.housekeeping.PostgresHousekeeping`) only reads and writes rows;
what to keep and what to rewrite is decided here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import ValidationError

from ratchet import stored
from ratchet.errors import UnsupportedSchema
from ratchet.ports import HousekeepingStore, StoredHead, StoredRecord
from ratchet.state import FINISHED, SCHEMA_VERSION, CheckpointEvent, RunState

BLOB_GRACE = timedelta(hours=1)
"""A blob younger than this is never deleted: a worker writes a step's blob before the
commit that references it, so a new, not yet referenced blob may be about to be."""


# --- reading a run as a worker would -----------------------------------------------------------


def schema_of(head: StoredHead) -> int | None:
    """The schema version the head was written with; None if its JSON does not parse."""
    try:
        parts = [json.loads(head.head)] + ([json.loads(head.static)] if head.static else [])
    except ValueError:
        return None
    merged: dict[str, Any] = {}
    for part in reversed(parts):
        if not isinstance(part, dict):
            return None
        merged.update(part)
    version = merged.get("schema_version", 1)
    return version if isinstance(version, int) else None


def read_run(head: StoredHead, records: Sequence[StoredRecord]) -> RunState:
    """The state a worker loads (upgraded in memory), after parsing every record. Raises
    `ValueError` (or `UnsupportedSchema`) naming the part that cannot be read."""
    return _load(head, head.head, head.static, records, _parsed(head.run_id, records))


def _parsed(run_id: str, records: Sequence[StoredRecord]) -> dict[int, CheckpointEvent]:
    """Every record's event, by version; `ValueError` naming the first that is damaged."""
    events = {}
    for record in records:
        try:
            if record.damage is not None:
                raise ValueError(record.damage)
            events[record.version] = stored.parse_event(
                record.event, run_id=run_id, step=record.step
            )
        except ValueError as error:
            detail = _brief(error)
            raise ValueError(f"its checkpoint {record.version} is damaged ({detail})") from None
    return events


def _load(
    head: StoredHead,
    text: str,
    static: str | None,
    records: Sequence[StoredRecord],
    events: Mapping[int, CheckpointEvent],
) -> RunState:
    if head.damage is not None:
        raise ValueError(f"its stored state is damaged ({head.damage})")
    bare = stored.load_head(text, static, version=head.version, attempts=head.attempts)
    return stored.with_window(bare, _window(bare, records, events))


def _window(
    bare: RunState, records: Sequence[StoredRecord], events: Mapping[int, CheckpointEvent]
) -> list[CheckpointEvent]:
    """The records a store's `load_head` reads back for the window, oldest first: newest
    first from the head's version down to the first record before the window."""
    if bare.step == 0:
        return []
    first = stored.window_start(bare)
    found: list[CheckpointEvent] = []
    for record in reversed(records):
        if record.version > bare.version:
            continue
        if record.step < first:
            break
        found.append(events[record.version])
    return found[::-1]


def _brief(error: Exception) -> str:
    """What is wrong, in one line, without quoting the stored text (pydantic would)."""
    if isinstance(error, ValidationError):
        first = error.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    return " ".join(str(error).split())[:200]


# --- migrate -----------------------------------------------------------------------------------

Outcome = Literal["current", "upgrade", "upgraded", "skipped", "kept", "unreadable"]


@dataclass(frozen=True)
class RunMigration:
    run_id: str
    from_version: int | None
    """The schema the head was written with; None when its JSON does not parse."""
    outcome: Outcome
    """current: nothing to do; upgrade: a dry run would rewrite it; upgraded: rewritten;
    skipped: it moved while migrating; kept: rewriting would lose part of it; unreadable."""
    reason: str | None = None


@dataclass(frozen=True)
class MigrationReport:
    dry_run: bool
    runs: list[RunMigration]
    schema_version: int = SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        return all(run.outcome not in ("unreadable", "kept", "skipped") for run in self.runs)

    def by_version(self) -> dict[str, dict[str, int]]:
        """Per schema version ("unknown" for a head that does not parse): runs per outcome."""
        counts: dict[str, dict[str, int]] = {}
        for run in sorted(self.runs, key=lambda r: (r.from_version is None, r.from_version or 0)):
            key = "unknown" if run.from_version is None else str(run.from_version)
            per = counts.setdefault(key, {"runs": 0})
            per["runs"] += 1
            per[run.outcome] = per.get(run.outcome, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "versions": self.by_version(),
            "runs": [asdict(run) for run in self.runs],
        }


def migrate(store: HousekeepingStore, *, dry_run: bool) -> MigrationReport:
    """Upgrade every head not in the current stored form (see the module's docstring)."""
    return MigrationReport(dry_run, [_migrate_one(store, head, dry_run) for head in store.heads()])


def _migrate_one(store: HousekeepingStore, head: StoredHead, dry_run: bool) -> RunMigration:
    from_version = schema_of(head)
    records = store.records(head.run_id)
    try:
        events = _parsed(head.run_id, records)
        state = _load(head, head.head, head.static, records, events)
    except (ValueError, TypeError, UnsupportedSchema) as error:
        return RunMigration(head.run_id, from_version, "unreadable", _brief(error))
    if from_version == SCHEMA_VERSION and head.static is not None:
        return RunMigration(head.run_id, from_version, "current")
    text = stored.head_json(state)
    static = stored.static_json(state) if head.static is None else None
    # A head stored whole (schema 2 and earlier) holds its window itself; the lean form reads
    # it back from the records. Rewrite only if the run then loads exactly as it does now.
    if _load(head, text, static or head.static, records, events) != state:
        return RunMigration(
            head.run_id,
            from_version,
            "kept",
            "its records do not hold its window: the current form would lose it",
        )
    if dry_run:
        return RunMigration(head.run_id, from_version, "upgrade")
    if not store.rewrite_head(head, text, static):
        return RunMigration(
            head.run_id,
            from_version,
            "skipped",
            f"it moved past version {head.version} meanwhile; run migrate again",
        )
    return RunMigration(head.run_id, from_version, "upgraded")


# --- gc ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunTrim:
    run_id: str
    status: str
    keep_from_step: int
    records: int
    ledger_entries: int


@dataclass
class GcReport:
    older_than_days: float
    dry_run: bool
    trimmed: list[RunTrim] = field(default_factory=list)
    live: int = 0
    """Running and waiting runs: never touched."""
    recent: int = 0
    """Finished runs inside the retention window."""
    skipped: list[str] = field(default_factory=list)
    """Runs that moved while gc ran (a retry, say): left as they are."""
    unreadable: dict[str, str] = field(default_factory=dict)
    blobs_deleted: int = 0
    blob_bytes_deleted: int = 0
    blobs_kept: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "older_than_days": self.older_than_days,
            "dry_run": self.dry_run,
            "runs_trimmed": len(self.trimmed),
            "records_deleted": sum(t.records for t in self.trimmed),
            "ledger_entries_deleted": sum(t.ledger_entries for t in self.trimmed),
            "blobs_deleted": self.blobs_deleted,
            "blob_bytes_deleted": self.blob_bytes_deleted,
            "blobs_kept": self.blobs_kept,
            "live_runs": self.live,
            "recent_runs": self.recent,
            "skipped": self.skipped,
            "unreadable": self.unreadable,
            "runs": [asdict(t) for t in self.trimmed],
        }


def collect_garbage(
    store: HousekeepingStore,
    *,
    older_than: timedelta,
    now: datetime,
    dry_run: bool,
) -> GcReport:
    """Trim finished runs older than `older_than` and delete unreferenced blobs (see the
    module's docstring)."""
    report = GcReport(older_than / timedelta(days=1), dry_run)
    cutoff = now - older_than
    trims: dict[str, int] = {}
    for head in store.heads():
        if head.status not in FINISHED:  # a StrEnum: its members are its values
            report.live += 1
            continue
        if head.updated_at >= cutoff:
            report.recent += 1
            continue
        try:
            state = read_run(head, store.records(head.run_id))
        except (ValueError, TypeError, UnsupportedSchema) as error:
            report.unreadable[head.run_id] = _brief(error)
            continue
        keep_from = stored.window_start(state)
        # Conditional on the version read: a run retried since (running again) is skipped.
        trimmed = store.trim_run(head, keep_from, dry_run=dry_run)
        if trimmed is None:
            report.skipped.append(head.run_id)
            continue
        trims[head.run_id] = keep_from
        if trimmed.records or trimmed.ledger_entries:
            report.trimmed.append(
                RunTrim(
                    head.run_id, head.status, keep_from, trimmed.records, trimmed.ledger_entries
                )
            )
    # A blob a worker wrote for a commit still to come is younger than BLOB_GRACE: only older
    # ones are weighed, and each is deleted only if no write has put it again since it was
    # read. Under the lock no commit adds a reference to an older one meanwhile (see
    # `HousekeepingStore.locked`). A dry run deletes nothing and takes no lock.
    with nullcontext() if dry_run else store.locked():
        referenced = store.blob_references(trims if dry_run else {})
        total = store.count_blobs()
        for blob in store.blobs(touched_before=now - BLOB_GRACE):
            if blob.address in referenced:
                continue
            if not dry_run and not store.delete_blob(blob):
                continue  # put again since it was read: in use anew
            report.blobs_deleted += 1
            report.blob_bytes_deleted += blob.size
        report.blobs_kept = max(total - report.blobs_deleted, 0)
    return report
