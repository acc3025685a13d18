"""The approval page and Slack's buttons on the local runtime, through the WSGI app that
`ratchet serve` runs: a real SQLite store, a run parked by a real worker, and every way a
request can be refused. Each refusal must change nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import html
import io
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urljoin, urlsplit

import pytest
from pydantic import BaseModel, SecretStr
from typer.testing import CliRunner
from werkzeug.test import Client, TestResponse

from ratchet.adapters.slack import SlackResponder
from ratchet.adapters.sqlite.approvals import SqliteApprovalBook
from ratchet.adapters.stepfunctions import verdict_from_answer
from ratchet.approvals.desk import ApprovalDesk, Decider, decided_text
from ratchet.approvals.links import LinkClaims
from ratchet.approvals.messages import SLACK_APPROVE, SLACK_REJECT, slack_button_value
from ratchet.cli.app import app as cli_app
from ratchet.client import Client as RatchetClient
from ratchet.engine import Engine
from ratchet.errors import AnswerInvalid, ApprovalClosed, ApprovalDecided, StoreBusy
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.local_approvals import LocalResumer, delivery_time
from ratchet.runtime.services import local_runs_services
from ratchet.state import PersonDecided, RunOptions, RunState, RunStatus, utcnow
from ratchet.tools import Agent, Done, StepView, Tool, ToolCall, ToolContext, ToolResult, ask_person
from ratchet.waits import Approval, ApprovalNotice, ApprovalStatus, Verdict
from ratchet.web.approvals import ApprovalServices, build_app
from ratchet.web.runs import build_app as build_runs_app
from ratchet.web.serve import wsgi_app
from ratchet.worker import Worker
from tests.fixtures import refund_agent
from tests.integration.test_notifiers import RecordingServer

LOG = logging.getLogger("ratchet.tests.approvals")
OPERATOR = "alice"
SLACK_SECRET = "slack-signing-secret-for-tests"

# --- an agent that asks a person, in words that would be markup if not escaped -----------------

PROMPT = "Drop <script>alert('prompt')</script> legacy_orders & co?"
DETAILS = {"<b>table</b>": "legacy_orders <img src=x onerror=alert(1)>", "rows": 2000}


class Note(BaseModel):
    text: str


def note(args: Note, ctx: ToolContext) -> str:
    return f"noted: {args.text}"


def ask(args: Note, ctx: ToolContext) -> ToolResult:
    return ask_person(PROMPT, details=DETAILS)


def asks_then_finishes(view: StepView) -> ToolCall | Done:
    """Note something, then ask a person (`params.asks` times), then finish."""
    if not view.messages:
        return ToolCall(name="note", arguments={"text": "counted <i>2000</i> rows"})
    asked = sum(m.tool == "ask" for m in view.messages)
    if asked < int(view.params.get("asks", 1)):
        return ToolCall(name="ask", arguments={"text": "may I?"})
    return Done(summary=f"finished after: {view.last_result}")


agent = Agent(
    name="asks",
    tools=[Tool("note", "Note a fact.", Note, note), Tool("ask", "Ask a person.", Note, ask)],
    goal="Ask before dropping <u>anything</u>",
    policy=asks_then_finishes,
)
AGENT = f"{__name__}:agent"


def notes_around_an_ask(view: StepView) -> ToolCall | Done:
    """`params.before` notes, then ask a person, then `params.after` notes, then finish."""
    before, after = int(view.params["before"]), int(view.params["after"])
    if view.step == before + 1:
        return ToolCall(name="ask", arguments={"text": "may I?"})
    if view.step <= before + 1 + after:
        return ToolCall(name="note", arguments={"text": f"fact {view.step}"})
    return Done(summary="noted around the ask")


asks_late = Agent(
    name="asks-late",
    tools=agent.tools,
    goal="Note facts, ask, note more",
    policy=notes_around_an_ask,
)
ASKS_LATE = f"{__name__}:asks_late"


# --- the local runtime behind `ratchet serve` --------------------------------------------------


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Parked:
    run_id: str
    approval: Approval
    notice: ApprovalNotice
    link: str
    """The operator's link, as path and query (what a browser sends)."""


class Local:
    def __init__(self, root: Path) -> None:
        self.store = f"sqlite:///{root}/s.db"
        self.runtime = LocalRuntime.open(LocalSettings(store=self.store))
        self.clock = Clock(utcnow())
        self.desk: ApprovalDesk = dataclasses.replace(
            self.runtime.approval_desk(worker_id="serve", logger=LOG), clock=self.clock
        )
        self.services = ApprovalServices(desk=self.desk)
        app = build_app(lambda: self.services)
        self.client = Client(wsgi_app([("/approvals/", app), ("/slack/", app)]))

    def park(
        self,
        run_id: str = "run-1",
        *,
        asks: int = 1,
        agent_name: str = AGENT,
        params: dict[str, Any] | None = None,
    ) -> Parked:
        """Start a run, work it until it waits for a person, and open its request."""
        options = RunOptions(model="scripted", params={"asks": asks, **(params or {})})
        state = RunState(run_id=run_id, agent=agent_name, goal=agent.goal, options=options)
        assert self.engine.start(state)
        self.work(run_id)
        assert self.head(run_id).status is RunStatus.WAITING
        opened = self.desk.open(run_id, timeout_seconds=3600, operator=OPERATOR)
        return Parked(run_id, opened.approval, opened.notice, self.path(opened.approval))

    def path(self, approval: Approval, recipient: str = OPERATOR) -> str:
        url = urlsplit(self.desk.link(approval, recipient))
        return f"{url.path}?{url.query}"

    @property
    def engine(self) -> Engine:
        return self.runtime.engine(worker_id="worker", logger=LOG)

    def work(self, run_id: str) -> None:
        Worker(self.engine, self.runtime.leases, LOG).run(until_idle=True, run_id=run_id)

    def head(self, run_id: str) -> RunState:
        state = self.runtime.store.load_head(run_id)
        assert state is not None
        return state

    def approval(self, parked: Parked) -> Approval:
        found = self.desk.book.get(parked.run_id, parked.approval.approval_id)
        assert found is not None
        return found

    def tables(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table of the store, to compare before and after."""
        db = self.runtime.db.connection
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: sorted(db.execute(f'SELECT * FROM "{n}"').fetchall(), key=repr) for n in names}

    def close(self) -> None:
        self.runtime.close()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    served = Local(tmp_path)
    yield served
    served.close()


@pytest.fixture
def parked(local: Local) -> Parked:
    return local.park()


def title(response: TestResponse) -> str:
    found = re.search(r"<title>(.*?) · Ratchet</title>", response.get_data(as_text=True))
    return html.unescape(found.group(1)) if found else ""


def with_query(link: str, **changes: str) -> str:
    path, _, query = link.partition("?")
    fields = dict(parse_qsl(query, keep_blank_values=True))
    return f"{path}?{urlencode({**fields, **changes}, quote_via=quote)}"


def post(local: Local, link: str, body: str | bytes) -> TestResponse:
    return local.client.post(
        link, data=body, content_type="application/x-www-form-urlencoded; charset=utf-8"
    )


# --- looking changes nothing -------------------------------------------------------------------


def test_opening_the_link_shows_the_request_and_changes_nothing(local, parked):
    before = local.tables()

    first = local.client.get(parked.link)
    again = local.client.get(parked.link)  # a mail scanner, then the person

    assert (first.status_code, title(first)) == (200, "Approval needed")
    assert again.get_data() == first.get_data()
    page = first.get_data(as_text=True)
    assert html.escape(PROMPT) in page
    for key, value in DETAILS.items():
        assert html.escape(key) in page
        assert html.escape(str(value)) in page
    assert "noted: counted &lt;i&gt;2000&lt;/i&gt; rows" in page, "the last completed steps"
    assert parked.run_id in page
    assert f"You decide as <b>{OPERATOR}</b>" in page
    assert local.tables() == before
    assert local.approval(parked).status is ApprovalStatus.PENDING


def test_the_page_builds_no_element_from_the_agents_text(local, parked):
    page = local.client.get(parked.link).get_data(as_text=True)

    assert "<script" not in page
    assert "<img" not in page
    assert "<i>" not in page
    assert "<u>" not in page
    assert html.escape("<script>alert('prompt')</script>") in page


def test_every_page_is_kept_out_of_caches_referrers_and_frames(local, parked):
    pages = [
        local.client.get(parked.link),
        local.client.get(with_query(parked.link, sig="0" * 64)),
        post(local, parked.link, "decision=maybe"),
        post(local, parked.link, "decision=approve"),
        local.client.get(parked.link),
    ]

    assert [p.status_code for p in pages] == [200, 403, 400, 200, 409]
    for page in pages:
        assert page.headers["Cache-Control"] == "no-store"
        assert page.headers["Referrer-Policy"] == "no-referrer"
        assert page.headers["X-Frame-Options"] == "DENY"
        csp = page.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp
        assert "form-action 'self'" in csp
        assert "frame-ancestors 'none'" in csp


def test_a_page_is_sent_as_html_once(local, parked):
    response = local.client.get(parked.link)

    assert response.headers.getlist("Content-Type") == ["text/html; charset=utf-8"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/approvals/"),
        ("GET", "/approvals"),
        ("POST", "/approvals/"),
        ("GET", "/approvals/?run=run-1"),
        ("GET", "/slack/interactions"),
    ],
)
def test_nothing_is_listed(local, parked, method, path):
    before = local.tables()

    response = local.client.open(path, method=method)

    assert response.status_code in (404, 405)
    assert parked.approval.approval_id not in response.get_data(as_text=True)
    assert local.tables() == before


# --- deciding ----------------------------------------------------------------------------------


def test_the_pages_own_form_approves_in_the_name_of_the_links_recipient(local, parked):
    page = local.client.get(parked.link).get_data(as_text=True)
    (action,) = re.findall(r"<form method='post' action='([^']*)'>", page)

    response = post(local, urljoin(parked.link, html.unescape(action)), "decision=approve")

    assert (response.status_code, title(response)) == (200, "Approved")
    assert f"Approved by {OPERATOR}" in response.get_data(as_text=True)
    decided = local.approval(parked)
    assert (decided.status, decided.decided_by, decided.channel) == (
        ApprovalStatus.APPROVED,
        OPERATOR,
        "link",
    )
    assert local.head(parked.run_id).status is RunStatus.RUNNING


def test_a_by_field_in_the_form_is_ignored(local, parked):
    response = post(local, parked.link, "by=mallory&decided_by=mallory&decision=approve")

    assert response.status_code == 200
    assert local.approval(parked).decided_by == OPERATOR
    assert local.head(parked.run_id).last_result == f"Approved by {OPERATOR}."


def test_a_rejection_carries_its_comment_to_the_run(local, parked):
    response = post(local, parked.link, urlencode({"decision": "reject", "comment": " not now "}))

    assert (response.status_code, title(response)) == (200, "Rejected")
    decided = local.approval(parked)
    assert (decided.status, decided.comment) == (ApprovalStatus.REJECTED, "not now")
    assert local.head(parked.run_id).last_result == f"Rejected by {OPERATOR}: not now"


def test_an_approved_run_is_picked_up_by_the_next_worker_and_finishes(local, parked):
    post(local, parked.link, "decision=approve&comment=go")

    local.work(parked.run_id)

    final = local.head(parked.run_id)
    assert final.status is RunStatus.DONE
    assert final.summary == f"finished after: Approved by {OPERATOR}: go"


def test_a_comment_of_exactly_ten_thousand_characters_is_taken(local, parked):
    response = post(local, parked.link, urlencode({"decision": "approve", "comment": "c" * 10_000}))

    assert response.status_code == 200
    assert local.approval(parked).comment == "c" * 10_000


def test_a_comment_of_ten_thousand_characters_in_any_script_is_taken(local, parked):
    response = post(local, parked.link, urlencode({"decision": "reject", "comment": "€" * 10_000}))

    assert response.status_code == 200
    assert local.approval(parked).comment == "€" * 10_000


# --- each refusal, and that it changes nothing -------------------------------------------------


def refused(
    local: Local, response: TestResponse, before: dict[str, Any], status: int, page_title: str
) -> None:
    assert (response.status_code, title(response)) == (status, page_title)
    assert "Nothing was changed." in response.get_data(as_text=True)
    assert local.tables() == before


def test_a_replayed_post_is_refused_as_already_decided(local, parked):
    post(local, parked.link, "decision=approve")
    after_first = local.tables()

    replay = post(local, parked.link, "decision=approve")
    other_choice = post(local, parked.link, "decision=reject")

    for response in (replay, other_choice):
        assert (response.status_code, title(response)) == (409, "Already decided")
        assert f"approved by {OPERATOR}" in response.get_data(as_text=True)
    assert local.tables() == after_first


def test_a_decided_link_still_shows_what_was_asked_after_the_run_finished(local, parked):
    # Given a decided request, and a run that went on to finish
    post(local, parked.link, "decision=approve&comment=fine")
    local.work(parked.run_id)
    assert local.head(parked.run_id).status is RunStatus.DONE

    # When the link is opened again
    page = local.client.get(parked.link).get_data(as_text=True)

    # Then it shows the call and the details the request kept when it was opened
    kept = local.approval(parked)
    assert (kept.tool, kept.arguments, kept.details) == ("ask", {"text": "may I?"}, DETAILS)
    assert "ask(text=&quot;may I?&quot;)" in page
    for name, value in DETAILS.items():
        shown = html.escape(value if isinstance(value, str) else json.dumps(value))
        assert f"<th>{html.escape(name)}</th><td><code>{shown}</code>" in page


def steps_listed(response: TestResponse) -> list[str]:
    """The steps before the request that its page lists, as text."""
    found = re.search(r"<ul class='steps' id='before'>(.*?)</ul>", response.get_data(as_text=True))
    assert found is not None
    items = re.findall(r"<li>(.*?)</li>", found[1])
    return [html.unescape(re.sub(r"<[^>]+>", "", item)) for item in items]


def test_a_decided_link_lists_the_steps_its_pending_page_listed(local):
    # Given a run that asked at step 5, after four notes, and what its pending page lists
    parked = local.park(agent_name=ASKS_LATE, params={"before": 4, "after": 3})
    assert parked.approval.step == 5
    pending = steps_listed(local.client.get(parked.link))

    # When it is approved and the run goes on, its window moving past the steps before the ask
    post(local, parked.link, "decision=approve")
    local.work(parked.run_id)
    assert local.head(parked.run_id).status is RunStatus.DONE
    assert min(r.step for r in local.head(parked.run_id).tool_results) > 2

    # Then the decided page lists the same steps: those the person saw when deciding
    decided = local.client.get(parked.link)
    assert title(decided) == "Already decided"
    assert pending == [f"Step {n}, note: noted: fact {n}" for n in (2, 3, 4)]
    assert steps_listed(decided) == pending
    assert [r.step for r in local.approval(parked).recent] == [2, 3, 4]


def test_opening_a_decided_link_says_who_decided(local, parked):
    post(local, parked.link, "decision=reject&comment=no")
    before = local.tables()

    response = local.client.get(parked.link)

    assert (response.status_code, title(response)) == (409, "Already decided")
    page = response.get_data(as_text=True)
    assert f"rejected by {OPERATOR}" in page
    assert "Comment: no" in page
    assert "<form" not in page
    assert local.tables() == before


def each_method(local: Local, link: str) -> list[TestResponse]:
    """The link opened (GET) and its form sent (POST), as a scanner and a forger would."""
    return [
        local.client.get(link),
        post(local, link, "decision=approve"),
    ]


@pytest.mark.parametrize(
    "sig", ["0" * 64, "", "f" * 63, "x" * 64], ids=["zeros", "empty", "short", "not-hex"]
)
def test_a_forged_signature_is_refused(local, parked, sig):
    before = local.tables()

    for response in each_method(local, with_query(parked.link, sig=sig)):
        refused(local, response, before, 403, "This link is not valid")


def test_a_signature_with_non_ascii_characters_is_refused(local, parked):
    before = local.tables()

    response = post(local, with_query(parked.link, sig="é" * 64), "decision=approve")

    refused(local, response, before, 403, "This link is not valid")


@pytest.mark.parametrize(
    "change",
    [
        {"to": "mallory"},
        {"to": "Alice"},
        {"run": "run-2"},
        {"exp": "9999999999"},
        {"exp": "not-a-time"},
    ],
    ids=["recipient", "recipient-case", "run", "expiry", "expiry-garbage"],
)
def test_a_tampered_link_is_refused(local, parked, change):
    before = local.tables()

    for response in each_method(local, with_query(parked.link, **change)):
        refused(local, response, before, 403, "This link is not valid")


@pytest.mark.parametrize(
    "query",
    [
        lambda q: q + "&to=mallory",
        lambda q: q + "&to=alice",
        lambda q: "to=mallory&" + q,
        lambda q: q + "&sig=" + "0" * 64,
        lambda q: q + "&utm_source=mail",
        lambda q: "",
        lambda q: "&".join(p for p in q.split("&") if not p.startswith("exp=")),
    ],
    ids=[
        "second-recipient-after",
        "same-recipient-twice",
        "second-recipient-before",
        "second-signature",
        "extra-field",
        "no-query",
        "no-expiry",
    ],
)
def test_a_link_with_repeated_missing_or_extra_fields_is_refused(local, parked, query):
    path, _, original = parked.link.partition("?")
    before = local.tables()

    response = post(local, f"{path}?{query(original)}", "decision=approve")

    refused(local, response, before, 403, "This link is not valid")


def test_a_link_of_another_store_says_it_belongs_to_another_store(local, parked, tmp_path):
    # Given a link that another store made, for a run parked there
    other = Local(tmp_path / "other")
    try:
        theirs = other.park("run-1")
    finally:
        other.close()
    before = local.tables()

    # When it is opened, or its form sent, on this store's server
    for response in each_method(local, theirs.link):
        # Then the page says whose it is, not that it was forged, and nothing changes
        refused(local, response, before, 403, "This link belongs to another Ratchet store")
        page = response.get_data(as_text=True)
        assert "another Ratchet store" in page
        assert "forged" not in page


def test_a_link_made_before_key_ids_still_decides(local, parked):
    # Given the link as Ratchet made it before links carried a key id
    path, _, query = parked.link.partition("?")
    old = "&".join(p for p in query.split("&") if not p.startswith("kid="))
    assert "kid=" in query
    assert "kid=" not in old

    # Then it shows the request, and decides it
    assert local.client.get(f"{path}?{old}").status_code == 200
    response = post(local, f"{path}?{old}", "decision=approve")
    assert (response.status_code, title(response)) == (200, "Approved")
    assert local.approval(parked).status is ApprovalStatus.APPROVED


def test_an_old_link_of_another_store_is_refused_as_not_matching(local, parked, tmp_path):
    other = Local(tmp_path / "other")
    try:
        theirs = other.park("run-1")
    finally:
        other.close()
    path, _, query = theirs.link.partition("?")
    old = "&".join(p for p in query.split("&") if not p.startswith("kid="))
    before = local.tables()

    for response in each_method(local, f"{path}?{old}"):
        refused(local, response, before, 403, "This link is not valid")


def test_an_expired_link_is_refused(local, parked):
    local.clock.now = parked.approval.expires_at
    before = local.tables()

    for response in each_method(local, parked.link):
        refused(local, response, before, 410, "This request has expired")
    assert local.head(parked.run_id).status is RunStatus.WAITING


def test_a_link_is_good_until_the_second_it_expires(local, parked):
    link_expiry = datetime.fromtimestamp(int(parked.approval.expires_at.timestamp()), UTC)

    local.clock.now = link_expiry - timedelta(microseconds=1)
    assert local.client.get(parked.link).status_code == 200
    local.clock.now = link_expiry
    assert local.client.get(parked.link).status_code == 410


def test_the_path_of_another_runs_approval_is_refused(local, parked):
    other = local.park("run-2")
    path, _, query = parked.link.partition("?")
    before = local.tables()

    response = post(
        local, f"{path.rsplit('/', 1)[0]}/{other.approval.approval_id}?{query}", "decision=approve"
    )

    refused(local, response, before, 403, "This link is not valid")


def test_a_genuine_signature_over_another_runs_approval_finds_nothing(local, parked):
    # Even a link signed for one run and another run's approval id (which only the key's
    # holder could make) decides nothing: the approval is looked up under the signed run.
    other = local.park("run-2")
    claims = LinkClaims(
        other.approval.approval_id, parked.run_id, OPERATOR, other.approval.expires_at
    )
    url = urlsplit(local.desk.signer.url(local.desk.public_url, claims))
    before = local.tables()

    for response in each_method(local, f"{url.path}?{url.query}"):
        refused(local, response, before, 404, "No such request")


def test_a_run_decided_from_the_cli_first_is_already_decided_on_the_page(local, parked):
    local.desk.decide_run(
        parked.run_id, Verdict(approved=True, by="bob", comment="from the CLI"), channel="cli"
    )
    before = local.tables()

    page = local.client.get(parked.link)
    response = post(local, parked.link, "decision=reject")

    for answer in (page, response):
        assert (answer.status_code, title(answer)) == (409, "Already decided")
        assert "approved by bob" in answer.get_data(as_text=True)
    assert local.tables() == before


def test_a_run_that_stopped_waiting_another_way_is_no_longer_waiting(local, parked):
    # A run decided straight through the engine (a worker that parked it died before opening
    # a request, and `ratchet approve` found none) leaves the request pending.
    local.engine.decide_waiting(parked.run_id, PersonDecided(approved=True, by="bob"))
    before = local.tables()

    page = local.client.get(parked.link)
    response = post(local, parked.link, "decision=approve")

    assert (page.status_code, title(page)) == (409, "The run is no longer waiting")
    refused(local, response, before, 409, "The run is no longer waiting")


def _cancel_through_the_client(local: Local, run_id: str) -> None:
    RatchetClient(local.runtime, worker_id="client", logger=LOG).cancel(
        run_id, reason="wrong table", by="bob"
    )


def _cancel_through_the_cli(local: Local, run_id: str) -> None:
    args = ["--store", local.store, "cancel", run_id, "--reason", "wrong table", "--by", "bob"]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 0, result.output
    assert f"{run_id}: cancelled at step" in result.output


def _cancel_through_the_runs_api(local: Local, run_id: str) -> None:
    # The runs API as `ratchet serve` mounts it, on the same store.
    services = local_runs_services(local.runtime, worker_id="serve", logger=LOG, operator="bob")
    http = Client(wsgi_app([("/runs", build_runs_app(lambda: services))]))
    response = http.post(f"/runs/{run_id}/cancel", json={"reason": "wrong table"})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json()["status"] == "cancelled"


@pytest.mark.parametrize(
    "cancel",
    [_cancel_through_the_client, _cancel_through_the_cli, _cancel_through_the_runs_api],
    ids=["client", "cli", "runs-api"],
)
def test_a_cancelled_runs_request_is_closed_and_its_link_answers_409(local, parked, cancel):
    cancel(local, parked.run_id)

    assert local.head(parked.run_id).status is RunStatus.CANCELLED
    assert local.approval(parked).status is ApprovalStatus.CLOSED
    before = local.tables()
    page = local.client.get(parked.link)
    response = post(local, parked.link, "decision=approve")
    for answer in (page, response):
        assert (answer.status_code, title(answer)) == (409, "Already decided")
        assert "closed: the run was decided another way" in answer.get_data(as_text=True)
    assert local.tables() == before
    assert local.approval(parked).status is ApprovalStatus.CLOSED


def test_a_request_for_a_step_the_run_has_left_is_no_longer_waiting(local):
    parked = local.park(asks=2)
    post(local, parked.link, "decision=approve")
    local.work(parked.run_id)
    assert local.head(parked.run_id).status is RunStatus.WAITING
    before = local.tables()

    response = post(local, parked.link, "decision=approve")

    assert (response.status_code, title(response)) == (409, "Already decided")
    assert local.tables() == before


def test_the_local_resumer_never_answers_another_steps_request(local):
    parked = local.park(asks=2)
    local.engine.decide_waiting(parked.run_id, PersonDecided(approved=True, by="bob"))
    local.work(parked.run_id)
    assert local.head(parked.run_id).step > parked.approval.step

    with pytest.raises(ApprovalClosed):
        LocalResumer(local.engine).resume(
            parked.approval,
            Verdict(approved=False, by="mallory", comment="late"),
            local.head(parked.run_id),
        )

    assert local.head(parked.run_id).status is RunStatus.WAITING


@pytest.mark.parametrize(
    "body",
    [
        "",
        "comment=hello",
        "decision=maybe",
        "decision=APPROVE",
        "decision=",
        "decision=approve&decision=reject",
        "decision=approve&decision=approve",
        "decision=approve&comment=a&comment=b",
        urlencode({"decision": "approve", "comment": "c" * 10_001}),
        "decision=approve&" + "&".join(f"f{i}=x" for i in range(10)),
        "decision=approve&comment=" + "c" * 70_000,
    ],
    ids=[
        "empty",
        "no-decision",
        "maybe",
        "capitals",
        "blank",
        "two-decisions",
        "same-decision-twice",
        "two-comments",
        "comment-too-long",
        "too-many-fields",
        "form-too-large",
    ],
)
def test_a_malformed_form_is_refused(local, parked, body):
    before = local.tables()

    response = post(local, parked.link, body)

    refused(local, response, before, 400, "This request cannot be decided")


def test_a_form_that_is_not_utf8_is_refused(local, parked):
    before = local.tables()

    response = post(local, parked.link, b"decision=approve&comment=\xff\xfe")

    assert response.status_code == 400
    assert local.tables() == before


# --- Slack -------------------------------------------------------------------------------------


@pytest.fixture
def slack_server() -> Iterator[RecordingServer]:
    server = RecordingServer()
    yield server
    server.close()


@pytest.fixture
def with_slack(local: Local) -> Local:
    local.services = ApprovalServices(
        desk=local.desk,
        slack_signing_secret=SecretStr(SLACK_SECRET),
        slack_responder=SlackResponder(allow_http=True),
    )
    return local


def slack_press(
    parked: Parked,
    action_id: str,
    response_url: str,
    *,
    secret: str = SLACK_SECRET,
    sent: int | None = None,
) -> tuple[str, dict[str, str]]:
    """The request Slack sends when dana presses a button of the posted message."""
    payload = {
        "type": "block_actions",
        "user": {"id": "U024BE7LH", "username": "dana", "name": "dana"},
        "response_url": response_url,
        "actions": [{"action_id": action_id, "value": slack_button_value(parked.notice)}],
    }
    body = urlencode({"payload": json.dumps(payload)})
    timestamp = str(int(time.time()) if sent is None else sent)
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:{body}".encode(), hashlib.sha256)
    return body, {
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": f"v0={digest.hexdigest()}",
    }


def slack_post(local: Local, body: str, headers: dict[str, str]) -> TestResponse:
    return local.client.post(
        "/slack/interactions",
        data=body,
        headers=headers,
        content_type="application/x-www-form-urlencoded",
    )


@pytest.mark.parametrize(
    ("action_id", "status", "verb"),
    [
        (SLACK_APPROVE, ApprovalStatus.APPROVED, "Approved"),
        (SLACK_REJECT, ApprovalStatus.REJECTED, "Rejected"),
    ],
)
def test_a_slack_button_decides_as_the_verified_user_and_replaces_the_message(
    with_slack, parked, slack_server, action_id, status, verb
):
    body, headers = slack_press(parked, action_id, slack_server.url + "/actions/T0/1/abc")

    response = slack_post(with_slack, body, headers)

    assert response.status_code == 200
    decided = with_slack.approval(parked)
    assert (decided.status, decided.decided_by, decided.channel) == (status, "@dana", "slack")
    assert with_slack.head(parked.run_id).status is RunStatus.RUNNING
    (replaced,) = slack_server.requests
    assert replaced.path == "/actions/T0/1/abc"
    assert replaced.json["replace_original"] is True
    assert replaced.json["text"].startswith(f"{verb} by @dana")


def test_a_second_press_changes_nothing_and_says_it_was_decided(with_slack, parked, slack_server):
    response_url = slack_server.url + "/actions/T0/1/abc"
    slack_post(with_slack, *slack_press(parked, SLACK_APPROVE, response_url))
    before = with_slack.tables()

    response = slack_post(with_slack, *slack_press(parked, SLACK_REJECT, response_url))

    assert response.status_code == 200
    assert with_slack.tables() == before
    assert slack_server.requests[-1].json["text"].startswith("Already decided")


@pytest.mark.parametrize(
    "press",
    [
        lambda p, url: slack_press(p, SLACK_APPROVE, url, secret="not the app's secret"),
        lambda p, url: slack_press(p, SLACK_APPROVE, url, sent=int(time.time()) - 301 - 60),
        lambda p, url: slack_press(p, SLACK_APPROVE, url, sent=int(time.time()) + 301 + 60),
        lambda p, url: (slack_press(p, SLACK_APPROVE, url)[0], {}),
        lambda p, url: (
            slack_press(p, SLACK_APPROVE, url)[0] + "&x=1",
            slack_press(p, SLACK_APPROVE, url)[1],
        ),
    ],
    ids=["bad-signature", "stale", "future", "unsigned", "body-changed"],
)
def test_a_slack_request_that_slack_did_not_just_sign_is_refused(
    with_slack, parked, slack_server, press
):
    before = with_slack.tables()

    response = slack_post(with_slack, *press(parked, slack_server.url + "/actions/x"))

    assert response.status_code == 401
    assert with_slack.tables() == before
    assert slack_server.requests == []


def test_slack_is_not_served_where_it_is_not_configured(local, parked, slack_server):
    before = local.tables()

    response = slack_post(local, *slack_press(parked, SLACK_APPROVE, slack_server.url))

    assert response.status_code == 404
    assert local.tables() == before


class BusyResumer:
    """A resumer whose backend turns the answer away for now (Step Functions throttled)."""

    def resume(self, approval: Approval, verdict: Verdict, run: RunState) -> RunState:
        raise StoreBusy("throttled")


def test_an_answer_that_cannot_be_delivered_for_now_leaves_the_request_open(local, parked):
    local.services = ApprovalServices(desk=dataclasses.replace(local.desk, resumer=BusyResumer()))

    busy = post(local, parked.link, "decision=approve")

    assert (busy.status_code, title(busy)) == (503, "Busy, please try again")
    assert local.approval(parked).status is ApprovalStatus.PENDING
    assert local.head(parked.run_id).status is RunStatus.WAITING
    local.services = ApprovalServices(desk=local.desk)
    assert post(local, parked.link, "decision=approve").status_code == 200


# --- structured answers and expiry (issue 10, "Richer answers") -------------------------------

REFUNDS = f"{refund_agent.__name__}:agent"


def park_refund(local: Local, run_id: str = "refund-1", *, timeout: int | None = None) -> Parked:
    """Start the refund agent, work it until it asks how much, and open its request."""
    options = RunOptions(model="scripted", approval_timeout_seconds=timeout)
    state = RunState(run_id=run_id, agent=REFUNDS, goal="Refund", options=options)
    assert local.engine.start(state)
    local.work(run_id)
    opened = local.desk.open(run_id, timeout_seconds=3600, operator=OPERATOR)
    return Parked(run_id, opened.approval, opened.notice, local.path(opened.approval))


def answer_form(decision: str = "approve", **fields: str) -> str:
    return urlencode({"decision": decision, **{f"answer.{k}": v for k, v in fields.items()}})


def test_a_structured_answer_given_on_the_page_becomes_the_steps_result(local):
    # Given a run asking how much to refund, with a form for the answer
    parked = park_refund(local)
    page = local.client.get(parked.link).get_data(as_text=True)
    assert "name='answer.amount'" in page
    assert "name='answer.reason'" in page
    before = local.tables()

    # When the person asks for too much, the form comes back naming the field, nothing changed
    bad = post(local, parked.link, answer_form(amount="600", reason='"late"'))
    assert (bad.status_code, title(bad)) == (400, "Approval needed")
    assert "amount: must be at most 500, not 600" in bad.get_data(as_text=True)
    assert local.tables() == before

    # When they give a good answer
    good = post(local, parked.link, answer_form(amount="120", reason='"late"'))

    # Then it is recorded with the approval, and the next step reads it as the result
    assert (good.status_code, title(good)) == (200, "Approved")
    assert local.approval(parked).answer == {"amount": 120, "reason": "late"}
    local.work(parked.run_id)
    head = local.head(parked.run_id)
    assert head.status is RunStatus.DONE
    assert head.summary == 'refund decided: Approved by alice: {"amount": 120, "reason": "late"}'


def test_a_structured_question_is_not_approved_without_an_answer_but_may_be_rejected(local):
    parked = park_refund(local)
    before = local.tables()

    bare = post(local, parked.link, "decision=approve")

    assert bare.status_code == 400
    assert "amount: required (a whole number from 1 to 500)" in bare.get_data(as_text=True)
    assert local.tables() == before
    rejected = post(local, parked.link, "decision=reject&comment=not+ours")
    assert title(rejected) == "Rejected"
    local.work(parked.run_id)
    assert local.head(parked.run_id).summary == "refund decided: Rejected by alice: not ours"


def test_the_python_client_checks_an_answer_as_the_page_does(local):
    parked = park_refund(local)
    client = RatchetClient(local.runtime, worker_id="client", logger=LOG)
    before = local.tables()

    with pytest.raises(AnswerInvalid, match="reason: must be one of"):
        client.approve(parked.run_id, by="dana", answer={"amount": 10, "reason": "lost"})
    assert local.tables() == before
    client.approve(parked.run_id, by="dana", answer={"amount": 10, "reason": "damaged"})

    assert local.approval(parked).answer == {"amount": 10, "reason": "damaged"}
    assert local.head(parked.run_id).last_result == (
        'Approved by dana: {"amount": 10, "reason": "damaged"}'
    )


def worker_at(local: Local, now: datetime) -> Worker:
    """A worker whose clock says `now`, expiring overdue requests and recording decisions left
    undelivered as `ratchet worker` does."""
    engine = local.engine
    return Worker(
        engine,
        local.runtime.leases,
        LOG,
        clock=Clock(now),
        expire_approvals=local.runtime.approval_expiry(engine),
        deliver_decisions=local.runtime.decision_delivery(engine),
    )


def test_a_request_nobody_answers_in_time_expires_and_the_run_goes_on(local, parked):
    # Given a run waiting on a request open for an hour
    deadline = parked.approval.expires_at
    waiting = local.head(parked.run_id)

    # When a worker looks a second before the deadline, nothing changes
    worker_at(local, deadline - timedelta(seconds=1)).run(until_idle=True)
    assert local.head(parked.run_id).version == waiting.version
    assert local.approval(parked).status is ApprovalStatus.PENDING

    # When a worker looks at the deadline
    worker_at(local, deadline).run(until_idle=True)

    # Then the request is expired, the run records what RecordDecision records on AWS, and
    # the agent goes on knowing nobody said yes
    assert local.approval(parked).status is ApprovalStatus.EXPIRED
    on_aws = verdict_from_answer("expired", None, timeout_seconds=3600)
    decided = [
        c.event
        for c in local.runtime.store.list_checkpoints(parked.run_id)
        if isinstance(c.event, PersonDecided)
    ]
    assert decided == [
        PersonDecided(approved=on_aws.approved, by=on_aws.by, comment=on_aws.comment)
    ]
    head = local.head(parked.run_id)
    assert head.status is RunStatus.DONE
    assert head.summary == "finished after: Rejected by nobody: approval expired after 3600 s"
    # And the link says so; nobody can decide it any more
    page = local.client.get(parked.link)
    assert page.status_code == 409
    assert "expired before anyone decided" in page.get_data(as_text=True)


def test_a_request_decided_in_time_does_not_expire(local, parked):
    local.desk.decide_by_link(
        local.desk.view(parked.approval.approval_id, dict(parse_qsl(urlsplit(parked.link).query))),
        approved=True,
        comment="",
    )

    worker_at(local, parked.approval.expires_at + timedelta(days=1)).run(until_idle=True)

    assert local.approval(parked).status is ApprovalStatus.APPROVED
    assert local.head(parked.run_id).summary == f"finished after: Approved by {OPERATOR}."


def test_a_run_started_with_its_own_approval_timeout_keeps_to_it(local):
    parked = park_refund(local, timeout=120)

    assert parked.approval.expires_at - parked.approval.created_at == timedelta(seconds=120)
    worker_at(local, parked.approval.expires_at).run(until_idle=True)
    assert local.head(parked.run_id).summary == (
        "refund decided: Rejected by nobody: approval expired after 120 s"
    )


# --- decided, not yet recorded (issue 16, defect 1) --------------------------------------------


class HeldResumer:
    """The engine's write of a decision, held back: `in_window` runs after the request is
    settled and before the head is written (what `RecordDecision` is on AWS)."""

    def __init__(self, inner: LocalResumer, in_window: Callable[[], None]) -> None:
        self.inner, self.in_window = inner, in_window

    def resume(self, approval: Approval, verdict: Verdict, run: RunState) -> RunState:
        self.in_window()
        return self.inner.resume(approval, verdict, run)


def local_cli(local: Local, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> tuple[int, str]:
    """`ratchet <args>` on the local store, in this process: its exit code and stderr."""
    from ratchet.cli import app as cli

    monkeypatch.setenv("RATCHET_STORE", f"sqlite:///{local.runtime.db.path}")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(args)
        except SystemExit as exit:
            return (exit.code if isinstance(exit.code, int) else 0), err.getvalue()
    return 0, err.getvalue()


def decisions(local: Local, run_id: str) -> list[tuple[bool, str, str]]:
    return [
        (c.event.approved, c.event.by, c.event.comment)
        for c in local.runtime.store.list_checkpoints(run_id)
        if isinstance(c.event, PersonDecided)
    ]


def test_every_channel_finds_a_request_decided_before_the_run_records_it(
    with_slack, parked, slack_server, monkeypatch
):
    local = with_slack
    runs = local_runs_services(local.runtime, worker_id="serve", logger=LOG, operator="erin")
    runs_api = Client(wsgi_app([("/runs", build_runs_app(lambda: runs))]))
    python = RatchetClient(local.runtime, worker_id="client", logger=LOG)
    seen: dict[str, Any] = {}

    def every_other_channel() -> None:
        # The book says approved by alice; the head still waits for the answer.
        assert local.approval(parked).status is ApprovalStatus.APPROVED
        assert local.head(parked.run_id).status is RunStatus.WAITING
        said = decided_text(local.approval(parked))
        assert said.startswith(f"approved by {OPERATOR} at ")
        before = local.tables()

        page = post(local, local.path(parked.approval, "bob"), "decision=reject")
        seen["page"] = (page.status_code, title(page), said in page.get_data(as_text=True))

        slack_post(local, *slack_press(parked, SLACK_REJECT, slack_server.url + "/actions/1"))
        seen["slack"] = slack_server.requests[-1].json["text"]

        api = runs_api.post(f"/runs/{parked.run_id}/reject", json={"reason": "no"})
        seen["api"] = (api.status_code, api.get_json()["problems"][0]["message"])

        seen["cli"] = local_cli(local, monkeypatch, ["reject", parked.run_id, "--by", "carol"])

        with pytest.raises(ApprovalDecided) as refused:
            python.reject(parked.run_id, by="dave", comment="no")
        seen["python"] = str(refused.value)

        seen["unchanged"] = local.tables() == before
        seen["said"] = said

    held = dataclasses.replace(
        local.desk, resumer=HeldResumer(LocalResumer(local.engine), every_other_channel)
    )
    clicked = held.decide_by_link(
        held.view(parked.approval.approval_id, dict(parse_qsl(urlsplit(parked.link).query))),
        approved=True,
        comment="go",
    )

    said = seen["said"]
    assert seen["page"] == (409, "Already decided", True)
    assert seen["slack"] == f"Already decided: {said}"
    assert seen["api"] == (409, said)
    assert seen["cli"] == (2, f"ratchet: {parked.run_id} was already {said}; nothing changed\n")
    assert seen["python"] == said
    assert seen["unchanged"], "a refused channel changed the store"
    assert clicked.approval.status is ApprovalStatus.APPROVED
    assert decisions(local, parked.run_id) == [(True, OPERATOR, "go")]
    local.work(parked.run_id)
    assert local.head(parked.run_id).summary == f"finished after: Approved by {OPERATOR}: go"
    assert decisions(local, parked.run_id) == [(True, OPERATOR, "go")]


class CommitsAfter:
    """A checkpoint store whose next commit first lets `meanwhile` run: another decider's
    whole decision lands between this one's read of the head and its write."""

    def __init__(self, store: Any, meanwhile: Callable[[], None]) -> None:
        self._store, self._meanwhile = store, meanwhile

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def commit(self, commit: Any) -> Any:
        meanwhile, self._meanwhile = self._meanwhile, lambda: None
        meanwhile()
        return self._store.commit(commit)


def committing_after(local: Local, worker_id: str, meanwhile: Callable[[], None]) -> Engine:
    """An engine on `local`'s store whose next commit first lets `meanwhile` run."""
    runtime = local.runtime
    return Engine(
        store=CommitsAfter(runtime.store, meanwhile),
        ledger=runtime.ledger,
        blobs=runtime.blobs,
        bind=runtime.bind,
        worker_id=worker_id,
        logger=LOG,
    )


def park_unasked(local: Local, run_id: str = "unasked") -> None:
    """A run parked by a worker that died before opening its request."""
    state = RunState(run_id=run_id, agent=AGENT, goal=agent.goal, options=RunOptions())
    assert local.engine.start(state)
    local.work(run_id)
    assert local.head(run_id).status is RunStatus.WAITING
    assert local.desk.book.of_run(run_id) == []


def test_a_direct_record_that_loses_its_race_says_who_won_and_records_nothing(local):
    park_unasked(local)
    runtime = local.runtime
    first = RatchetClient(runtime, worker_id="first", logger=LOG)

    def bob_decides_first() -> None:
        first.reject("unasked", by="bob", comment="no")

    slow = committing_after(local, "slow", bob_decides_first)
    decider = Decider(local.desk.book, LocalResumer(slow), runtime.store)

    with pytest.raises(
        ApprovalDecided, match=r"^rejected by bob at \d{4}-\d\d-\d\d \d\d:\d\d UTC$"
    ):
        decider.decide_or_record(
            "unasked", Verdict(approved=True, by="carol"), channel="cli", engine=slow
        )

    assert decisions(local, "unasked") == [(False, "bob", "no")]


def test_a_request_opened_while_a_decision_is_recorded_directly_takes_no_second_answer(local):
    park_unasked(local)
    runtime = local.runtime
    opened: list[Approval] = []

    def a_worker_opens_the_request() -> None:
        opened.append(local.desk.open("unasked", timeout_seconds=3600, operator="bob").approval)

    engine = committing_after(local, "cli", a_worker_opens_the_request)
    decider = Decider(local.desk.book, LocalResumer(engine), runtime.store)

    decider.decide_or_record(
        "unasked", Verdict(approved=True, by="carol"), channel="cli", engine=engine
    )

    (request,) = opened
    assert local.desk.book.get("unasked", request.approval_id).status is ApprovalStatus.CLOSED
    page = post(local, local.path(request, "bob"), "decision=reject")
    assert (page.status_code, title(page)) == (409, "Already decided")
    assert decisions(local, "unasked") == [(True, "carol", "")]


class SettlesAfter:
    """An approval book whose next settle first lets `meanwhile` decide through it."""

    def __init__(self, book: SqliteApprovalBook, meanwhile: Callable[[], None]) -> None:
        self._book, self._meanwhile = book, meanwhile

    def __getattr__(self, name: str) -> Any:
        return getattr(self._book, name)

    def settle(
        self, approval: Approval, verdict: Verdict, *, channel: str, at: datetime
    ) -> Approval:
        meanwhile, self._meanwhile = self._meanwhile, lambda: None
        meanwhile()
        return self._book.settle(approval, verdict, channel=channel, at=at)


def test_the_loser_of_a_settle_race_is_told_who_won_and_when(local, parked):
    # Given the runs API found the request pending, and alice's click settles it first
    def alice_clicks() -> None:
        assert post(local, parked.link, "decision=approve&comment=go").status_code == 200

    racing = Decider(
        SettlesAfter(local.desk.book, alice_clicks), local.desk.resumer, local.runtime.store
    )

    with pytest.raises(ApprovalDecided) as lost:
        racing.decide_run(parked.run_id, Verdict(approved=False, by="erin"), channel="api")

    assert str(lost.value) == decided_text(local.approval(parked))
    assert str(lost.value).startswith(f"approved by {OPERATOR} at ")
    assert decisions(local, parked.run_id) == [(True, OPERATOR, "go")]


def test_a_click_whose_write_meets_a_decision_recorded_directly_is_refused_not_a_traceback(
    local, parked
):
    # A `ratchet approve` that looked before the request was opened records its decision
    # between the click's read of the head and its write.
    def recorded_directly() -> None:
        local.engine.decide_waiting(
            parked.run_id, PersonDecided(approved=False, by="bob"), step=parked.approval.step
        )

    clicking = committing_after(local, "serve", recorded_directly)
    local.services = ApprovalServices(
        desk=dataclasses.replace(local.desk, resumer=LocalResumer(clicking))
    )

    response = post(local, parked.link, "decision=approve")

    assert (response.status_code, title(response)) == (409, "The run is no longer waiting")
    assert local.approval(parked).status is ApprovalStatus.CLOSED
    assert decisions(local, parked.run_id) == [(False, "bob", "")]


# --- a decider that dies (or stalls) between settling the request and recording it -----------


def test_a_decision_settled_and_never_recorded_is_recorded_once_after_a_decider_could_have(
    local, parked
):
    # Given a request settled by a decider that died before recording it on the run
    decided_at = local.clock.now
    verdict = Verdict(approved=True, by="dana", comment="ok", answer=None)
    local.desk.book.settle(parked.approval, verdict, channel="cli", at=decided_at)
    waiting = local.head(parked.run_id)
    longest = delivery_time(local.runtime.db.busy_timeout)

    # When a worker looks while a live decider could still be recording it, nothing changes
    worker_at(local, decided_at + longest).run(until_idle=True)
    assert local.head(parked.run_id).version == waiting.version

    # When a worker looks after that, it records the decision, and the run goes on
    worker_at(local, decided_at + longest + timedelta(seconds=1)).run(until_idle=True)
    worker_at(local, decided_at + longest + timedelta(seconds=9)).run(until_idle=True)

    decided = [
        c.event
        for c in local.runtime.store.list_checkpoints(parked.run_id)
        if isinstance(c.event, PersonDecided)
    ]
    assert [(d.approved, d.by, d.comment) for d in decided] == [(True, "dana", "ok")]
    assert local.head(parked.run_id).summary == "finished after: Approved by dana: ok"
    assert local.approval(parked).status is ApprovalStatus.APPROVED


def test_a_decider_that_comes_back_after_a_worker_recorded_its_decision_is_told_it_stands(
    local, parked
):
    # Given a decider frozen between its settle and its record, and a worker recording the
    # decision meanwhile (given up for dead)
    class Slow:
        def __init__(self, real: LocalResumer) -> None:
            self.real = real

        def resume(self, approval: Approval, verdict: Verdict, run: RunState) -> RunState:
            worker_now = local.clock.now + delivery_time(local.runtime.db.busy_timeout)
            local.runtime.decision_delivery(local.engine)(worker_now + timedelta(seconds=1))
            return self.real.resume(approval, verdict, run)

    desk = dataclasses.replace(local.desk, resumer=Slow(LocalResumer(local.engine)))
    query = dict(parse_qsl(urlsplit(parked.link).query))

    # When the decider comes back and records
    shown = desk.decide_by_link(
        desk.view(parked.approval.approval_id, query), approved=True, comment="go"
    )

    # Then it is told the decision stands, recorded once, and the request keeps who decided
    assert shown.approval.status is ApprovalStatus.APPROVED
    decided = [
        c.event
        for c in local.runtime.store.list_checkpoints(parked.run_id)
        if isinstance(c.event, PersonDecided)
    ]
    assert [(d.approved, d.by) for d in decided] == [(True, OPERATOR)]
    assert local.approval(parked).status is ApprovalStatus.APPROVED
    assert local.approval(parked).decided_by == OPERATOR
