"""Replies: `wait_for_reply` sends the person the approval's signed link, to a page where
they write a reply and send it once; the reply becomes the step's result. Through the WSGI
app `ratchet serve` runs, on a real SQLite store."""

from __future__ import annotations

from urllib.parse import urlencode

from ratchet.state import RunOptions, RunState, RunStatus
from tests.fixtures import reply_agent
from tests.integration.test_local_approvals import OPERATOR, Local, Parked, local, post, title

__all__ = ["local"]  # the fixture, used by name

AGENT = f"{reply_agent.__name__}:agent"


def park(local: Local) -> Parked:
    state = RunState(run_id="r-1", agent=AGENT, goal="Agree a day", options=RunOptions())
    assert local.engine.start(state)
    local.work("r-1")
    opened = local.desk.open("r-1", timeout_seconds=3600, operator=OPERATOR)
    return Parked("r-1", opened.approval, opened.notice, local.path(opened.approval))


def test_a_reply_written_on_the_page_becomes_the_steps_result(local):
    parked = park(local)
    assert parked.notice.subject == "Reply needed: Which day suits you for the migration window?"
    before = local.tables()
    page = local.client.get(parked.link)
    text = page.get_data(as_text=True)
    assert title(page) == "Reply needed"
    assert "name='answer.reply'" in text
    assert ">Send reply</button>" in text
    assert ">Decline</button>" in text
    assert local.tables() == before  # looking changes nothing

    empty = post(local, parked.link, urlencode({"decision": "approve", "answer.reply": ""}))
    assert empty.status_code == 400
    assert "reply" in empty.get_data(as_text=True)
    assert local.tables() == before

    sent = post(local, parked.link, urlencode({"decision": "approve", "answer.reply": "Tuesday"}))
    assert (sent.status_code, title(sent)) == (200, "Reply sent")
    again = post(local, parked.link, urlencode({"decision": "approve", "answer.reply": "Friday"}))
    assert again.status_code == 409  # decided once
    local.work("r-1")
    head = local.head("r-1")
    assert head.status is RunStatus.DONE
    assert head.summary == f"heard back: Reply from {OPERATOR}: Tuesday"


def test_a_declined_reply_says_so(local):
    parked = park(local)
    declined = post(local, parked.link, urlencode({"decision": "reject", "comment": "ask Bob"}))
    assert declined.status_code == 200
    local.work("r-1")
    assert local.head("r-1").summary == f"heard back: No reply: {OPERATOR} declined: ask Bob"
