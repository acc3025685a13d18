"""A person answers a parked run on AWS, with the state machine executing: from the link in
the email to the page, from Slack's buttons, or not at all; and answers sent by hand in any
shape. Whatever happens, the run records one decision and goes on, and the request ends
decided with its task token gone."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ratchet.adapters.stepfunctions import REJECTED_ERROR, UNNAMED, ExecutionInput
from ratchet.approvals.desk import decided_text
from ratchet.approvals.messages import SLACK_APPROVE, SLACK_REJECT
from ratchet.errors import ApprovalDecided
from ratchet.handlers import _wiring
from ratchet.runtime.services import api_client
from ratchet.state import RunStatus
from ratchet.waits import ApprovalStatus
from tests.fake_slack import FakeSlack, button_press
from tests.integration.aws.harness import (
    APPROVER,
    SENDER,
    Stack,
    entered_states,
    wait_until,
)
from tests.integration.aws.test_api import call

DROP = "Drop legacy_orders"


def _migration(stack: Stack, run_id: str) -> str:
    """Start a one-batch migration, which asks to drop the legacy table at step 3; the name
    of its execution."""
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": run_id})
    assert status == 201, started
    return str(started["execution_name"])


def _dropped(stack: Stack, run_id: str) -> bool:
    summary = stack.head(run_id).summary or ""
    assert "legacy_orders was" in summary, summary
    return "legacy_orders was dropped" in summary


def _item(stack: Stack, run_id: str) -> dict[str, Any]:
    (item,) = stack.approval_items(run_id)
    return item


# --- the page behind the emailed link --------------------------------------------------------


def test_the_emailed_link_shows_the_request_changes_nothing_and_approves_on_post(stack: Stack):
    execution = _migration(stack, "page-ok")
    approval = stack.parked("page-ok")
    (email,) = stack.emails_about("page-ok")
    assert (email.sender, email.to) == (SENDER, [APPROVER])
    assert email.subject.startswith(f"Approval needed: {DROP}.")
    link = stack.link("page-ok")
    before = stack.items()

    # Mail scanners and unfurlers fetch every link they see, maybe more than once.
    seen = [stack.open(link), stack.open(link)]

    assert [(p.status, p.title) for p in seen] == [(200, "Approval needed")] * 2
    assert DROP in seen[0].text
    assert f"You decide as {APPROVER}" in seen[0].text
    assert stack.items() == before, "opening the link changed something"
    assert stack.is_running(execution)

    decided = stack.submit(seen[0].form_action, "approve", "go ahead")

    assert (decided.status, decided.title) == (200, "Approved")
    assert f"Approved by {APPROVER}" in decided.text
    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert stack.head("page-ok").status is RunStatus.DONE
    assert stack.decisions("page-ok") == [(True, APPROVER, "go ahead")]
    assert _dropped(stack, "page-ok")
    stack.assert_settled("page-ok")
    (settled,) = stack.approvals("page-ok")
    assert (settled.approval_id, settled.status, settled.channel) == (
        approval.approval_id,
        ApprovalStatus.APPROVED,
        "link",
    )
    again = stack.open(link)
    assert (again.status, again.title) == (409, "Already decided")
    assert f"approved by {APPROVER}" in again.text


def test_a_rejection_from_the_page_is_recorded_with_its_reason_and_the_run_goes_on(stack: Stack):
    execution = _migration(stack, "page-no")
    stack.parked("page-no")
    page = stack.open(stack.link("page-no"))

    decided = stack.submit(page.form_action, "reject", "  not before the audit  ")

    assert (decided.status, decided.title) == (200, "Rejected")
    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert stack.head("page-no").status is RunStatus.DONE
    assert stack.decisions("page-no") == [(False, APPROVER, "not before the audit")]
    assert not _dropped(stack, "page-no")
    stack.assert_settled("page-no")
    assert _item(stack, "page-no")["status"]["S"] == "rejected"


def test_the_name_of_who_decided_comes_from_the_signed_link_not_from_the_form(stack: Stack):
    execution = _migration(stack, "page-who")
    stack.parked("page-who")
    page = stack.open(stack.link("page-who"))

    decided = stack.request(
        "POST",
        page.form_action,
        "decision=approve&comment=ok&by=mallory%40example.test&decided_by=mallory",
        {"Content-Type": "application/x-www-form-urlencoded"},
    )

    assert decided.status == 200
    stack.finished(execution)
    assert stack.decisions("page-who") == [(True, APPROVER, "ok")]


# --- Slack -----------------------------------------------------------------------------------


def test_a_slack_user_approves_with_the_button_and_the_message_says_who(
    stack: Stack, slack: FakeSlack
):
    execution = _migration(stack, "slack-ok")
    stack.parked("slack-ok")
    message = stack.slack_message("slack-ok")
    (call,) = [r for r in slack.received() if r.body is message]
    assert (message["channel"], call.authorization) == ("approvals", f"Bearer {slack.bot_token}")
    press = button_press(
        message,
        SLACK_APPROVE,
        user_id="U0DANA",
        username="dana",
        response_url=slack.response_url("1"),
    )

    assert stack.slack(press) == 200

    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert stack.decisions("slack-ok") == [(True, "@dana", "")]
    assert _dropped(stack, "slack-ok")
    stack.assert_settled("slack-ok")
    (approval,) = stack.approvals("slack-ok")
    assert (approval.status, approval.channel, approval.decided_by) == (
        ApprovalStatus.APPROVED,
        "slack",
        "@dana",
    )
    (replaced,) = slack.responses()
    assert replaced["replace_original"] is True
    assert replaced["text"] == "Approved by @dana: run slack-ok, step 3"
    assert "actions" not in [b["type"] for b in replaced["blocks"]], "buttons left behind"

    # A second press (another user, or Slack retrying) decides nothing more.
    before = stack.items()
    late = button_press(
        message,
        SLACK_REJECT,
        user_id="U0ERIN",
        username="erin",
        response_url=slack.response_url("2"),
    )
    assert stack.slack(late) == 200
    assert stack.items() == before
    assert slack.responses()[-1]["text"].startswith("Already decided: approved by @dana")


def test_a_slack_rejection_is_recorded_and_the_run_goes_on(stack: Stack, slack: FakeSlack):
    execution = _migration(stack, "slack-no")
    stack.parked("slack-no")
    message = stack.slack_message("slack-no")
    press = button_press(
        message,
        SLACK_REJECT,
        user_id="U0ERIN",
        username="erin",
        response_url=slack.response_url("1"),
    )

    assert stack.slack(press) == 200

    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert stack.decisions("slack-no") == [(False, "@erin", "")]
    assert not _dropped(stack, "slack-no")
    stack.assert_settled("slack-no")
    assert [r["text"] for r in slack.responses()] == ["Rejected by @erin: run slack-no, step 3"]


# --- nobody answers --------------------------------------------------------------------------


def test_a_request_nobody_answers_expires_and_shows_as_expired_everywhere(
    stack: Stack, slack: FakeSlack
):
    stack.configure(approval_timeout_seconds=1)
    execution = _migration(stack, "late")

    # The parked task times out; the run goes on as if the request were rejected.
    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert "TaskTimedOut" in [e["type"] for e in stack.history(execution)]
    assert "ApprovalExpired" in entered_states(stack.history(execution))
    assert stack.decisions("late") == [(False, "nobody", "approval expired after 1 s")]
    assert not _dropped(stack, "late")
    stack.assert_settled("late")
    assert _item(stack, "late")["status"]["S"] == "expired"

    link = stack.link("late")
    (approval,) = stack.approvals("late")
    wait_until(lambda: time.time() >= approval.expires_at.timestamp(), what="the link to expire")
    before = stack.items()
    shown = stack.open(link)
    posted = stack.submit(link, "approve")
    message = stack.slack_message("late")
    pressed = stack.slack(
        button_press(
            message,
            SLACK_APPROVE,
            user_id="U0DANA",
            username="dana",
            response_url=slack.response_url("1"),
        )
    )

    assert [(p.status, p.title) for p in (shown, posted)] == [(410, "This request has expired")] * 2
    assert pressed == 200
    assert slack.responses()[-1]["text"] == "Already decided: expired before anyone decided"
    assert stack.items() == before
    assert stack.decisions("late") == [(False, "nobody", "approval expired after 1 s")]


# --- a second execution ----------------------------------------------------------------------


def test_a_second_execution_for_a_waiting_run_stops_as_superseded_with_one_request(stack: Stack):
    first = _migration(stack, "twice")
    stack.parked("twice")

    second = "twice-again"
    stack.sfn.start_execution(
        stateMachineArn=stack.state_machine_arn,
        name=second,
        input=ExecutionInput(run_id="twice", approval_timeout_seconds=300).model_dump_json(),
    )
    ended = stack.finished(second)

    assert ended["status"] == "SUCCEEDED"
    entered = entered_states(stack.history(second))
    assert entered[-1] == "Superseded"
    assert "AwaitApproval" not in entered
    assert len(stack.approval_items("twice")) == 1
    assert len(stack.emails_about("twice")) == 1, "the person was asked twice"
    # The first execution still holds the run, and a decision resumes it.
    assert stack.is_running(first)
    page = stack.open(stack.link("twice"))
    assert stack.submit(page.form_action, "approve").status == 200
    assert stack.finished(first)["status"] == "SUCCEEDED"
    assert stack.decisions("twice") == [(True, APPROVER, "")]


# --- answers sent by hand --------------------------------------------------------------------

LONG = "x" * 10_001

HAND_SENT: dict[str, tuple[dict[str, Any], tuple[bool, str, str]]] = {
    "no comment": ({"output": '{"by": "alice"}'}, (True, "alice", "")),
    "empty by": ({"output": '{"by": "", "comment": "fine"}'}, (True, UNNAMED, "fine")),
    "comment over 10,000": (
        {"output": '{"by": "alice", "comment": "' + LONG + '"}'},
        (True, "alice", "x" * 9_999 + "…"),
    ),
    "a JSON array": ({"output": "[]"}, (True, UNNAMED, "[]")),
    "a JSON number": ({"output": "42"}, (True, UNNAMED, "42")),
    "cause not JSON": (
        {"error": REJECTED_ERROR, "cause": "no, not today"},
        (False, UNNAMED, "no, not today"),
    ),
    "cause without reason": (
        {"error": REJECTED_ERROR, "cause": '{"by": "bob"}'},
        (False, "bob", ""),
    ),
    "no cause": ({"error": REJECTED_ERROR}, (False, UNNAMED, "")),
}
"""Answers of every malformed shape, as someone with the token might send them by hand, and
the decision each must become: (approved, by, comment)."""


@pytest.mark.parametrize("shape", list(HAND_SENT))
def test_a_hand_sent_answer_of_any_shape_becomes_a_decision_and_the_run_goes_on(
    stack: Stack, shape: str
):
    answer, decision = HAND_SENT[shape]
    execution = _migration(stack, "by-hand")
    stack.parked("by-hand")
    token = stack.token("by-hand")

    if "output" in answer:
        stack.sfn.send_task_success(taskToken=token, **answer)
    else:
        stack.sfn.send_task_failure(taskToken=token, **answer)

    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert stack.decisions("by-hand") == [decision]
    assert stack.head("by-hand").status is RunStatus.DONE
    assert _dropped(stack, "by-hand") is decision[0]
    stack.assert_settled("by-hand")
    assert _item(stack, "by-hand")["status"]["S"] == "closed"


# --- decided, not yet recorded (issue 16, defect 1) ------------------------------------------


def test_every_channel_finds_a_request_decided_before_record_decision_runs(
    stack: Stack, slack: FakeSlack
):
    # Given a parked run whose request alice decided: the request is settled and the task
    # answered, but RecordDecision is held, so the head still waits
    execution = _migration(stack, "window")
    stack.parked("window")
    message = stack.slack_message("window")
    link = stack.link("window")
    recording = stack.hold("ratchet-decide")
    clicked = stack.submit(link, "approve", "go")
    assert (clicked.status, clicked.title) == (200, "Approved")
    recording.wait_entered()
    assert stack.head("window").status is RunStatus.WAITING
    (approval,) = stack.approvals("window")
    said = decided_text(approval)
    assert said.startswith(f"approved by {APPROVER} at ")
    before = stack.items()

    # When every other channel tries to decide in that window
    again = stack.submit(link, "reject", "no")
    press = button_press(
        message,
        SLACK_REJECT,
        user_id="U0ERIN",
        username="erin",
        response_url=slack.response_url("1"),
    )
    pressed = stack.slack(press)
    api_status, api_answer = call("POST", "/runs/window/reject", {"reason": "no"})
    client = api_client(
        _wiring.runtime(), agents=_wiring.agents(), worker_id="python", logger=_wiring.logger
    )
    with pytest.raises(ApprovalDecided) as python:
        client.reject("window", by="dave", comment="no")

    # Then each finds it decided, naming who and when, and nothing changed
    assert (again.status, again.title) == (409, "Already decided")
    assert said in again.text
    assert pressed == 200
    assert slack.responses()[-1]["text"] == f"Already decided: {said}"
    assert (api_status, api_answer["problems"][0]["message"]) == (409, said)
    assert str(python.value) == said
    assert stack.items() == before

    # And once RecordDecision runs, the run has one decision: alice's
    recording.release()
    assert stack.finished(execution)["status"] == "SUCCEEDED"
    assert stack.decisions("window") == [(True, APPROVER, "go")]
    assert _dropped(stack, "window")
    stack.assert_settled("window")
