"""Work on the local store itself: `migrate` every head to the current state schema, and `gc`
what finished runs no longer need."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

import typer

from ratchet.cli.context import (
    open_runtime,
    out,
    print_json,
    require_local_store,
    say,
    settings,
)
from ratchet.cli.options import JsonOption
from ratchet.errors import InvalidInput

DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Report what would change; change nothing.")
]


ReencryptOption = Annotated[
    bool,
    typer.Option(
        "--reencrypt",
        help="Rewrite every sealed record and blob under the newest payload key "
        "(RATCHET_PAYLOAD_KEY), sealing those written in clear, so old keys can be removed.",
    ),
]


BucketOption = Annotated[
    str | None,
    typer.Option(
        "--bucket",
        envvar="RATCHET_BLOB_BUCKET",
        metavar="NAME",
        help="With --reencrypt on a dynamodb:// store: the stack's blob bucket (its BlobBucket "
        "output), whose blobs are rewritten too.",
        show_default=False,
    ),
]


def migrate(
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
    reencrypt: ReencryptOption = False,
    bucket: BucketOption = None,
) -> None:
    """Upgrade every stored head to the current state schema, each under its version check,
    and report per schema version. Exit 1 if a run cannot be read or upgraded. On a deployed
    stack's tables (--store dynamodb://...): index the runs written before the runs index.
    With --reencrypt: rewrite every sealed record and blob under the newest payload key."""
    # The run models (see ratchet.cli.context).
    from ratchet.housekeeping import migrate as migrate_heads
    from ratchet.store_urls import DYNAMODB_SCHEME

    if reencrypt:
        _reencrypt(dry_run=dry_run, as_json=as_json, bucket=bucket)
        return
    if settings().store.startswith(DYNAMODB_SCHEME):
        _index_unlisted(dry_run=dry_run, as_json=as_json)
        return
    runtime = _local_store("migrate", write=not dry_run)
    try:
        schema = _store_schema(runtime, dry_run=dry_run)
        report = migrate_heads(runtime.housekeeping, dry_run=dry_run)
    finally:
        runtime.close()
    if as_json:
        print_json(report.to_json() | ({"store_schema": schema[0]} if schema else {}))
    else:
        if schema:
            out.print(schema[1], markup=False)
        verb = "would upgrade" if dry_run else "upgraded"
        done = {"upgrade", "upgraded"}
        count = sum(run.outcome in done for run in report.runs)
        note = " (dry run: nothing changed)" if dry_run else ""
        out.print(
            f"{verb} {count} of {len(report.runs)} runs to schema {report.schema_version}{note}"
        )
        for version, outcomes in report.by_version().items():
            counts = ", ".join(f"{n} {name}" for name, n in outcomes.items() if name != "runs")
            out.print(f"  schema {version}: {outcomes['runs']} runs: {counts}")
        for run in report.runs:
            if run.outcome != "current":
                line = f"  {run.run_id}  schema {run.from_version or '?'}  {run.outcome}"
                say(line + (f"  {run.reason}" if run.reason else ""))
    if not report.ok:
        raise typer.Exit(1)


def gc(
    older_than: Annotated[
        int | None,
        typer.Option(
            "--older-than",
            min=0,
            max=36_500,
            metavar="DAYS",
            help="Required. Trim finished runs whose last change is older than this many days.",
            show_default=False,
        ),
    ] = None,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Delete the old step records and ledger entries of finished runs past the retention, and
    blobs nothing references. Running and waiting runs are never touched; a finished run keeps
    what loading it reads (its head and its window's records)."""
    # The run models (see ratchet.cli.context).
    from ratchet.housekeeping import collect_garbage
    from ratchet.state import utcnow

    if older_than is None:
        raise InvalidInput("ratchet gc needs --older-than DAYS (see: ratchet gc --help)")
    runtime = _local_store("gc", write=not dry_run)
    try:
        report = collect_garbage(
            runtime.housekeeping,
            older_than=timedelta(days=older_than),
            now=utcnow(),
            dry_run=dry_run,
        )
    finally:
        runtime.close()
    payload = report.to_json()
    if as_json:
        print_json(payload)
        return
    verb = "would delete" if dry_run else "deleted"
    out.print(
        f"{verb} {payload['records_deleted']} records and {payload['ledger_entries_deleted']} "
        f"ledger entries of {payload['runs_trimmed']} finished runs older than {older_than} "
        f"days, and {payload['blobs_deleted']} blobs ({payload['blob_bytes_deleted']:,} bytes)"
    )
    out.print(
        f"kept {payload['blobs_kept']} blobs; left {payload['live_runs']} running or waiting "
        f"runs and {payload['recent_runs']} recent finished runs untouched"
    )
    for run_id in report.skipped:
        out.print(f"  {run_id}  skipped: it changed while gc ran", markup=False)
    for run_id, reason in report.unreadable.items():
        say(f"  {run_id}  unreadable, left as it is: {reason}")


def _reencrypt(*, dry_run: bool, as_json: bool, bucket: str | None) -> None:
    """`migrate --reencrypt`: every sealed text and blob of a local or Postgres store, or every
    sealed attribute and blob of a deployed stack's tables and bucket, under the newest payload
    key (`LocalRuntime.reencrypt`, `PostgresRuntime.reencrypt`, `AwsRuntime.reencrypt`); one
    report for all."""
    from ratchet.store_urls import DYNAMODB_SCHEME

    if settings().store.startswith(DYNAMODB_SCHEME):
        runtime = open_runtime(create=False)
        try:
            report = runtime.reencrypt(dry_run=dry_run, bucket=bucket)
        finally:
            runtime.close()
    else:
        runtime = _local_store("migrate", write=not dry_run)
        try:
            report = runtime.reencrypt(dry_run=dry_run)
        finally:
            runtime.close()
    if as_json:
        print_json(report.to_json())
    else:
        verb = "would rewrite" if dry_run else "rewrote"
        note = " (dry run: nothing changed)" if dry_run else ""
        resealed, sealed = sum(report.resealed.values()), sum(report.sealed.values())
        out.print(
            f"{verb} {_count(report.records, 'record')} and {_count(report.blobs, 'blob')} "
            f"under key {report.key_id}{note}",
            markup=False,
        )
        out.print(
            f"  records: {resealed} sealed with an older key, {sealed} written in clear; "
            f"{report.current} already under it",
            markup=False,
        )
        out.print(
            f"  blobs: {report.blobs_resealed} sealed with an older key, {report.blobs_sealed} "
            f"written in clear; {report.blobs_current} already under it",
            markup=False,
        )
        if report.outbox_resealed:
            messages = _count(report.outbox_resealed, "message")
            out.print(f"  outbox: {messages} sealed with an older key")
        if report.moved:
            records = _count(report.moved, "record")
            say(f"  {records} changed while it ran: run it again to finish")
        for where in report.unreadable:
            say(f"  {where}  fails its authentication: left as it is")
    if report.unreadable or report.moved:
        raise typer.Exit(1)


def _count(count: int, noun: str) -> str:
    """`1 record`, `2 records`: a count and its noun, singular for one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _index_unlisted(*, dry_run: bool, as_json: bool) -> None:
    """`migrate` on a deployed stack's tables: give the runs index the heads written before it
    existed (`ratchet list` and `GET /runs` read only the index)."""
    runtime = open_runtime(create=False)
    try:
        count = runtime.store.index_unlisted(dry_run=dry_run)
    finally:
        runtime.close()
    if as_json:
        print_json({"indexed": 0 if dry_run else count, "unlisted": count, "dry_run": dry_run})
        return
    verb = "would index" if dry_run else "indexed"
    note = " (dry run: nothing changed)" if dry_run else ""
    out.print(f"{verb} {count} runs written before the runs index{note}")


def _store_schema(runtime: Any, *, dry_run: bool) -> tuple[dict[str, Any], str] | None:
    """On a Postgres store, its own schema as `migrate` found and left it (opening it to write
    upgraded it: `ratchet.adapters.postgres.database`), for the report and in one line; None
    on SQLite, whose tables a write adds as it opens, with nothing to report."""
    from ratchet.store_urls import POSTGRES_SCHEMES

    if not settings().store.startswith(POSTGRES_SCHEMES):
        return None
    found, upgraded_from = runtime.pg.found_version, runtime.pg.upgraded_from
    current = runtime.pg.schema_version
    if dry_run and found is not None and found < current:
        line = (
            f"would upgrade the Postgres store's schema from {found} to {current} "
            "(dry run: nothing changed)"
        )
        found_version = found
    elif upgraded_from is not None:
        line = f"upgraded the Postgres store's schema from {upgraded_from} to {current}"
        found_version = upgraded_from
    else:
        line = f"the Postgres store's schema is current ({current})"
        found_version = current
    payload = {
        "from": found_version,
        "to": current,
        "upgraded": upgraded_from is not None,
    }
    return payload, line


def _local_store(command: str, *, write: bool) -> Any:
    """The local runtime of a command that works on the store itself. A missing store is an
    error, never made here; one an older Ratchet made gets today's tables before a write."""
    require_local_store(command)
    runtime = open_runtime(create=False)
    if write:
        runtime.close()
        runtime = open_runtime(create=True)
    return runtime
