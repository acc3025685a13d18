"""The approval page says which step asks and what it asked, before and after the decision
(issue 20): the question, the call and its arguments, the request's details, the steps before
it, and once decided who decided and when."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from ratchet.approvals import pages
from ratchet.approvals.desk import ApprovalView
from ratchet.state import ApprovalRequest, Message, RunState, RunStatus, ToolOutput, Waiting
from ratchet.waits import Approval, ApprovalStatus

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ASKING_STEP = 3
QUESTION = "Refund order A-1042?"
DETAILS = {"reason": "Parcel <damaged> in transit", "amount": 120}
ARGUMENTS = {"order_id": "A-1042", "amount": 120}


def _steps(*numbers: int) -> dict[str, Any]:
    """Messages and results for steps `numbers`: step 3 asked through `refund`."""
    tools = {n: "refund" if n == ASKING_STEP else f"look_up_{n}" for n in numbers}
    return {
        "messages": [
            Message(step=n, tool=tools[n], arguments=ARGUMENTS if n == ASKING_STEP else {})
            for n in numbers
        ],
        "tool_results": [ToolOutput(step=n, tool=tools[n], text=f"result {n}") for n in numbers],
    }


def _waiting_run() -> RunState:
    request = ApprovalRequest(prompt=QUESTION, details=DETAILS)
    return RunState(
        run_id="r-1",
        agent="refunds",
        goal="Refund what a person approves",
        status=RunStatus.WAITING,
        step=ASKING_STEP,
        waiting=Waiting(step=ASKING_STEP, request=request, since=NOW),
        **_steps(1, 2, 3),
    )


def _moved_on_run() -> RunState:
    """The run once decided: two steps further, waiting for nothing."""
    return RunState(
        run_id="r-1",
        agent="refunds",
        goal="Refund what a person approves",
        status=RunStatus.RUNNING,
        step=ASKING_STEP + 2,
        **_steps(1, 2, 3, 4, 5),
    )


def _approval(**fields: Any) -> Approval:
    opened: dict[str, Any] = {
        "approval_id": "A1b2C3d4E5f6G7h8I9j0Kq",
        "run_id": "r-1",
        "step": ASKING_STEP,
        "created_at": NOW,
        "expires_at": NOW + timedelta(days=7),
        "prompt": QUESTION,
        "details": DETAILS,
        "tool": "refund",
        "arguments": ARGUMENTS,
    }
    return Approval(**opened | fields)


def _decided(**fields: Any) -> Approval:
    return _approval(
        status=ApprovalStatus.APPROVED,
        decided_by="dana",
        decided_at=NOW + timedelta(minutes=30),
        comment="ok",
        **fields,
    )


def _text(page: str) -> str:
    """The page's words, markup dropped (`<wbr>` is a break opportunity, not a space)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))


def _asked_rows(page: str) -> dict[str, str]:
    table = re.search(r"<table id='asked'>(.*?)</table>", page)
    assert table is not None, page
    return dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", table.group(1)))


def _shows_the_request(page: str, verb: str) -> None:
    text = _text(page)
    assert f"Step {ASKING_STEP} of run r-1, agent refunds, {verb}:" in text
    assert f"<h1>{QUESTION}</h1>" in page
    rows = _asked_rows(page)
    assert rows["tool call"] == (
        "<code class='call'>refund(order_id=&quot;A-1042&quot;,<wbr> amount=120)</code>"
    )
    assert rows["reason"] == "<code>Parcel &lt;damaged&gt; in transit</code>"
    assert rows["amount"] == "<code>120</code>"


def test_the_pending_page_says_which_step_asks_and_lists_the_steps_before_it():
    page = pages.request_page(ApprovalView(_approval(), _waiting_run(), "dana"), action="x?sig=1")

    _shows_the_request(page, "asks")
    before = re.findall(r"<li>(.*?)</li>", page)
    assert [_text(item) for item in before] == [
        "Step 1, look_up_1: result 1",
        "Step 2, look_up_2: result 2",
    ]
    assert "The last steps before step 3:" in page
    assert "It expires 2026-12-08 12:00 UTC." in page


def test_the_page_of_a_decided_request_still_shows_what_was_asked_who_decided_and_when():
    # Given a request decided half an hour ago, and the run gone on two steps since
    view = ApprovalView(_decided(), _moved_on_run(), "dana")

    for page, said in (
        (pages.outcome_page(view, just_now=True), "Approved by dana at 2026-12-01 12:30 UTC."),
        (
            pages.outcome_page(view, just_now=False),
            "This request was approved by dana at 2026-12-01 12:30 UTC.",
        ),
    ):
        # Then the page says who decided and when, then the request as it was asked
        assert said in _text(page)
        _shows_the_request(page, "asked")
        assert page.index("id='decided'") < page.index("id='asker'")
        # And the steps the run took after it are not among the steps before it
        assert [_text(item) for item in re.findall(r"<li>(.*?)</li>", page)] == [
            "Step 1, look_up_1: result 1",
            "Step 2, look_up_2: result 2",
        ]


def test_a_request_opened_before_requests_kept_their_call_shows_the_call_the_head_still_has():
    older = _decided(details={}, tool=None, arguments={})

    page = pages.outcome_page(ApprovalView(older, _moved_on_run(), "dana"), just_now=False)

    call = "refund(order_id=&quot;A-1042&quot;,<wbr> amount=120)"
    assert _asked_rows(page) == {"tool call": f"<code class='call'>{call}</code>"}
