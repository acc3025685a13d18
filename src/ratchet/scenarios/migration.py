"""Demo scenario `migration`: copy a legacy table in batches, ask before dropping it, report.

Run it offline with the scripted policy below, or let Claude drive the same tools with
`--model <claude model>` and `ANTHROPIC_API_KEY` set.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ratchet.runs import MAX_BATCHES
from ratchet.scenarios.migration_data import (
    BATCH_SIZE,
    SOURCE_TABLE,
    TARGET_TABLE,
    Effect,
    MigrationData,
    SqliteMigrationData,
)
from ratchet.state import RunState, RunStatus
from ratchet.tools import (
    Agent,
    Decision,
    Done,
    ForkRefused,
    RunContext,
    StepView,
    ToolCall,
    ToolContext,
    ToolResult,
    ask_person,
    tool,
)

REPORT_TO = "data-team@example.com"
DEFAULT_BATCHES = 40


class MigrationInput(BaseModel):
    """What a migration run takes (`--param batches=N`, the API's `input`)."""

    model_config = ConfigDict(extra="forbid")

    batches: int = Field(
        default=DEFAULT_BATCHES, ge=1, le=MAX_BATCHES, description="1,000-row batches to copy."
    )


class InspectTable(BaseModel):
    table: Literal["legacy_orders", "orders"]


class CopyBatch(BaseModel):
    batch: int = Field(ge=1, description="1-based batch number; batch b holds ids of batch b.")


class RequestApproval(BaseModel):
    action: str = Field(min_length=1, max_length=500, description="What you want to do.")
    reason: str = Field(min_length=1, max_length=2000, description="Why it is safe now.")


class DropTable(BaseModel):
    table: Literal["legacy_orders"]


class SendEmail(BaseModel):
    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+$")
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=10_000)


def _data(ctx: ToolContext) -> MigrationData:
    data: MigrationData = ctx.resources
    return data


@tool()
def inspect_table(args: InspectTable, ctx: ToolContext) -> str:
    """Count the rows of a table (legacy_orders or orders) and the batches they make."""
    return _data(ctx).inspect(args.table)


@tool(side_effect=True)
def copy_batch(args: CopyBatch, ctx: ToolContext) -> str:
    """Copy one batch of 1,000 rows from legacy_orders into orders, in one transaction.
    Safe to retry: a batch applied under this step's key is not applied again."""
    return _data(ctx).copy_batch(args.batch, ctx.idempotency_key)


@tool()
def request_approval(args: RequestApproval, ctx: ToolContext) -> ToolResult:
    """Ask a person to approve a risky action. The run pauses until they decide; their
    answer becomes this step's result."""
    return ask_person(f"{args.action}. {args.reason}", action=args.action, reason=args.reason)


@tool(side_effect=True)
def drop_table(args: DropTable, ctx: ToolContext) -> str:
    """Drop legacy_orders. Irreversible: only after every batch is copied and a person
    approved it."""
    return _data(ctx).drop_source(ctx.idempotency_key)


@tool(side_effect=True)
def send_email(args: SendEmail, ctx: ToolContext) -> str:
    """Send an email (queued in the outbox). Sent at most once per step."""
    return _data(ctx).send_email(args.to, args.subject, args.body, ctx.idempotency_key)


def migration_policy(view: StepView) -> Decision:
    """The scripted model: a pure function of the bounded view, so it resumes from any
    checkpoint exactly as a model reading the step prompt would."""
    batches = int(view.params.get("batches", DEFAULT_BATCHES))
    if not view.messages:
        return ToolCall(name="inspect_table", arguments={"table": SOURCE_TABLE})
    last = view.messages[-1]
    match last.tool:
        case "inspect_table":
            return ToolCall(name="copy_batch", arguments={"batch": 1})
        case "copy_batch" if int(last.arguments["batch"]) < batches:
            return ToolCall(
                name="copy_batch", arguments={"batch": int(last.arguments["batch"]) + 1}
            )
        case "copy_batch":
            rows = batches * BATCH_SIZE
            return ToolCall(
                name="request_approval",
                arguments={
                    "action": f"Drop {SOURCE_TABLE}",
                    "reason": f"All {batches} batches ({rows:,} rows) are copied into "
                    f"{TARGET_TABLE}",
                },
            )
        case "request_approval" if (view.last_result or "").startswith("Approved"):
            return ToolCall(name="drop_table", arguments={"table": SOURCE_TABLE})
        case "request_approval" | "drop_table":
            dropped = last.tool == "drop_table"
            return ToolCall(name="send_email", arguments=_report(batches, dropped))
        case _:
            dropped = "drop_table" in view.digest or any(
                m.tool == "drop_table" for m in view.messages
            )
            outcome = "dropped" if dropped else "kept, since the drop was not approved"
            return Done(
                summary=f"Copied {batches * BATCH_SIZE:,} rows of {SOURCE_TABLE} into "
                f"{TARGET_TABLE} in {batches} batches; {SOURCE_TABLE} was {outcome}; "
                f"{REPORT_TO} has the report."
            )


def _report(batches: int, dropped: bool) -> dict[str, Any]:
    fate = "has been dropped" if dropped else "was kept (the drop was not approved)"
    return {
        "to": REPORT_TO,
        "subject": f"Migration of {SOURCE_TABLE} complete",
        "body": f"{batches * BATCH_SIZE:,} rows were copied into {TARGET_TABLE} in {batches} "
        f"batches. {SOURCE_TABLE} {fate}.",
    }


def open_data(ctx: RunContext, *, read_only: bool = False) -> MigrationData:
    """The run's app data: in the runtime's DynamoDB table when it offers one (on AWS, where
    a function's disk does not outlive it), else in a SQLite file beside the store (opened
    read only, creating nothing, for `verify`: a read changes nothing).

    The SQLite file is made and seeded here, when the run's first step opens it, not when the
    run starts (`prepare`): a start need not wait for the syncs of a file the worker makes
    anyway (7 ms of `ratchet start` on a quiet machine, 66 to 89 ms on a busy disk; issue 36).
    Seeding data already seeded changes nothing, so every later open only reads that it was."""
    services = ctx.services
    if _in_app_table(ctx):
        from ratchet.scenarios.migration_dynamodb import DynamoDbMigrationData

        return DynamoDbMigrationData(services["dynamodb"], services["app_table"], ctx.run_id)
    data = SqliteMigrationData(ctx.workdir / "app.db", read_only=read_only)
    if not read_only:
        data.seed(_batches(ctx))
    return data


def _in_app_table(ctx: RunContext) -> bool:
    return "dynamodb" in ctx.services and "app_table" in ctx.services


def _batches(ctx: RunContext) -> int:
    return int(ctx.options.params.get("batches", DEFAULT_BATCHES))


@contextmanager
def _opened(ctx: RunContext, *, read_only: bool = False) -> Iterator[MigrationData]:
    data = open_data(ctx, read_only=read_only)
    try:
        yield data
    finally:
        close = getattr(data, "close", None)
        if close is not None:
            close()


def prepare(ctx: RunContext) -> None:
    """Seeds the app table on AWS, where the run's start is the one write every later step
    can count on; a local run's SQLite data is seeded by its first step (`open_data`)."""
    if _in_app_table(ctx):
        with _opened(ctx) as data:
            data.seed(_batches(ctx))


def fork(source: RunContext, fork: RunContext, step: int) -> None:
    """The fork's data as the source's stood after `step`: seeded alike, then every effect
    the source's data holds from a step up to `step` applied again, in step order, under the
    key it was applied with. The source's later effects are left out: the fork decides those
    steps afresh, under keys of its own. Applying is at most once per key, so a fork whose
    rebuild was cut short is rebuilt by running this again."""
    with _opened(source) as data:
        carried = sorted(
            (e for e in data.effects() if _step_of(e.key) <= step), key=lambda e: _step_of(e.key)
        )
    unrecorded = next((e.key for e in carried if e.name is None or e.args is None), None)
    if unrecorded is not None:
        raise ForkRefused(
            f"run {source.run_id}'s data does not record what {unrecorded} did (it was applied "
            "by an older Ratchet): its effects cannot be carried into a fork"
        )
    with _opened(fork) as data:
        data.seed(_batches(fork))
        for effect in carried:
            _apply(data, effect)


def _step_of(key: str) -> int:
    """The step of an idempotency key, `<run_id>/step-<n>`: a fork carries its source's keys up
    to its fork point and takes its own after it, so step numbers never repeat in one data."""
    return int(key.rsplit("/step-", 1)[1])


def _apply(data: MigrationData, effect: Effect) -> None:
    args = effect.args or {}
    match effect.name:
        case "copy_batch":
            data.copy_batch(int(args["batch"]), effect.key)
        case "drop_source":
            data.drop_source(effect.key)
        case "send_email":
            data.send_email(args["to"], args["subject"], args["body"], effect.key)
        case _:
            raise ForkRefused(f"{effect.key} applied an unknown effect {effect.name!r}")


def verify(ctx: RunContext, state: RunState) -> dict[str, Any]:
    with _opened(ctx, read_only=True) as data:
        counts = data.counts()
    problems = []
    if counts.duplicate_rows:
        problems.append(f"{counts.duplicate_rows} rows were copied twice")
    if counts.emails_sent > 1:
        problems.append(f"{counts.emails_sent} report emails were sent")
    if state.status is RunStatus.DONE:
        if counts.missing_rows:
            problems.append(f"{counts.missing_rows} rows were never copied")
        if counts.emails_sent != 1:
            problems.append("the report email was not sent")
    return {
        "ok": not problems,
        "problems": problems,
        "status": state.status.value,
        "source_rows": counts.source_rows,
        "target_rows": counts.target_rows,
        "duplicate_rows": counts.duplicate_rows,
        "missing_rows": counts.missing_rows,
        "emails_sent": counts.emails_sent,
        "legacy_dropped": counts.legacy_dropped,
        "keys_delivered": counts.keys_delivered,
        "keys_applied": counts.keys_applied,
    }


agent = Agent(
    name="migration",
    goal=(
        "Migrate every row of legacy_orders ({batches} batches of 1,000 rows) into orders, one "
        "batch per step, never copying a batch twice. When all batches are copied, ask a person "
        "to approve dropping legacy_orders and drop it only if they approve. Finally email "
        f"{REPORT_TO} a short report of what was done."
    ),
    tools=[inspect_table, copy_batch, request_approval, drop_table, send_email],
    policy=migration_policy,
    input=MigrationInput,
    resources=open_data,
    prepare=prepare,
    verify=verify,
    fork=fork,
)
