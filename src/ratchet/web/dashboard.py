"""The runs dashboard of `ratchet serve`: server-rendered pages that only read.

    GET /dashboard?status=                        runs by status, most recently updated first
    GET /dashboard/runs/{run_id}                  the run's timeline, its charts, what it
                                                  waits for (a pending approval's link, an
                                                  event, a time), its webhook deliveries
    GET /dashboard/runs/{run_id}/steps/{step}     the state as of that step
    GET /dashboard/runs/{run_id}/steps/{step}/prompt   the prompt that step's model saw

Served by `ratchet serve` on localhost, on a local store or on a deployed stack's tables
(`deployed_app`: read with the caller's AWS credentials, under a banner naming the stack and
account); the deployed stack has no such route. No GET writes anything, so a pending approval
is not opened here: on a local store its link is the operator's own signed link to the
approval page, which alone decides; on a deployed stack the page names the stack's own
approval route and signs nothing. Everything that comes from a run (its
id, tool calls, results, errors, comments) is untrusted and escaped. The charts are SVG
written here; the pages carry no script.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Literal, Protocol
from urllib.parse import quote, urlencode

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware

from ratchet.approvals import pages
from ratchet.approvals.desk import ApprovalDesk
from ratchet.client import (
    MAX_PAGE_RUNS,
    Checkpoint,
    CheckpointsExpired,
    Client,
    NoCheckpointAtStep,
    Recent,
    Run,
    RunListed,
)
from ratchet.errors import InvalidInput, RunNotFound, RunUnreadable, UnsupportedSchema
from ratchet.ports import ApprovalBook, Mailbox
from ratchet.state import RunState, RunStatus, utcnow
from ratchet.summary import (
    UNRECORDED_VERSIONS,
    argument_summary,
    budget_of,
    budget_text,
    interleaved,
    only_counted,
    shorten,
    version_gaps,
    version_span,
)
from ratchet.waits import Approval, ApprovalStatus
from ratchet.web.outages import Outage, answer_outages, outage_words

RESULT_PREVIEW_CHARS = 160
ARGUMENT_CHARS = 80
RUNS_PER_PAGE = MAX_PAGE_RUNS
"""The runs page shows this many, most recently changed first, and links to the next page."""
MAX_TIMELINE_ROWS = 500
"""A run's page reads and lists its most recent checkpoints, this many (one bounded read of the
store, whatever the run's length); `ratchet history` has them all."""
MAX_DELIVERY_ROWS = 50
"""A run's page lists its latest webhook deliveries, this many; `ratchet deliveries RUN --limit
N` has more."""
MAX_CHART_POINTS = 220
"""A chart draws at most this many bars or dots (2 pixels each); a longer run's are bucketed,
each showing the largest value of its steps."""


@dataclass(frozen=True)
class Deployed:
    """A deployed stack whose tables the dashboard reads from this machine."""

    stack: str | None
    """The CloudFormation stack the tables belong to; None if the caller may not read their
    tags."""
    account: str
    region: str
    table: str
    book: ApprovalBook
    """The stack's approval requests, read (the dashboard never decides)."""
    api_url: str | None = None
    """The stack's API (its public URL), to name its routes in full; None: named by path."""

    def approve_route(self, run_id: str) -> str:
        path = f"/runs/{quote(run_id, safe='')}/approve"
        return f"{self.api_url.rstrip('/')}{path}" if self.api_url else path


class DeliveryRecord(Protocol):
    """A webhook delivery as the store keeps it (`ratchet deliveries` prints the same)."""

    @property
    def delivery_id(self) -> str: ...
    @property
    def change_id(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def body(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def next_at(self) -> float: ...
    @property
    def answered_at(self) -> float | None: ...
    @property
    def last_error(self) -> str | None: ...


@dataclass(frozen=True)
class DashboardServices:
    """What the pages read: the runs through a client, and the approval desk, which signs the
    operator's link to a pending approval's page (it opens nothing); on a deployed stack's
    tables no desk, and the stack they belong to."""

    client: Client
    desk: ApprovalDesk | None
    operator: str
    mailbox: Mailbox | None = None
    """The runs' mailboxes, to count the events a waiting run has not taken yet."""
    deployed: Deployed | None = None
    deliveries: Callable[[str], Sequence[DeliveryRecord]] | None = None
    """A run's latest webhook deliveries, newest first (a local store's); None: none kept."""


# --- what the pages show ---------------------------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    run_id: str
    agent: str
    status: RunStatus | Literal["damaged"]
    step: int
    updated_at: datetime
    damage: str | None = None
    """Why the run cannot be read, for a damaged run."""


@dataclass(frozen=True)
class PendingApproval:
    step: int
    prompt: str
    expires_at: datetime
    link: str | None
    """The operator's signed link to the approval page; None once the request has expired,
    and on a deployed stack (`on_stack`)."""
    on_stack: str | None = None
    """A deployed stack's run: the stack's own route that decides it (its runs API's
    approve), for a caller with the stack's rights; the dashboard signs no link."""


@dataclass(frozen=True)
class Timeline:
    run: Run
    checkpoints: Sequence[Checkpoint]
    attempts: Mapping[int, int]
    """The attempt each step record's step was committed on, by checkpoint version."""
    gaps: Sequence[tuple[int, int]]
    """Versions with no checkpoint record (attempts counted at the next step)."""
    approvals: Sequence[Approval]
    pending: PendingApproval | None
    waits_without_request: bool = False
    """The run waits for a person but no request is open (its worker died before opening
    one)."""
    mailbox_pending: int | None = None
    """Events in the run's mailbox that no wait has taken, while it waits for an event or a
    time (None: not counted)."""
    children: Sequence[Run] = ()
    """The child runs its steps started (`start_runs`), where each stands now."""
    total: int | None = None
    """The run's checkpoint versions in all (its head's version), of which `checkpoints` are
    the newest; None: `checkpoints` are all of them."""
    on_stack: bool = False
    """Read from a deployed stack's tables: what settles a wait goes through the stack's API."""
    deliveries: Sequence[DeliveryRecord] | None = None
    """The run's latest webhook deliveries, newest first; None: the store keeps none (a
    deployed stack's changes go to EventBridge)."""


@dataclass(frozen=True)
class Point:
    x: int
    y: float
    last: int | None = None
    """For a bucket of points (a long run's chart): its last x; `y` is the largest value."""

    def described(self, x_label: str, y_label: str) -> str:
        if self.last is None:
            return f"{x_label} {self.x}: {_number(self.y)} {y_label}"
        return f"{x_label} {self.x}-{self.last}: up to {_number(self.y)} {y_label}"


# --- the app ---------------------------------------------------------------------------------


def build_app(services: Callable[[], DashboardServices]) -> APIGatewayRestResolver:
    app = APIGatewayRestResolver()
    routes = DashboardRoutes(app, services)
    app.get("/dashboard")(routes.runs)
    app.get("/dashboard/runs/<run_id>")(routes.run)
    app.get("/dashboard/runs/<run_id>/steps/<step>")(routes.state)
    app.get("/dashboard/runs/<run_id>/steps/<step>/prompt")(routes.prompt)
    app.exception_handler([RunUnreadable, UnsupportedSchema])(routes.damaged)
    # A page read when the store was out of reach is read once more, then answered 503.
    answer_outages(app, "the dashboard", routes.outage, lambda: None)
    return app


class DashboardRoutes:
    """The dashboard's pages: each reads the request from `app` and the runs through the
    services (`build_app` registers them)."""

    def __init__(
        self, app: APIGatewayRestResolver, services: Callable[[], DashboardServices]
    ) -> None:
        self.app = app
        self.services = services

    def damaged(self, error: RunUnreadable | UnsupportedSchema) -> Response[str]:
        # A run's page whose stored row cannot be read: the store's fault, named, never quoted.
        return _refused(HTTPStatus.INTERNAL_SERVER_ERROR, "Run damaged", str(error))

    def outage(self, error: Outage) -> Response[str]:
        return _refused(HTTPStatus.SERVICE_UNAVAILABLE, *outage_words(error))

    def runs(self) -> Response[str]:
        asked = self.app.current_event.query_string_parameters or {}
        wanted, after = asked.get("status") or None, asked.get("after") or None
        if wanted is not None and wanted not in {s.value for s in RunStatus}:
            known = ", ".join(s.value for s in RunStatus)
            return _refused(HTTPStatus.BAD_REQUEST, "No such status", f"use one of {known}")
        # One page of the runs, agents included: on DynamoDB one round of Queries of the runs
        # index, never a Scan of every step record; on SQLite one SELECT of the runs table.
        # So the page counts no status (a count would read every run).
        try:
            page = self.services().client.runs_page(status=wanted, limit=RUNS_PER_PAGE, after=after)
        except InvalidInput as bad:
            return _refused(HTTPStatus.BAD_REQUEST, "No such page", str(bad))
        status = RunStatus(wanted) if wanted else None
        return _page_response(
            HTTPStatus.OK, runs_page(_run_rows(page.runs), status, older=page.next)
        )

    def run(self, run_id: str) -> Response[str]:
        try:
            timeline = read_timeline(self.services(), run_id)
        except (RunNotFound, InvalidInput) as missing:
            return _refused(HTTPStatus.NOT_FOUND, "No such run", str(missing))
        return _page_response(HTTPStatus.OK, run_page(timeline))

    def state(self, run_id: str, step: str) -> Response[str]:
        client = self.services().client
        try:
            number = _step_number(step)
            at = client.state_at(run_id, step=number)
            replayable = any(c.event == "step" and c.step == number for c in client.history(run_id))
        except (RunNotFound, InvalidInput) as missing:
            return _refused(HTTPStatus.NOT_FOUND, "No such step", str(missing))
        except CheckpointsExpired as gone:
            return _refused(HTTPStatus.GONE, "No longer kept", str(gone))
        return _page_response(HTTPStatus.OK, state_page(at, number, replayable=replayable))

    def prompt(self, run_id: str, step: str) -> Response[str]:
        try:
            number = _step_number(step)
            text = self.services().client.replay(run_id, step=number)
        except (RunNotFound, InvalidInput) as missing:
            return _refused(HTTPStatus.NOT_FOUND, "No such step", str(missing))
        except CheckpointsExpired as gone:
            return _refused(HTTPStatus.GONE, "No longer kept", str(gone))
        return _page_response(HTTPStatus.OK, prompt_page(run_id, number, text))


def _page_response(status: int, body: str) -> Response[str]:
    return Response(status_code=status, headers=dict(pages.HEADERS), body=body)


def _refused(status: int, title: str, message: str) -> Response[str]:
    return _page_response(status, problem_page(title, message))


def _run_rows(listed: Iterable[RunListed]) -> list[RunRow]:
    """The listed runs' rows: the listing carries each run's agent, so the page reads no head
    (damage only a step record shows is the run's own page's)."""
    rows: list[RunRow] = []
    for r in listed:
        agent = "?" if r.damage is not None or r.agent is None else r.agent
        rows.append(RunRow(r.run_id, agent, r.status, r.step, r.updated_at, r.damage))
    return rows


def _step_number(text: str) -> int:
    if not text.isdigit() or len(text) > 6:
        raise NoCheckpointAtStep(f"{text!r} is not a step number")
    return int(text)


def read_timeline(services: DashboardServices, run_id: str) -> Timeline:
    """Everything the run's page shows, read and never written: the head, the last
    `MAX_TIMELINE_ROWS` checkpoints (one bounded read, however long the run), the run's
    approval requests and the children those checkpoints started."""
    client, desk, deployed = services.client, services.desk, services.deployed
    recent: Recent = client.recent(run_id, last=MAX_TIMELINE_ROWS)
    head, checkpoints = recent.head, recent.checkpoints
    attempts = {
        c.version: c.attempt for c in checkpoints if c.event == "step" and c.attempt is not None
    }
    book = deployed.book if deployed is not None else _desk(desk).book
    approvals = book.of_run(run_id)
    waiting = head.status is RunStatus.WAITING and head.waiting is not None
    for_person = waiting and head.waiting is not None and head.waiting.kind == "person"
    pending_events = None
    if waiting and not for_person and services.mailbox is not None:
        pending_events = sum(event.is_pending for event in services.mailbox.of_run(run_id))
    open_now = [a for a in approvals if a.status is ApprovalStatus.PENDING and a.step == head.step]
    pending = None
    if for_person and open_now:
        approval = open_now[-1]
        expired = approval.is_expired(desk.clock() if desk is not None else utcnow())
        pending = PendingApproval(
            step=approval.step,
            prompt=head.waiting.request.prompt if head.waiting else approval.prompt,
            expires_at=approval.expires_at,
            link=None
            if expired or deployed is not None
            else _desk(desk).link(approval, services.operator),
            on_stack=None if expired or deployed is None else deployed.approve_route(run_id),
        )
    return Timeline(
        run=Run.of(head),
        checkpoints=checkpoints,
        attempts=attempts,
        gaps=version_gaps([c.version for c in checkpoints], head.version),
        approvals=approvals,
        pending=pending,
        waits_without_request=for_person and not open_now,
        mailbox_pending=pending_events,
        children=recent.children,
        total=head.version,
        on_stack=deployed is not None,
        deliveries=services.deliveries(run_id) if services.deliveries is not None else None,
    )


def _desk(desk: ApprovalDesk | None) -> ApprovalDesk:
    assert desk is not None, "a local store's dashboard has its approval desk"
    return desk


# --- HTML ------------------------------------------------------------------------------------

e = html.escape

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;background:#f4f5f7;margin:0;
color:#1d2330}
main{max-width:1100px;margin:24px auto;background:#fff;border-radius:8px;padding:22px 28px;
box-shadow:0 1px 3px rgba(0,0,0,.12)}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:22px 0 8px}
.meta,.note{color:#5b6475;font-size:13px}nav{font-size:13px;margin-bottom:12px}
table{border-collapse:collapse;width:100%;margin:8px 0}
th,td{text-align:left;padding:5px 7px;border-bottom:1px solid #e6e8ec;vertical-align:top;
font-size:13px}th{color:#5b6475;font-weight:600}
td.text,code,pre{word-break:normal;overflow-wrap:break-word}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;
white-space:pre-wrap}.wide{overflow-x:auto}
pre{background:#f6f8fa;padding:12px;border-radius:6px}
.counts{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0 4px}
.count{padding:6px 12px;border-radius:16px;background:#eef0f3;font-size:13px;
text-decoration:none;color:#1d2330}.count.on{background:#1d2330;color:#fff}
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px}
.s-done{background:#e6f4ea}.s-failed{background:#fce8e6}.s-waiting{background:#fef7e0}
.s-running{background:#e8f0fe}.s-stopped,.s-cancelled{background:#eef0f3}
.s-damaged{background:#fce8e6}
tr.retried td{background:#fff8e1}tr.failed td{background:#fdecea}tr.gap td{color:#5b6475}
.banner{padding:12px 14px;border-radius:6px;margin:12px 0;font-size:14px}
.info{background:#e8f0fe}.bad{background:#fce8e6}.stack{background:#fff4d6}
a.button{display:inline-block;background:#1e7e34;color:#fff;padding:7px 16px;border-radius:6px;
text-decoration:none;font-weight:600}
dl{display:grid;grid-template-columns:max-content 1fr;gap:4px 14px;font-size:14px;margin:8px 0}
dt{color:#5b6475}dd{margin:0}
.charts{display:flex;flex-wrap:wrap;gap:16px}svg{background:#fbfbfc;border-radius:6px}
#timeline{table-layout:fixed;min-width:1100px}#timeline td{overflow-wrap:anywhere}
.c-version{width:60px}.c-step{width:40px}.c-what{width:140px}.c-result{width:170px}
.c-worker{width:96px}.c-duration{width:76px}.c-bytes{width:60px}.c-attempt{width:90px}
.c-time{width:84px}
"""
"""The timeline's columns are as wide as the card (1,100 px, its width from a 1,156 px window),
so long words (a checksum, a path) wrap inside their cells rather than widen the table past the
card. Every column but the tool call's has its width; the call takes the rest, wide enough for
a tool's name and its first argument on one line. A narrower window scrolls the table."""

_TIMELINE_COLUMNS = (
    "version",
    "step",
    "what",
    "call",
    "result",
    "worker",
    "duration",
    "bytes",
    "attempt",
    "time",
)


REFRESH_SECONDS = {RunStatus.RUNNING: 5, RunStatus.WAITING: 30}
"""A page showing a run that may still change reloads itself this often (no script): a person
watching a run sees its steps arrive, and a decision taken elsewhere."""


def _page(title: str, body: str, *, refresh: int | None = None) -> str:
    reload = f"<meta http-equiv='refresh' content='{refresh}'>" if refresh else ""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<meta name='robots' content='noindex'>{reload}<title>{e(title)} · Ratchet</title>"
        f"<style>{_STYLE}</style></head><body><main>{body}</main></body></html>"
    )


def _run_url(run_id: str) -> str:
    return f"/dashboard/runs/{quote(run_id, safe='')}"


def _step_url(run_id: str, step: int) -> str:
    return f"{_run_url(run_id)}/steps/{step}"


def _status(status: RunStatus | Literal["damaged"]) -> str:
    return f"<span class='status s-{e(status)}'>{e(status)}</span>"


def _damage(row: RunRow) -> str:
    return "" if row.damage is None else f" <span class='note'>{e(row.damage)}</span>"


def _time(moment: datetime) -> str:
    return e(moment.strftime("%Y-%m-%d %H:%M:%S UTC"))


def problem_page(title: str, message: str) -> str:
    return _page(
        title,
        "<nav><a href='/dashboard'>All runs</a></nav>"
        f"<h1>{e(title)}</h1><div class='banner bad'>{e(message)}</div>",
    )


def runs_page(rows: Sequence[RunRow], status: RunStatus | None, *, older: str | None) -> str:
    """One page of runs, newest first, under a link per status that filters the list; `older`
    is the token of the next page, if there is one."""
    chips = [f"<a class='count{' on' if status is None else ''}' href='/dashboard'>all</a>"]
    for each in RunStatus:
        query = urlencode({"status": each.value})
        on = " on" if each is status else ""
        chips.append(f"<a class='count{on}' href='/dashboard?{e(query)}'>{e(each.value)}</a>")
    shown = {r.status for r in rows}
    refresh = min(
        (seconds for each, seconds in REFRESH_SECONDS.items() if each in shown), default=None
    )
    body = [
        "<h1>Runs</h1>",
        "<p class='meta'>Read from the store; this page changes nothing"
        + (f" and reloads every {refresh} s while a run may move" if refresh else "")
        + ".</p>",
        f"<div class='counts'>{''.join(chips)}</div>",
    ]
    if not rows:
        which = f"{status.value} runs" if status else "runs"
        body.append(f"<p class='note'>No {e(which)}.</p>")
        return _page("Runs", "".join(body), refresh=refresh)
    lines = "".join(
        f"<tr><td><a href='{e(_run_url(r.run_id))}'>{e(r.run_id)}</a></td><td>{e(r.agent)}</td>"
        f"<td>{_status(r.status)}{_damage(r)}</td><td>{r.step}</td>"
        f"<td>{_time(r.updated_at)}</td></tr>"
        for r in rows
    )
    body.append(
        "<table><thead><tr><th>run</th><th>agent</th><th>status</th><th>step</th>"
        f"<th>updated</th></tr></thead><tbody>{lines}</tbody></table>"
    )
    if older is not None:
        query = urlencode({**({"status": status.value} if status else {}), "after": older})
        body.append(
            f"<p class='note'>The {len(rows)} most recently updated. "
            f"<a id='older' href='/dashboard?{e(query)}'>Older runs</a></p>"
        )
    return _page("Runs", "".join(body), refresh=refresh)


def _status_text(run: Run) -> str:
    if run.status is RunStatus.FAILED:
        return f"failed at step {run.step + 1}"
    return f"{run.status.value} at step {run.step}"


def _summary(run: Run) -> str:
    facts: list[tuple[str, str]] = [
        ("status", f"{_status(run.status)} {e(_status_text(run))}"),
        ("agent", e(run.agent)),
        ("model", e(run.model)),
        ("goal", e(shorten(run.goal, 300))),
        ("version", str(run.version)),
    ]
    if run.summary:
        said = "stopped because" if run.status is RunStatus.STOPPED else "summary"
        facts.append((said, e(run.summary)))
    if run.error:
        facts.append(("error", e(run.error)))
    if run.parent:
        facts.append(
            ("parent", f"<a id='parent' href='{_run_url(run.parent)}'>{e(run.parent)}</a>")
        )
    if run.concurrency_key is not None:
        facts.append(("concurrency key", e(run.concurrency_key)))
    if run.priority:
        facts.append(("priority", str(run.priority)))
    if run.attempts and run.status in (RunStatus.RUNNING, RunStatus.WAITING):
        facts.append(("attempts at the next step", str(run.attempts)))
    usage = run.usage
    if usage.calls:
        tokens = (
            f"{usage.input_tokens:,} in, {usage.output_tokens:,} out, "
            f"{usage.cache_read_tokens:,} cache read over {usage.calls:,} "
            + ("call" if usage.calls == 1 else "calls")
        )
        if run.cost_usd is not None:
            tokens += f" (about ${run.cost_usd:.4f})"
        facts.append(("usage", e(tokens)))
    budget = budget_of(run.budget.model_dump() if run.budget is not None else None)
    if budget is not None:
        facts.append(("budget", e(budget_text(budget))))  # as `ratchet status` says it
    facts.append(("updated", _time(run.updated_at)))
    return "<dl>" + "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts) + "</dl>"


def _children(timeline: Timeline) -> str:
    """The child runs the run started, each linked, with where it stands and how it ended."""
    if not timeline.children:
        return ""
    rows = "".join(
        f"<tr><td><a href='{_run_url(child.run_id)}'>{e(child.run_id)}</a></td>"
        f"<td>{e(child.agent)}</td><td>{_status(child.status)}</td><td>{child.step}</td>"
        f"<td class='text'>{e(shorten(child.error or child.summary or '', 300))}</td></tr>"
        for child in timeline.children
    )
    waiting = timeline.run.wait
    note = (
        f"<p class='note'>{e(waiting.prompt)}.</p>"
        if waiting is not None and waiting.kind == "children"
        else ""
    )
    return (
        f"<h2>Child runs</h2>{note}<table id='children'><thead><tr><th>run</th><th>agent</th>"
        f"<th>status</th><th>steps</th><th>summary or error</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _waiting_for_the_world(timeline: Timeline) -> str:
    """What a run waiting for an event or a time waits for, when that settles by itself, the
    events its mailbox holds, and how to settle it now."""
    run, wait = timeline.run, timeline.run.wait
    if wait is None or wait.kind in ("person", "children"):
        return ""
    run_id = e(run.run_id)
    held = timeline.mailbox_pending
    mailbox = (
        ""
        if held is None
        else f"<p id='mailbox'>{held} event{'' if held == 1 else 's'} in its mailbox not "
        "taken by a wait yet.</p>"
    )
    if wait.kind == "timer":
        until = f"until <b>{_time(wait.until)}</b>" if wait.until else "(no time set)"
        wake = (
            f"<code>POST /runs/{run_id}/wake</code> on the stack's API"
            if timeline.on_stack
            else f"<code>ratchet wake {run_id}</code> or <code>POST /runs/{run_id}/wake</code>"
        )
        resumes = "its execution" if timeline.on_stack else "a worker"
        return (
            "<h2>Sleeping</h2>"
            f"<div class='banner info' id='waiting' data-kind='timer'><p>Step {wait.step} "
            f"sleeps {until}; {resumes} resumes the run then.</p>{mailbox}"
            f"<p class='note'>Wake it now: {wake}.</p></div>"
        )
    name = e(wait.name or "")
    send = (
        f"<code>POST /runs/{run_id}/events/{name}</code> on the stack's API"
        if timeline.on_stack
        else f"<code>ratchet send {run_id} {name} --data JSON</code> or "
        f"<code>POST /runs/{run_id}/events/{name}</code>"
    )
    expiry = (
        f"until <b>{_time(wait.until)}</b>, then it goes on without it"
        if wait.until
        else "with no timeout"
    )
    return (
        "<h2>Waiting for an event</h2>"
        f"<div class='banner info' id='waiting' data-kind='event'><p>Step {wait.step} waits "
        f"for the event <b>{name}</b> {expiry}.</p>{mailbox}"
        f"<p class='note'>Send it: {send}.</p></div>"
    )


def _pending(timeline: Timeline) -> str:
    run_id = timeline.run.run_id
    if timeline.waits_without_request and timeline.on_stack:
        return (
            "<div class='banner info'>The run waits for a person, but no request is open yet: "
            "the stack's notify function opens one, and sends its link, when the run's "
            "execution parks on it.</div>"
        )
    if timeline.waits_without_request:
        return (
            "<div class='banner info'>The run waits for a person, but no request is open yet "
            f"(its worker stopped before opening one): <code>ratchet link {e(run_id)}</code> "
            "opens one and prints its link.</div>"
        )
    pending = timeline.pending
    if pending is None:
        return ""
    if pending.on_stack is not None:
        return (
            "<h2>Waiting for a person</h2>"
            f"<div class='banner info' id='pending' data-route='{e(pending.on_stack)}'>"
            f"<p>Step {pending.step} asks: <b>{e(pending.prompt)}</b></p>"
            "<p>Decided on the stack, never here: the signed link the stack sent (email or "
            "Slack) opens its approval page, or a caller with the stack's rights sends "
            f"<code>POST {e(pending.on_stack)}</code> (IAM-signed). It expires "
            f"{_time(pending.expires_at)}.</p></div>"
        )
    if pending.link is None:
        return (
            f"<div class='banner bad'>The request at step {pending.step} expired at "
            f"{_time(pending.expires_at)}.</div>"
        )
    return (
        "<h2>Waiting for a person</h2>"
        f"<div class='banner info' id='pending'><p>Step {pending.step} asks: "
        f"<b>{e(pending.prompt)}</b></p>"
        f"<a class='button' href='{e(pending.link)}'>Open the approval page</a> "
        f"<span class='note'>to approve or reject (your signed link; it expires "
        f"{_time(pending.expires_at)}).</span></div>"
    )


def _attempt_text(attempt: int, died: Sequence[int] = ()) -> str:
    if attempt <= 1:
        return "1"
    failed = attempt - 1
    if len(died) == failed:
        return f"{attempt} (retried: the worker died during attempt {_and(died)})"
    said = f"{attempt} (retried after {failed} failed attempt{'s' if failed > 1 else ''}"
    return said + (f"; the worker died during attempt {_and(died)})" if died else ")")


def _and(numbers: Sequence[int]) -> str:
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _died(checkpoints: Sequence[Checkpoint]) -> dict[int, list[int]]:
    """By step record version: the attempts before it at its step whose worker died (killed,
    or gone silent until its lease ran out). Each was counted before its work started, a write
    to the head alone, and left no record: an attempt that fails in the worker's hands leaves
    an `attempt_failed` record (written at the run's committed step, the step before)."""
    failed = {(c.step + 1, c.attempt) for c in checkpoints if c.event == "attempt_failed"}
    return {
        c.version: [n for n in range(1, c.attempt) if (c.step, n) not in failed]
        for c in checkpoints
        if c.event == "step" and c.attempt is not None and c.attempt > 1
    }


def _gap_text(after: Checkpoint | None, died: Sequence[int], versions: int = 1) -> str:
    """The `versions` with no record just before `after` (None: the latest), in words."""
    if after is not None and after.event == "attempt_failed" and after.attempt is not None:
        # The failed attempt's record is filed under the run's committed step, the one before.
        return (
            f"Attempt {after.attempt} at step {after.step + 1} counted before its work started "
            "(a write to the head alone, with no record of its own)"
        )
    if after is None or after.event != "step" or after.attempt is None:
        return UNRECORDED_VERSIONS[0].upper() + UNRECORDED_VERSIONS[1:]
    if died:
        said = (
            f"Attempt {_and(died)} at step {after.step}: the worker died during this attempt "
            "(the attempt was counted, but no record was written)"
        )
        if versions > len(died):  # and the version that counted the attempt recorded next
            said += f"; attempt {after.attempt} counted as its work started"
        return said
    return (
        f"Attempt {after.attempt} at step {after.step} counted before its work started "
        "(a write to the head alone, with no record of its own)"
    )


def _only_counted(after: Checkpoint | None, died: Sequence[int], versions: int) -> bool:
    """Whether the `versions` with no record just before `after` did nothing but count the
    attempt that `after` committed on the first try (`ratchet.summary.only_counted`)."""
    if after is None or died:
        return False
    return only_counted(after.event, after.attempt, after.status.value, versions)


def _timeline_rows(timeline: Timeline) -> str:
    run_id = timeline.run.run_id
    shown = timeline.checkpoints[-MAX_TIMELINE_ROWS:]
    first_shown = shown[0].version if shown else 0
    gaps = [(first, last) for first, last in timeline.gaps if first >= first_shown]
    spans = {version_span(first, last): last for first, last in gaps}
    by_version = {c.version: c for c in shown}
    died = _died(timeline.checkpoints)
    rows: list[str] = []
    for item in interleaved([c.version for c in shown], gaps):
        if isinstance(item, str):
            after = by_version.get(spans[item] + 1)
            first, last = next(g for g in gaps if version_span(*g) == item)
            died_there = died.get(after.version, []) if after else []
            if _only_counted(after, died_there, last - first + 1):
                continue
            said = _gap_text(after, died_there, last - first + 1)
            rows.append(
                f"<tr class='gap'><td>{item}</td><td></td><td colspan='8'>{e(said)}</td></tr>"
            )
            continue
        c = shown[item]
        attempt = timeline.attempts.get(c.version)
        died_before = died.get(c.version, [])
        css = "failed" if c.event in ("attempt_failed",) or c.error else ""
        if attempt is not None and attempt > 1:
            css = "retried"
        call = ""
        if c.tool:
            arguments = argument_summary(c.arguments, ARGUMENT_CHARS)
            call = f"<b>{e(c.tool)}</b>(<code>{e(arguments)}</code>)"
        what = e(c.explanation or c.event)
        if c.event == "decided" and c.comment:
            # The explanation names who decided and ends with the comment, whole: the
            # comment is shown cut, once.
            said = c.explanation.removesuffix(f": {c.comment}")
            what = f"{e(said)}: {e(shorten(c.comment, RESULT_PREVIEW_CHARS))}"
        state_link = f"<a href='{e(_step_url(run_id, c.step))}'>{c.step}</a>"
        rows.append(
            f"<tr class='{css}' data-version='{c.version}' data-step='{c.step}'>"
            f"<td>{c.version}</td><td>{state_link}</td>"
            f"<td>{what}</td>"
            f"<td class='text'>{call}</td>"
            f"<td class='text'>{e(shorten(c.result or '', RESULT_PREVIEW_CHARS))}</td>"
            f"<td>{e(c.worker)}</td>"
            f"<td>{'' if c.duration_ms is None else f'{c.duration_ms:,.1f} ms'}</td>"
            f"<td>{c.bytes:,}</td>"
            f"<td>{'' if attempt is None else e(_attempt_text(attempt, died_before))}</td>"
            f"<td>{_time(c.time)[11:19]}</td></tr>"
        )
    return "".join(rows)


def _older_note(timeline: Timeline) -> str:
    shown = len(timeline.checkpoints)
    if timeline.total is None:
        if shown <= MAX_TIMELINE_ROWS:
            return ""
        said = f"The last {MAX_TIMELINE_ROWS:,} of {shown:,} checkpoints."
    else:
        # Only the newest were read: the head's version says how far the run went (it counts
        # attempts too, which write no checkpoint).
        first = timeline.checkpoints[0].version if timeline.checkpoints else 1
        if first <= 1:
            return ""
        said = (
            f"The last {shown:,} checkpoints (versions {first:,} to {timeline.total:,}); the "
            "charts are of these."
        )
    run_id = e(timeline.run.run_id)
    return (
        f"<p class='note' id='older'>{said} "
        f"<code>ratchet history {run_id}</code> (or <code>GET /runs/{run_id}/history</code>) "
        "lists every one.</p>"
    )


def _approvals(approvals: Sequence[Approval]) -> str:
    if not approvals:
        return ""
    rows = "".join(
        f"<tr><td>{a.step}</td><td>{e(shorten(a.prompt, 120))}</td><td>{e(a.status.value)}</td>"
        f"<td>{e(a.decided_by or '')}</td><td>{e(a.channel or '')}</td>"
        f"<td>{e(shorten(a.comment, RESULT_PREVIEW_CHARS))}</td>"
        f"<td>{_time(a.decided_at) if a.decided_at else ''}</td></tr>"
        for a in approvals
    )
    return (
        "<h2>Approval requests</h2><table id='approvals'><thead><tr><th>step</th>"
        "<th>asked</th><th>status</th><th>decided by</th><th>through</th><th>comment</th>"
        f"<th>decided</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _deliveries(deliveries: Sequence[DeliveryRecord] | None) -> str:
    if deliveries is None:
        return ""
    if not deliveries:
        return (
            "<h2>Webhook deliveries</h2><p class='note' id='deliveries'>None: its changes are "
            "POSTed to the URLs of RATCHET_WEBHOOKS and of its agent's webhooks, by a worker or "
            "<code>ratchet serve</code> that has them.</p>"
        )
    rows = "".join(
        f"<tr class='{e(d.state)}'><td><code>{e(d.delivery_id)}</code></td>"
        f"<td>{e(_change_status(d.body))}</td><td>{e(d.url)}</td><td>{e(d.state)}</td>"
        f"<td>{d.attempts}</td><td>{e(shorten(d.last_error or '', RESULT_PREVIEW_CHARS))}</td>"
        f"<td>{_delivery_when(d)}</td></tr>"
        for d in deliveries[:MAX_DELIVERY_ROWS]
    )
    return (
        "<h2>Webhook deliveries</h2><div class='wide'><table id='deliveries'><thead><tr>"
        "<th>delivery id</th><th>change</th><th>URL</th><th>state</th><th>attempts</th>"
        "<th>last error</th><th>answered / next try</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div><p class='note'>The latest {MAX_DELIVERY_ROWS} at "
        "most, newest first; <code>ratchet deliveries RUN</code> lists them too.</p>"
    )


def _change_status(body: str) -> str:
    """The status a delivery's change moved the run to, from its body (the sender's JSON)."""
    try:
        status = json.loads(body).get("status")
    except (ValueError, AttributeError):
        return "?"
    return str(status) if status is not None else "?"


def _delivery_when(delivery: DeliveryRecord) -> str:
    if delivery.state == "pending":
        return f"next try {_time(datetime.fromtimestamp(delivery.next_at, UTC))}"
    if delivery.answered_at is None:
        return ""
    return _time(datetime.fromtimestamp(delivery.answered_at, UTC))


def run_page(timeline: Timeline) -> str:
    """A run's status and summary, its pending approval's link, its charts and one row per
    checkpoint (with the versions no record explains)."""
    run = timeline.run
    steps = [c for c in timeline.checkpoints if c.event == "step"]
    durations = [Point(c.step, c.duration_ms) for c in steps if c.duration_ms is not None]
    written = [Point(c.version, float(c.bytes)) for c in timeline.checkpoints]
    retried = sorted(c.step for c in steps if timeline.attempts.get(c.version, 1) > 1)
    retried_note = (
        f"<p class='note' id='retried'>Retried steps: {', '.join(map(str, retried))}.</p>"
        if retried
        else ""
    )
    body = (
        "<nav><a href='/dashboard'>All runs</a></nav>"
        f"<h1>Run {e(run.run_id)}</h1>"
        f"{_summary(run)}{_pending(timeline)}{_waiting_for_the_world(timeline)}"
        f"{_children(timeline)}"
        "<h2>Over the run</h2><div class='charts'>"
        + chart(
            "Step duration",
            durations,
            x_label="step",
            y_label="ms",
            kind="bar",
        )
        + chart(
            "Bytes written",
            written,
            x_label="checkpoint version",
            y_label="bytes",
            kind="line",
        )
        + "</div>"
        f"<h2>Timeline</h2>{_older_note(timeline)}{retried_note}"
        "<div class='wide'><table id='timeline'><colgroup>"
        + "".join(f"<col class='c-{name}'>" for name in _TIMELINE_COLUMNS)
        + "</colgroup><thead><tr><th>version</th><th>step</th>"
        "<th>what happened</th>"
        "<th>tool call</th><th>result</th><th>worker</th><th>duration</th><th>bytes</th>"
        "<th>attempt</th><th>time</th></tr></thead>"
        f"<tbody>{_timeline_rows(timeline)}</tbody></table></div>"
        "<p class='note'>A step's number links to the run's state as of that step. A version "
        "with no row counted the attempt that committed the row after it (a write to the head "
        "alone); attempts that failed or were abandoned have rows.</p>"
        f"{_approvals(timeline.approvals)}{_deliveries(timeline.deliveries)}"
    )
    return _page(f"Run {run.run_id}", body, refresh=REFRESH_SECONDS.get(run.status))


def state_page(state: RunState, step: int, *, replayable: bool) -> str:
    """The state as of a step, as the JSON the store rebuilt it into."""
    dumped = json.dumps(state.model_dump(mode="json"), indent=2, ensure_ascii=False)
    replay = (
        f"<p><a href='{e(_step_url(state.run_id, step))}/prompt'>The prompt step {step}'s "
        "model saw</a></p>"
        if replayable
        else ""
    )
    body = (
        f"<nav><a href='/dashboard'>All runs</a> / "
        f"<a href='{e(_run_url(state.run_id))}'>{e(state.run_id)}</a></nav>"
        f"<h1>{e(state.run_id)} as of step {step}</h1>"
        f"<p class='meta'>{_status(state.status)} version {state.version}, "
        f"updated {_time(state.updated_at)}</p>{replay}<pre>{e(dumped)}</pre>"
    )
    return _page(f"{state.run_id} at step {step}", body)


def prompt_page(run_id: str, step: int, prompt: str) -> str:
    body = (
        f"<nav><a href='/dashboard'>All runs</a> / "
        f"<a href='{e(_run_url(run_id))}'>{e(run_id)}</a> / "
        f"<a href='{e(_step_url(run_id, step))}'>step {step}</a></nav>"
        f"<h1>The prompt of step {step}</h1>"
        "<p class='meta'>Rendered from the recorded state, as the model saw it.</p>"
        f"<pre>{e(prompt)}</pre>"
    )
    return _page(f"{run_id} step {step} prompt", body)


# --- charts ----------------------------------------------------------------------------------

_WIDTH, _HEIGHT = 520, 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 28, 40
_PLOT_W = _WIDTH - _LEFT - _RIGHT
_PLOT_H = _HEIGHT - _TOP - _BOTTOM
_PLOT_BOTTOM = _TOP + _PLOT_H


def _bucketed(data: Sequence[Point], limit: int) -> Sequence[Point]:
    """`data` in at most `limit` points: consecutive runs of points, each as its first x and
    its largest y (a spike stays visible however long the run)."""
    if len(data) <= limit:
        return data
    size = -(-len(data) // limit)  # ceiling division: at most `limit` buckets
    buckets = (data[i : i + size] for i in range(0, len(data), size))
    return [Point(bucket[0].x, max(p.y for p in bucket), last=bucket[-1].x) for bucket in buckets]


def _number(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def chart(
    title: str,
    points: Iterable[Point],
    *,
    x_label: str,
    y_label: str,
    kind: Literal["bar", "line"],
) -> str:
    """An SVG chart of `points` (x ascending): bars or a line, axes from 0 to the largest
    value, the first and last x labelled, and the axes named. Over `MAX_CHART_POINTS` points,
    each bar or dot stands for a bucket of neighbours, at the largest value among them."""
    ordered = sorted(points, key=lambda p: p.x)
    data = _bucketed(ordered, MAX_CHART_POINTS)
    parts = _axes(title, x_label=x_label, y_label=y_label)
    if not data:
        parts.append(
            f"<text x='{_LEFT + _PLOT_W / 2}' y='{_TOP + _PLOT_H / 2}' font-size='12' "
            "fill='#5b6475' text-anchor='middle'>no data yet</text></svg>"
        )
        return "".join(parts)
    plot = _Plot(slots=len(data), top_value=max(p.y for p in data) or 1.0)
    parts += plot.scale(first_x=ordered[0].x, last_x=ordered[-1].x)
    marks = plot.bars if kind == "bar" else plot.line
    parts += marks(data, x_label=x_label, y_label=y_label)
    parts.append("</svg>")
    return "".join(parts)


def _axes(title: str, *, x_label: str, y_label: str) -> list[str]:
    """The chart's opening, its title and its two axes, named."""
    return [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='chart' role='img' width='{_WIDTH}' "
        f"height='{_HEIGHT}' viewBox='0 0 {_WIDTH} {_HEIGHT}' aria-label='{e(title)}'>",
        f"<title>{e(title)}</title>",
        # Each chart says what its x axis counts, in its title: one is by step, the other
        # by checkpoint version (every write), and the two differ wherever a step wrote
        # more than one checkpoint.
        f"<text class='title' x='{_LEFT}' y='18' font-size='13' font-weight='600' "
        f"fill='#1d2330'>{e(title)}<tspan font-weight='400' fill='#5b6475'> by "
        f"{e(x_label)}</tspan></text>",
        f"<line x1='{_LEFT}' y1='{_TOP}' x2='{_LEFT}' y2='{_PLOT_BOTTOM}' stroke='#5b6475'/>",
        f"<line x1='{_LEFT}' y1='{_PLOT_BOTTOM}' x2='{_WIDTH - _RIGHT}' y2='{_PLOT_BOTTOM}' "
        "stroke='#5b6475'/>",
        f"<text class='x-axis' x='{_LEFT + _PLOT_W / 2}' y='{_HEIGHT - 6}' font-size='12' "
        f"fill='#394150' text-anchor='middle'>{e(x_label)}</text>",
        f"<text x='14' y='{_TOP + _PLOT_H / 2}' font-size='11' fill='#5b6475' "
        f"text-anchor='middle' transform='rotate(-90 14 {_TOP + _PLOT_H / 2})'>"
        f"{e(y_label)}</text>",
    ]


@dataclass(frozen=True)
class _Plot:
    """Where a chart's marks go: `slots` slots across, one per point, and 0 to `top_value`
    up."""

    slots: int
    top_value: float

    def x_of(self, index: int) -> float:
        return _LEFT + _PLOT_W / self.slots * (index + 0.5)

    def y_of(self, value: float) -> float:
        return _PLOT_BOTTOM - _PLOT_H * max(value, 0.0) / self.top_value

    def scale(self, *, first_x: int, last_x: int) -> list[str]:
        """The y axis's two values and the x axis's first and last."""
        parts = [
            f"<text x='{_LEFT - 6}' y='{_TOP + 4}' font-size='10' fill='#5b6475' "
            f"text-anchor='end'>{e(_number(self.top_value))}</text>",
            f"<text x='{_LEFT - 6}' y='{_PLOT_BOTTOM + 4}' font-size='10' fill='#5b6475' "
            "text-anchor='end'>0</text>",
        ]
        for index, x in {0: first_x, self.slots - 1: last_x}.items():
            parts.append(
                f"<text x='{self.x_of(index):.1f}' y='{_PLOT_BOTTOM + 14}' font-size='10' "
                f"fill='#5b6475' text-anchor='middle'>{x}</text>"
            )
        return parts

    def bars(self, data: Sequence[Point], *, x_label: str, y_label: str) -> list[str]:
        bar_w = max(_PLOT_W / self.slots * 0.7, 1.0)
        parts = []
        for index, p in enumerate(data):
            top = self.y_of(p.y)
            parts.append(
                f"<rect class='bar' x='{self.x_of(index) - bar_w / 2:.1f}' y='{top:.1f}' "
                f"width='{bar_w:.1f}' height='{_PLOT_BOTTOM - top:.1f}' fill='#3b6fd8'>"
                f"<title>{e(p.described(x_label, y_label))}</title></rect>"
            )
        return parts

    def line(self, data: Sequence[Point], *, x_label: str, y_label: str) -> list[str]:
        path = " ".join(f"{self.x_of(i):.1f},{self.y_of(p.y):.1f}" for i, p in enumerate(data))
        parts = [
            f"<polyline class='line' points='{path}' fill='none' stroke='#1e7e34' "
            "stroke-width='2'/>"
        ]
        for index, p in enumerate(data):
            parts.append(
                f"<circle class='dot' cx='{self.x_of(index):.1f}' cy='{self.y_of(p.y):.1f}' "
                f"r='3' fill='#1e7e34'><title>{e(p.described(x_label, y_label))}</title></circle>"
            )
        return parts


def local_app(
    client: Client,
    desk: ApprovalDesk,
    *,
    operator: str,
    mailbox: Mailbox | None = None,
    deliveries: Callable[[str], Sequence[DeliveryRecord]] | None = None,
) -> APIGatewayRestResolver:
    """The dashboard as `ratchet serve` mounts it: one client and desk for every request
    (the server answers one request at a time), the runs' mailboxes and webhook deliveries."""
    services = DashboardServices(
        client=client, desk=desk, operator=operator, mailbox=mailbox, deliveries=deliveries
    )
    return build_app(lambda: services)


def deployed_app(
    client: Client, deployed: Deployed, *, mailbox: Mailbox | None = None
) -> APIGatewayRestResolver:
    """The dashboard on a deployed stack's tables, read from this machine: no approval desk
    (a waiting run names the stack's own approval route), and every page under a banner that
    names the stack, account and region it reads."""
    services = DashboardServices(
        client=client, desk=None, operator="", mailbox=mailbox, deployed=deployed
    )
    app = build_app(lambda: services)
    banner = stack_banner(deployed)

    def with_banner(app: APIGatewayRestResolver, next_middleware: NextMiddleware) -> Response[Any]:
        response = next_middleware(app)
        if isinstance(response.body, str):
            response.body = response.body.replace("<main>", f"<main>{banner}", 1)
        return response

    app.use(middlewares=[with_banner])
    return app


def stack_banner(deployed: Deployed) -> str:
    stack = e(deployed.stack) if deployed.stack else "a stack whose name its tags do not give you"
    return (
        f"<div class='banner stack' id='stack'>Read-only, from the tables of <b>{stack}</b> in "
        f"account <b>{e(deployed.account)}</b> ({e(deployed.region)}; table "
        f"<code>{e(deployed.table)}</code>), with your AWS credentials. Runs are started, "
        "decided and steered through the stack's API.</div>"
    )
