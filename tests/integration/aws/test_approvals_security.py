"""The public approval routes on AWS against everything but an honest click: forged, tampered,
expired, replayed and misdirected links, a run or a token that is no longer there, and Slack
requests that Slack did not sign. Each is refused with a clear page (or status) and changes
nothing: not the tables, not the parked execution. (The conftest's `stack` fixture checks,
after every test, that no task token appears in anything the test produced.)"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from ratchet.approvals.links import LinkClaims, LinkSigner
from ratchet.approvals.messages import SLACK_APPROVE
from ratchet.handlers import _wiring, decide, mark_failed
from ratchet.state import PersonDecided, RunStatus
from ratchet.waits import ApprovalStatus
from tests.fake_slack import FakeSlack, button_press, signed_interaction
from tests.integration.aws.harness import APPROVER, PUBLIC_URL, FakeContext, Page, Stack

NOT_VALID = (403, "This link is not valid")
ANOTHER_STORE = (403, "This link belongs to another Ratchet store")
EXPIRED = (410, "This request has expired")
DECIDED = (409, "Already decided")
NOT_WAITING = (409, "The run is no longer waiting")


def _parked(stack: Stack, run_id: str) -> tuple[str, str]:
    """A migration parked for approval at step 3: its execution's name and the link emailed."""
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": run_id})
    assert status == 201, started
    stack.parked(run_id)
    return str(started["execution_name"]), stack.link(run_id)


@contextmanager
def _nothing_changes(stack: Stack, *executions: str) -> Iterator[None]:
    before = stack.items()
    yield
    assert stack.items() == before, "a refused request changed the tables"
    assert all(stack.is_running(name) for name in executions), "a parked execution moved on"


def _both(stack: Stack, url: str, decision: str = "approve") -> list[tuple[int, str]]:
    """What opening the link, then posting its form, answers."""
    pages: list[Page] = [stack.open(url), stack.submit(url, decision, "yes")]
    return [(p.status, p.title) for p in pages]


def _changed(link: str, **fields: str) -> str:
    parts = urlsplit(link)
    query = {**dict(parse_qsl(parts.query)), **fields}
    return parts._replace(query=urlencode(query)).geturl()


def _claims(link: str) -> LinkClaims:
    parts = urlsplit(link)
    query = dict(parse_qsl(parts.query))
    expires = datetime.fromtimestamp(int(query["exp"]), UTC)
    return LinkClaims(parts.path.rsplit("/", 1)[-1], query["run"], query["to"], expires)


# --- links -----------------------------------------------------------------------------------


def test_a_link_signed_with_another_key_is_refused(stack: Stack):
    execution, link = _parked(stack, "forged")
    forged = LinkSigner(secrets.token_bytes(32)).url(PUBLIC_URL, _claims(link))
    assert forged != link
    ours = dict(parse_qsl(urlsplit(link).query))["kid"]
    without_kid = urlsplit(forged)._replace(
        query=urlencode({k: v for k, v in parse_qsl(urlsplit(forged).query) if k != "kid"})
    )

    with _nothing_changes(stack, execution):
        # Its key id names another key: another deployment's (or store's) link, it says
        assert _both(stack, forged) == [ANOTHER_STORE] * 2
        # Given this deployment's key id, or none (a link made before key ids), it is forged
        assert _both(stack, _changed(forged, kid=ours)) == [NOT_VALID] * 2
        assert _both(stack, without_kid.geturl()) == [NOT_VALID] * 2


def test_a_link_whose_expiry_was_pushed_back_is_refused(stack: Stack):
    execution, link = _parked(stack, "later")
    pushed = str(int(_claims(link).expires_at.timestamp()) + 30 * 24 * 3600)

    with _nothing_changes(stack, execution):
        assert _both(stack, _changed(link, exp=pushed)) == [NOT_VALID] * 2


def test_a_link_whose_recipient_was_changed_is_refused(stack: Stack):
    execution, link = _parked(stack, "other-person")

    with _nothing_changes(stack, execution):
        assert _both(stack, _changed(link, to="mallory@example.test")) == [NOT_VALID] * 2


def test_a_link_that_expired_is_refused_as_expired(stack: Stack):
    execution, link = _parked(stack, "old-link")
    # A genuine link (the deployment's own key) whose time is up, while the run still waits.
    claims = _claims(link)
    yesterday = datetime.now(UTC) - timedelta(days=1)
    expired = LinkSigner(stack.link_key.encode()).url(
        PUBLIC_URL,
        LinkClaims(claims.approval_id, claims.run_id, claims.recipient, yesterday),
    )

    with _nothing_changes(stack, execution):
        assert _both(stack, expired) == [EXPIRED] * 2


def test_a_link_with_a_parameter_given_twice_is_refused(stack: Stack):
    execution, link = _parked(stack, "twice-given")
    sig = dict(parse_qsl(urlsplit(link).query))["sig"]

    with _nothing_changes(stack, execution):
        assert _both(stack, f"{link}&sig={sig}") == [NOT_VALID] * 2
        assert _both(stack, f"{link}&to=mallory%40example.test") == [NOT_VALID] * 2


def test_a_link_to_a_request_that_does_not_exist_is_not_found(stack: Stack):
    execution, link = _parked(stack, "no-such")
    claims = _claims(link)
    made_up = LinkSigner(stack.link_key.encode()).url(
        PUBLIC_URL,
        LinkClaims("A" * 22, claims.run_id, claims.recipient, claims.expires_at),
    )

    with _nothing_changes(stack, execution):
        assert _both(stack, made_up) == [(404, "No such request")] * 2


def test_one_runs_link_with_another_runs_approval_id_is_refused(stack: Stack):
    first, link = _parked(stack, "run-a")
    second, _ = _parked(stack, "run-b")
    (other,) = stack.approvals("run-b")
    swapped = link.replace(
        f"/approvals/{_claims(link).approval_id}?", f"/approvals/{other.approval_id}?"
    )
    assert swapped != link

    with _nothing_changes(stack, first, second):
        assert _both(stack, swapped) == [NOT_VALID] * 2


def test_a_replayed_post_is_refused_and_changes_nothing(stack: Stack):
    execution, link = _parked(stack, "replay")
    page = stack.open(link)
    assert stack.submit(page.form_action, "approve", "yes").status == 200
    assert stack.finished(execution)["status"] == "SUCCEEDED"

    with _nothing_changes(stack):
        replayed = [stack.submit(page.form_action, "approve", "yes") for _ in range(2)]
        flipped = stack.submit(page.form_action, "reject", "changed my mind")

    assert [(p.status, p.title) for p in [*replayed, flipped]] == [DECIDED] * 3
    assert f"approved by {APPROVER}" in flipped.text
    assert stack.decisions("replay") == [(True, APPROVER, "yes")]


def test_a_form_without_a_clear_choice_is_refused(stack: Stack):
    execution, link = _parked(stack, "unclear")
    form = {"Content-Type": "application/x-www-form-urlencoded"}

    with _nothing_changes(stack, execution):
        bodies = ["decision=maybe", "", "decision=approve&decision=reject", "comment=hello"]
        pages = [stack.request("POST", link, body, form) for body in bodies]

    assert {(p.status, p.title) for p in pages} == {(400, "This request cannot be decided")}


# --- a run or token that is no longer there --------------------------------------------------


def test_a_link_to_a_request_decided_in_slack_first_says_already_decided(
    stack: Stack, slack: FakeSlack
):
    execution, link = _parked(stack, "slack-first")
    message = stack.slack_message("slack-first")
    press = button_press(
        message,
        SLACK_APPROVE,
        user_id="U0DANA",
        username="dana",
        response_url=slack.response_url("1"),
    )
    assert stack.slack(press) == 200
    assert stack.finished(execution)["status"] == "SUCCEEDED"

    with _nothing_changes(stack):
        pages = [stack.open(link), stack.submit(link, "reject", "no")]

    assert [(p.status, p.title) for p in pages] == [DECIDED] * 2
    assert "approved by @dana" in pages[1].text
    assert stack.decisions("slack-first") == [(True, "@dana", "")]


def test_a_link_to_a_run_that_stopped_waiting_is_refused(stack: Stack):
    execution, link = _parked(stack, "gave-up")
    # An operator failed the run while it waited (its execution still holds the token).
    mark_failed.handler(
        {"run_id": "gave-up", "error": {"Error": "Cancelled", "Cause": "by the operator"}},
        FakeContext("ratchet-mark-failed", "arn:ratchet-mark-failed"),
    )
    assert stack.head("gave-up").status is RunStatus.FAILED

    with _nothing_changes(stack, execution):
        assert _both(stack, link) == [NOT_WAITING] * 2


def test_a_decision_after_the_execution_was_stopped_closes_the_request(stack: Stack):
    execution, link = _parked(stack, "stopped")
    stack.stop(execution)
    waiting = stack.head("stopped")

    refused = stack.submit(link, "approve", "yes")

    # Step Functions refuses the token (TaskTimedOut, as for any closed task): the request
    # is over, and says so; it did not expire.
    assert (refused.status, refused.title) == NOT_WAITING
    (approval,) = stack.approvals("stopped")
    assert approval.status is ApprovalStatus.CLOSED
    stack.assert_settled("stopped")
    assert stack.head("stopped") == waiting
    assert stack.decisions("stopped") == []
    again = stack.open(link)
    assert (again.status, again.title) == DECIDED


def test_a_decision_that_reaches_a_token_already_answered_closes_the_request(stack: Stack):
    execution, link = _parked(stack, "answered")
    recording = stack.hold("ratchet-decide")
    # Someone with the token answered first; the execution is recording that answer.
    stack.sfn.send_task_success(taskToken=stack.token("answered"), output='{"by": "ops"}')
    recording.wait_entered()

    refused = stack.submit(link, "reject", "no")

    # Step Functions refuses the spent token (TaskTimedOut); the request did not expire.
    assert (refused.status, refused.title) == NOT_WAITING
    (approval,) = stack.approvals("answered")
    assert approval.status is ApprovalStatus.CLOSED
    recording.release()
    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert stack.decisions("answered") == [(True, "ops", "")]
    stack.assert_settled("answered")


def test_record_decision_for_a_run_decided_another_way_still_closes_the_request(stack: Stack):
    execution, _ = _parked(stack, "decided-elsewhere")
    recording = stack.hold("ratchet-decide")
    stack.sfn.send_task_success(taskToken=stack.token("decided-elsewhere"), output='{"by": "ops"}')
    recording.wait_entered()
    # Meanwhile the run's decision is recorded another way, straight on the run: RecordDecision
    # will find it no longer waiting, with the step's request still pending and its token kept.
    elsewhere = _wiring.runtime().engine(worker_id="elsewhere", logger=_wiring.logger)
    elsewhere.decide_waiting("decided-elsewhere", PersonDecided(approved=False, by="bob"))
    assert [a.status for a in stack.approvals("decided-elsewhere")] == [ApprovalStatus.PENDING]

    recording.release()

    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert stack.decisions("decided-elsewhere") == [(False, "bob", "")]
    (approval,) = stack.approvals("decided-elsewhere")
    assert approval.status is ApprovalStatus.CLOSED
    stack.assert_settled("decided-elsewhere")


def test_a_decision_that_reaches_a_timed_out_task_ends_the_request_as_expired(stack: Stack):
    stack.configure(approval_timeout_seconds=1)
    recording = stack.hold("ratchet-decide")
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": "timed"})
    assert status == 201, started
    recording.wait_entered()  # the parked task timed out; RecordDecision has not run yet
    link = stack.link("timed")
    (approval,) = stack.approvals("timed")
    assert approval.status is ApprovalStatus.PENDING
    # Step Functions starts the task's clock before the request is stored, and the page's
    # clock may be behind: for a moment the request looks open while the task is over.
    desk = _wiring.approval_desk()
    stack.monkeypatch.setattr(desk, "clock", lambda: approval.created_at)

    refused = stack.submit(link, "approve", "yes")

    assert (refused.status, refused.title) == EXPIRED
    assert "timed out" in refused.text
    (closed,) = stack.approvals("timed")
    assert closed.status is ApprovalStatus.EXPIRED
    stack.assert_settled("timed")
    recording.release()
    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"
    assert stack.decisions("timed") == [(False, "nobody", "approval expired after 1 s")]


# --- Slack -----------------------------------------------------------------------------------


def _press(stack: Stack, slack: FakeSlack, run_id: str) -> tuple[str, dict[str, Any]]:
    execution, _ = _parked(stack, run_id)
    message = stack.slack_message(run_id)
    press = button_press(
        message,
        SLACK_APPROVE,
        user_id="U0DANA",
        username="dana",
        response_url=slack.response_url("1"),
    )
    return execution, press


def test_a_slack_request_with_a_bad_signature_is_refused(stack: Stack, slack: FakeSlack):
    execution, press = _press(stack, slack, "slack-forged")
    assert stack.slack_signing_secret is not None
    _, genuine = signed_interaction(press, stack.slack_signing_secret)
    as_eve, _ = signed_interaction({**press, "user": {"id": "U0EVE", "username": "eve"}}, "-")

    with _nothing_changes(stack, execution):
        statuses = [
            stack.slack(press, signing_secret="not-the-signing-secret"),
            stack.slack_raw(as_eve, genuine),  # Slack's signature, over another body
            stack.slack_raw(as_eve, {"Content-Type": genuine["Content-Type"]}),  # unsigned
        ]

    assert statuses == [401, 401, 401]
    assert slack.responses() == []


def test_a_slack_request_over_five_minutes_old_is_refused(stack: Stack, slack: FakeSlack):
    execution, press = _press(stack, slack, "slack-stale")
    sent = int(datetime.now(UTC).timestamp())  # 30 s past the limit either way: slow machines

    with _nothing_changes(stack, execution):
        statuses = [
            stack.slack(press, timestamp=sent - 330),
            stack.slack(press, timestamp=sent + 330),
        ]

    assert statuses == [401, 401]
    assert slack.responses() == []


def test_record_decision_for_an_earlier_step_leaves_the_runs_new_wait_open(stack: Stack):
    # A run parked at step N: an answer that reaches RecordDecision for a step before it (an
    # execution that parked there, the run worked on in process since) is not this wait's
    _parked(stack, "moved-on")
    waiting = stack.head("moved-on")
    context = FakeContext("ratchet-decide", "arn:ratchet-decide")

    late = decide.handler(
        {
            "run_id": "moved-on",
            "step": waiting.step - 1,
            "verdict": "approved",
            "answer": {"by": "carol"},
        },
        context,
    )

    assert late["recorded"] is False
    assert stack.head("moved-on") == waiting
    assert [a.status for a in stack.approvals("moved-on")] == [ApprovalStatus.PENDING]
    assert stack.decisions("moved-on") == []
