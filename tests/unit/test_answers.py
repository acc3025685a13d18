"""Structured answers (issue 10, "Richer answers"): the schema `ask_person(..., answer=Model)`
keeps, the form the page renders from it, the checks every channel shares, and what the model
reads once a person answered."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from enum import Enum
from html.parser import HTMLParser
from typing import Any, Literal
from urllib.parse import urlencode

import pytest
from pydantic import BaseModel, Field

from ratchet.adapters.stepfunctions import task_success_output, verdict_from_answer
from ratchet.approvals import pages
from ratchet.approvals.answers import (
    MAX_ANSWER_SCHEMA_BYTES,
    answer_fields,
    answer_from_form,
    answer_schema,
    check_answer,
    checked_verdict,
)
from ratchet.approvals.desk import ApprovalView
from ratchet.approvals.messages import (
    SLACK_ANSWER,
    SLACK_APPROVE,
    SLACK_REJECT,
    email_text,
    slack_blocks,
)
from ratchet.approvals.slack import SlackLinkPressed, parse_action
from ratchet.errors import AnswerInvalid
from ratchet.state import (
    MAX_BUDGET_USD,
    ApprovalRequest,
    PersonDecided,
    RunState,
    RunStatus,
    Waiting,
    decision_text,
)
from ratchet.tools import RaiseBudget, ask_person
from ratchet.waits import Approval, ApprovalNotice, ApprovalStatus, Invitation, Verdict
from tests.fixtures.refund_agent import RefundAnswer

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


class Priority(Enum):
    LOW = "low"
    HIGH = "high"


class Everything(BaseModel):
    amount: int = Field(ge=1, le=500)
    ratio: float = Field(gt=0, lt=1, default=0.5)
    note: str = Field(default="", max_length=20)
    notify: bool = False
    priority: Priority = Priority.LOW
    mode: Literal["fast", "safe"] | None = None
    tables: list[str] = Field(default_factory=list)


def refund_schema() -> dict[str, Any]:
    return answer_schema(RefundAnswer)


# --- the schema -----------------------------------------------------------------------------


def test_ask_person_keeps_the_answer_models_schema_and_the_details():
    result = ask_person("How much?", details={"order": "A-1"}, answer=RefundAnswer, rows=2)

    assert result.wait_for is not None
    assert result.wait_for.details == {"order": "A-1", "rows": 2}
    assert result.wait_for.answer_schema == RefundAnswer.model_json_schema()
    assert ask_person("Drop it?", table="t").wait_for == ApprovalRequest(
        prompt="Drop it?", details={"table": "t"}
    )


def test_a_request_stored_before_answers_still_reads():
    assert (
        ApprovalRequest.model_validate_json('{"prompt":"ok?","details":{}}').answer_schema is None
    )
    assert PersonDecided.model_validate_json('{"approved":true,"by":"d"}').answer is None


def test_an_answer_that_is_no_model_or_too_large_is_refused():
    with pytest.raises(TypeError, match="pydantic model class"):
        ask_person("How much?", answer=dict)  # type: ignore[arg-type]

    class Huge(BaseModel):
        text: str = Field(description="x" * MAX_ANSWER_SCHEMA_BYTES)

    with pytest.raises(ValueError, match="over the 8,192-byte limit"):
        ask_person("How much?", answer=Huge)


def test_fields_are_read_from_the_schema_in_the_models_order():
    fields = answer_fields(answer_schema(Everything))

    assert [(f.name, f.kind, f.required) for f in fields] == [
        ("amount", "integer", True),
        ("ratio", "number", False),
        ("note", "string", False),
        ("notify", "boolean", False),
        ("priority", "choice", False),
        ("mode", "choice", False),
        ("tables", "json", False),
    ]
    by_name = {f.name: f for f in fields}
    assert by_name["amount"].hint == "a whole number from 1 to 500"
    assert by_name["priority"].choices == ("low", "high")
    assert by_name["mode"].nullable
    assert by_name["mode"].hint == 'one of "fast", "safe"'


# --- checking ---------------------------------------------------------------------------------


def test_a_good_answer_is_kept_with_the_defaults_of_the_fields_it_left_out():
    checked = check_answer(answer_schema(Everything), {"amount": 120.0, "priority": "high"})

    assert checked == {
        "amount": 120,
        "ratio": 0.5,
        "note": "",
        "notify": False,
        "priority": "high",
        "mode": None,
    }  # `tables` has a default factory, which no schema can carry: it stays out
    assert type(checked["amount"]) is int


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"amount": 600, "reason": "late"}, "amount: must be at most 500, not 600"),
        ({"amount": 0, "reason": "late"}, "amount: must be at least 1, not 0"),
        ({"amount": 12.5, "reason": "late"}, "amount: must be a whole number, not 12.5"),
        ({"amount": True, "reason": "late"}, "amount: must be a whole number from 1 to 500"),
        ({"amount": "120", "reason": "late"}, "amount: must be a whole number from 1 to 500"),
        ({"amount": 120, "reason": "lost"}, 'reason: must be one of "damaged", "late", not "lost"'),
        ({"reason": "late"}, "amount: required (a whole number from 1 to 500)"),
        ({"amount": 120, "reason": "late", "by": "x"}, "by: not a field of this answer"),
        ([120, "late"], "the answer must be a JSON object with the fields amount, reason"),
    ],
)
def test_a_bad_answer_is_refused_naming_the_field(answer, message):
    with pytest.raises(AnswerInvalid) as refused:
        check_answer(refund_schema(), answer)

    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"amount": 1, "ratio": 1}, "ratio: must be less than 1"),
        ({"amount": 1, "ratio": float("nan")}, "ratio: must be a finite number"),
        ({"amount": 1, "note": "n" * 21}, "note: must be at most 20 characters"),
        ({"amount": 1, "notify": "yes"}, "notify: must be true or false"),
        ({"amount": 1, "priority": "urgent"}, 'priority: must be one of "low", "high"'),
        ({"amount": 1, "tables": "orders"}, "tables: must be a JSON array"),
    ],
)
def test_every_supported_kind_is_checked(answer, message):
    with pytest.raises(AnswerInvalid, match=message):
        check_answer(answer_schema(Everything), answer)


def test_the_form_is_typed_by_the_schema_before_it_is_checked():
    schema = answer_schema(Everything)
    form = {
        "answer.amount": [" 120 "],
        "answer.ratio": ["0.25"],
        "answer.note": ["keep"],
        "answer.priority": ['"high"'],
        "answer.mode": [""],
        "answer.tables": ['["a", "b"]'],
    }

    typed = answer_from_form(schema, form)

    assert "mode" not in typed  # an empty box leaves the field out; the check adds its default
    assert check_answer(schema, typed) == {
        "amount": 120,
        "ratio": 0.25,
        "note": "keep",
        "notify": False,
        "priority": "high",
        "mode": None,
        "tables": ["a", "b"],
    }
    with pytest.raises(
        AnswerInvalid, match="amount: must be a whole number from 1 to 500, not 'lots'"
    ):
        answer_from_form(schema, {"answer.amount": ["lots"]})
    with pytest.raises(AnswerInvalid, match="amount: required"):
        answer_from_form(schema, {"answer.amount": [""]})
    with pytest.raises(AnswerInvalid, match="tables: must be valid JSON"):
        answer_from_form(schema, {"answer.amount": ["1"], "answer.tables": ["[a"]})
    assert answer_from_form(schema, {"answer.amount": ["1"], "answer.notify": ["true"]})["notify"]


def test_every_channel_checks_the_verdict_against_the_request():
    structured = ApprovalRequest(prompt="How much?", answer_schema=refund_schema())
    plain = ApprovalRequest(prompt="Drop it?")
    yes = Verdict(approved=True, by="dana")

    with pytest.raises(AnswerInvalid, match=r"needs an answer to approve \(amount: a whole"):
        checked_verdict(structured, yes)
    with pytest.raises(AnswerInvalid, match="asks for a yes or no, not an answer"):
        checked_verdict(plain, yes.model_copy(update={"answer": {"amount": 1}}))
    given = yes.model_copy(update={"answer": {"amount": 120, "reason": "late"}})
    assert checked_verdict(structured, given) == given
    no = Verdict(approved=False, by="dana", answer={"amount": 3})
    assert checked_verdict(structured, no).answer is None
    assert checked_verdict(plain, yes) == yes


# --- what the model reads ----------------------------------------------------------------------


def test_the_answer_becomes_the_result_text_the_model_reads():
    answered = PersonDecided(approved=True, by="dana", answer={"amount": 120, "reason": "late"})

    assert decision_text(answered) == 'Approved by dana: {"amount": 120, "reason": "late"}'
    commented = answered.model_copy(update={"comment": "VIP"})
    assert decision_text(commented).endswith('"late"}. Comment: VIP')
    assert decision_text(PersonDecided(approved=False, by="lee")) == "Rejected by lee."


def test_the_answer_travels_through_the_task_answer_on_aws():
    verdict = Verdict(approved=True, by="dana", answer={"amount": 120, "reason": "late"})

    output = task_success_output(verdict)

    assert json.loads(output) == {"by": "dana", "comment": "", "answer": verdict.answer}
    assert verdict_from_answer("approved", output, timeout_seconds=60) == verdict
    plain = task_success_output(Verdict(approved=True, by="dana"))
    assert json.loads(plain) == {"by": "dana", "comment": ""}


# --- the page ----------------------------------------------------------------------------------


class _Controls(HTMLParser):
    """The form's controls: (tag, attributes) of every input, select, option and textarea."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[tuple[str, dict[str, str | None]]] = []
        self.forms: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("input", "select", "option", "textarea"):
            self.controls.append((tag, dict(attrs)))
        if tag == "form":
            self.forms.append(dict(attrs))


def view_asking(schema: dict[str, Any] | None, **approval: Any) -> ApprovalView:
    request = ApprovalRequest(prompt="How much to refund?", answer_schema=schema)
    run = RunState(
        run_id="r-1",
        agent="refunds",
        goal="Refund",
        status=RunStatus.WAITING,
        step=1,
        waiting=Waiting(step=1, request=request, since=NOW),
    )
    fields: dict[str, Any] = {
        "approval_id": "A1b2C3d4E5f6G7h8I9j0Kq",
        "run_id": "r-1",
        "step": 1,
        "created_at": NOW,
        "expires_at": NOW + timedelta(hours=1),
    }
    return ApprovalView(Approval(**fields | approval), run, "dana")


def controls(page: str) -> _Controls:
    parser = _Controls()
    parser.feed(page)
    return parser


def test_the_page_renders_a_form_from_the_schema():
    page = pages.request_page(view_asking(answer_schema(Everything)), action="x?sig=1")
    parsed = controls(page)
    named = {a.get("name"): (tag, a) for tag, a in parsed.controls if a.get("name")}

    assert "novalidate" in parsed.forms[0]  # the server checks, naming the field
    tag, amount = named["answer.amount"]
    assert (tag, amount["type"], amount["step"], amount["min"], amount["max"]) == (
        "input",
        "number",
        "1",
        "1",
        "500",
    )
    assert named["answer.ratio"][1]["step"] == "any"
    assert named["answer.note"][1]["type"] == "text"
    assert named["answer.notify"][1]["type"] == "checkbox"
    assert named["answer.priority"][0] == "select"
    assert named["answer.tables"][0] == "textarea"  # no form control fits: JSON
    options = [a["value"] for tag, a in parsed.controls if tag == "option"]
    assert options == ['"low"', '"high"', "", '"fast"', '"safe"']
    assert "Amount" in page
    assert "a whole number from 1 to 500" in page


def test_a_yes_or_no_request_has_no_answer_fields():
    page = pages.request_page(view_asking(None), action="x?sig=1")
    names = [a.get("name") for _, a in controls(page).controls]

    assert names == ["comment"]
    assert "novalidate" not in page


def test_a_refused_answer_shows_the_form_again_with_what_was_given():
    given = {"answer.amount": ["600"], "answer.reason": ['"late"'], "comment": ["<b>hi</b>"]}

    page = pages.request_page(
        view_asking(refund_schema()), action="x", refused="amount: must be at most 500", given=given
    )

    assert "Not decided:</b> amount: must be at most 500. Nothing was changed." in page
    parsed = controls(page)
    amount = next(a for _, a in parsed.controls if a.get("name") == "answer.amount")
    assert amount["value"] == "600"
    late = next(a for t, a in parsed.controls if t == "option" and a["value"] == '"late"')
    assert "selected" in late
    assert "&lt;b&gt;hi&lt;/b&gt;</textarea>" in page


def test_the_outcome_page_shows_the_answer():
    view = view_asking(
        refund_schema(),
        status=ApprovalStatus.APPROVED,
        decided_by="dana",
        answer={"amount": 120, "reason": "<late>"},
    )

    page = pages.outcome_page(view, just_now=True)

    assert "<th>amount</th><td><code>120</code></td>" in page
    assert "&lt;late&gt;" in page


# --- the messages ------------------------------------------------------------------------------


def refund_notice(**changes: Any) -> ApprovalNotice:
    fields: dict[str, Any] = {
        "approval_id": "A1b2C3d4E5f6G7h8I9j0Kq",
        "run_id": "r-1",
        "step": 1,
        "agent": "refunds",
        "goal": "Refund",
        "prompt": "How much to refund?",
        "details": {"order": "A-1042"},
        "answer_schema": refund_schema(),
        "expires_at": NOW,
        "slack_channel": "#refunds",
        "slack_invitation": Invitation(recipient="#refunds", url="https://x.example/a?sig=1"),
    }
    return ApprovalNotice(**fields | changes)


def test_slack_links_a_structured_question_to_its_page_and_shows_the_details():
    blocks = slack_blocks(refund_notice())

    body = blocks[0]["text"]["text"]
    assert "• order: `A-1042`" in body
    assert "• amount: a whole number from 1 to 500" in body
    (actions,) = [b for b in blocks if b["type"] == "actions"]
    answer, reject = actions["elements"]
    assert answer["action_id"] == SLACK_ANSWER
    assert answer["url"] == "https://x.example/a?sig=1"
    assert reject["action_id"] == SLACK_REJECT
    assert SLACK_APPROVE not in json.dumps(blocks)


def test_pressing_the_slack_link_button_decides_nothing():
    payload = {
        "actions": [{"action_id": SLACK_ANSWER, "value": "{}"}],
        "user": {"id": "U1", "username": "dana"},
    }
    with pytest.raises(SlackLinkPressed) as pressed:
        parse_action(urlencode({"payload": json.dumps(payload)}))
    assert pressed.value.http_status == 200


def test_the_email_says_what_to_answer():
    invitation = Invitation(recipient="dana", url="https://x.example/a?sig=1")

    text = email_text(refund_notice(slack_invitation=None), invitation)

    assert "To approve, answer on the page:\n  amount: a whole number from 1 to 500\n" in text
    assert '  reason: one of "damaged", "late"\n' in text


def test_a_budgets_request_says_its_bounds_as_its_refusals_do_and_how_to_give_the_answer():
    # Given a run's request to raise its budget (more than 0, at most MAX_BUDGET_USD dollars)
    request = ApprovalRequest(prompt="Raise it?", answer_schema=answer_schema(RaiseBudget))
    yes = Verdict(approved=True, by="dana")

    # When approved without an answer, then with 0 and with too much
    with pytest.raises(AnswerInvalid) as missing:
        checked_verdict(request, yes)
    with pytest.raises(AnswerInvalid) as zero:
        checked_verdict(request, yes.model_copy(update={"answer": {"raise_usd": 0}}))
    with pytest.raises(AnswerInvalid) as over:
        checked_verdict(request, yes.model_copy(update={"answer": {"raise_usd": 20_000}}))

    # Then the hint says the bounds the refusals hold it to, and the CLI says how to answer
    assert str(missing.value) == (
        "this request needs an answer to approve (raise_usd: a number, more than 0, at most "
        f"{MAX_BUDGET_USD:.0f})"
    )
    assert missing.value.for_cli() == (
        f"{missing.value}: give it as --answer '{{\"raise_usd\": N}}'"
    )
    assert str(zero.value) == "raise_usd: must be more than 0, not 0"
    assert str(over.value) == f"raise_usd: must be at most {MAX_BUDGET_USD:.0f}, not 20000"
