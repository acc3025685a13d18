"""What a request for a decision says in each channel: everything a person needs to decide,
their own link, and nothing of the agent's text interpreted as markup."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime
from html.parser import HTMLParser
from typing import Any

import pytest

from ratchet.approvals.messages import (
    SLACK_APPROVE,
    SLACK_REJECT,
    email_html,
    email_text,
    slack_blocks,
    slack_button_value,
    slack_outcome_blocks,
)
from ratchet.waits import ApprovalNotice, Invitation, RecentStep

# Slack's documented limits for what these messages use.
SLACK_MAX_BLOCKS = 50
SLACK_MAX_TEXT = 3000
SLACK_MAX_BUTTON_VALUE = 2000
SLACK_MAX_BUTTON_TEXT = 75
SLACK_MAX_CONTEXT_ELEMENTS = 10

DANA = Invitation(
    recipient="dana@example.com",
    url="https://approvals.example.com/approvals/A1b2C3d4E5f6G7h8I9j0Kq"
    "?run=run-7f3a&to=dana%40example.com&exp=1772366400&sig=" + "d" * 64,
)
LEE = Invitation(
    recipient="lee@example.com",
    url="https://approvals.example.com/approvals/A1b2C3d4E5f6G7h8I9j0Kq"
    "?run=run-7f3a&to=lee%40example.com&exp=1772366400&sig=" + "e" * 64,
)


def notice(**changes: Any) -> ApprovalNotice:
    fields: dict[str, Any] = {
        "approval_id": "A1b2C3d4E5f6G7h8I9j0Kq",
        "run_id": "run-7f3a",
        "step": 42,
        "agent": "migration",
        "goal": "Migrate legacy_orders into orders",
        "prompt": "Drop legacy_orders. All 40 batches are copied",
        "details": {"action": "Drop legacy_orders", "rows": 40_000, "tables": ["a", "b"]},
        "recent": [
            RecentStep(step=39, tool="copy_batch", result="batch 39 copied"),
            RecentStep(step=40, tool="copy_batch", result="batch 40 copied"),
            RecentStep(step=41, tool="inspect_table", result="orders has 40,000 rows"),
        ],
        "expires_at": datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        "emails": [DANA, LEE],
        "slack_channel": "#ops",
    }
    return ApprovalNotice(**{**fields, **changes})


HOSTILE = notice(
    prompt="Approve? <script>alert('prompt')</script> <!channel> <@U123|boss> & *now*",
    details={
        "<img src=x onerror=alert(1)>": "<a href='javascript:alert(2)'>click</a>",
        "link": "<https://evil.example|Click to approve>",
    },
    recent=[RecentStep(step=1, tool="<b>tool</b>", result="<iframe src=//evil>&amp;")],
    goal="<style>body{display:none}</style>",
)


class Tags(HTMLParser):
    """The elements and attributes a mail client would actually build from the HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += attrs


def parsed(document: str) -> Tags:
    tags = Tags()
    tags.feed(document)
    return tags


def slack_texts(blocks: list[dict[str, Any]]) -> list[str]:
    """Every piece of mrkdwn or plain text Slack would render from the blocks."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("type") in ("mrkdwn", "plain_text") and "text" in value:
                found.append(value["text"])
            for child in value.values():
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    walk(blocks)
    return found


def buttons(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for b in blocks if b["type"] == "actions" for e in b["elements"]]


# --- email -------------------------------------------------------------------------------------


@pytest.mark.parametrize("render", [email_text, email_html])
def test_an_email_says_what_is_asked_with_every_detail_and_the_last_steps(render):
    body = render(notice(), DANA)

    for expected in [
        "Drop legacy_orders. All 40 batches are copied",
        "action",
        "Drop legacy_orders",
        "rows",
        "40000",
        "tables",
        '["a", "b"]' if render is email_text else html.escape('["a", "b"]'),
        "copy_batch",
        "batch 39 copied",
        "batch 40 copied",
        "inspect_table",
        "orders has 40,000 rows",
        "Migrate legacy_orders into orders",
    ]:
        assert expected in body, expected


@pytest.mark.parametrize("render", [email_text, email_html])
def test_an_email_names_the_run_the_step_the_agent_and_the_expiry(render):
    body = render(notice(), DANA)

    assert "run-7f3a" in body
    assert "step 42" in body
    assert "migration" in body
    assert "2026-03-01 12:00 UTC" in body


def test_each_recipients_email_carries_their_own_link_and_no_one_elses():
    for mine, theirs in [(DANA, LEE), (LEE, DANA)]:
        text, page = email_text(notice(), mine), email_html(notice(), mine)

        assert mine.url in text
        assert mine.recipient in text
        assert [v for k, v in parsed(page).attributes if k == "href"] == [mine.url]
        assert theirs.url not in text + html.unescape(page)
        assert theirs.recipient not in text + html.unescape(page)


def test_the_recent_steps_keep_their_order():
    text = email_text(notice(), DANA)

    assert text.index("39. copy_batch") < text.index("40. copy_batch") < text.index("41.")


def test_a_request_without_details_or_history_reads_cleanly():
    bare = notice(details={}, recent=[])

    assert "Details" not in email_text(bare, DANA)
    assert "Last steps" not in email_text(bare, DANA)
    assert "<table>" not in email_html(bare, DANA)
    assert "<ul>" not in email_html(bare, DANA)


def test_the_html_email_builds_no_element_from_the_agents_text():
    page = email_html(HOSTILE, DANA)
    tags = parsed(page)

    ours = {"html", "body", "p", "b", "h2", "table", "tr", "th", "td", "code", "ul", "li", "a"}
    assert set(tags.tags) <= ours
    assert [v for k, v in tags.attributes if k == "href"] == [DANA.url]
    assert not any(k.startswith("on") for k, _ in tags.attributes)
    assert html.escape("<script>alert('prompt')</script>") in page
    assert html.escape("<img src=x onerror=alert(1)>") in page


def test_the_html_email_escapes_a_link_that_carries_quotes():
    crafted = Invitation(
        recipient="o'hara@example.com",
        url="https://approvals.example.com/approvals/x?to=o'hara%40example.com' onclick='x",
    )

    tags = parsed(email_html(notice(), crafted))

    assert [v for k, v in tags.attributes if k == "href"] == [crafted.url]
    assert not any(k == "onclick" for k, _ in tags.attributes)


def test_the_text_email_keeps_the_agents_text_as_written():
    text = email_text(HOSTILE, DANA)

    assert "<script>alert('prompt')</script>" in text


def test_a_huge_detail_is_shortened_in_the_email():
    body = email_text(notice(details={"diff": "x" * 100_000}), DANA)

    assert "x" * 499 + "…" in body
    assert "x" * 500 not in body


def test_the_subject_names_the_request_and_is_short():
    long = notice(prompt="Drop it " * 1000)

    assert notice().subject == "Approval needed: Drop legacy_orders. All 40 batches are copied"
    assert len(long.subject) <= 200


# --- Slack -------------------------------------------------------------------------------------


def test_slack_has_approve_and_reject_buttons_naming_the_run_and_the_approval():
    blocks = slack_blocks(notice())

    pressed = buttons(blocks)
    assert [b["action_id"] for b in pressed] == [SLACK_APPROVE, SLACK_REJECT]
    assert [b["text"]["text"] for b in pressed] == ["Approve", "Reject"]
    assert [b.get("style") for b in pressed] == ["primary", "danger"]
    for button in pressed:
        assert json.loads(button["value"]) == {
            "run_id": "run-7f3a",
            "approval_id": "A1b2C3d4E5f6G7h8I9j0Kq",
        }
        assert button["value"] == slack_button_value(notice())


def test_slack_says_what_is_asked_with_details_last_steps_and_expiry():
    text = "\n".join(slack_texts(slack_blocks(notice())))

    for expected in [
        "Drop legacy_orders. All 40 batches are copied",
        "run-7f3a",
        "step 42",
        "action",
        "40000",
        "batch 40 copied",
        "inspect_table",
        "2026-03-01 12:00 UTC",
    ]:
        assert expected in text, expected


def test_slack_carries_no_link_that_decides():
    rendered = json.dumps(slack_blocks(notice()))

    assert "sig=" not in rendered
    assert "/approvals/" not in rendered


def test_slack_neutralises_mentions_links_and_entities_in_the_agents_text():
    texts = slack_texts(slack_blocks(HOSTILE))

    joined = "\n".join(texts)
    assert "<" not in joined.replace("&lt;", "")
    assert ">" not in joined.replace("&gt;", "")
    assert re.search(r"&(?!amp;|lt;|gt;)", joined) is None, "every & is an escape"
    assert "&lt;!channel&gt;" in joined
    assert "&lt;https://evil.example|Click to approve&gt;" in joined
    assert "&amp;amp;" in joined


def _all_texts_within_limits(blocks: list[dict[str, Any]]) -> None:
    assert len(blocks) <= SLACK_MAX_BLOCKS
    assert all(len(t) <= SLACK_MAX_TEXT for t in slack_texts(blocks))
    for block in blocks:
        if block["type"] == "context":
            assert len(block["elements"]) <= SLACK_MAX_CONTEXT_ELEMENTS
    for button in buttons(blocks):
        assert len(button["value"]) <= SLACK_MAX_BUTTON_VALUE
        assert len(button["text"]["text"]) <= SLACK_MAX_BUTTON_TEXT


@pytest.mark.parametrize(
    "huge",
    [
        {"prompt": "Drop? " * 5_000},
        {"details": {f"key {i}": "v" * 10_000 for i in range(200)}},
        {"details": {"k" * 10_000: "<" * 10_000}},
        {"details": {"nested": {"deep": ["&" * 3_000] * 50}}},
        {"recent": [RecentStep(step=i, tool="t" * 500, result="<" * 5_000) for i in range(3)]},
        {"run_id": "r" * 128, "agent": "a" * 500},
    ],
    ids=["prompt", "many-details", "escaped-detail", "nested-detail", "recent", "names"],
)
def test_slack_messages_stay_within_slacks_limits_whatever_the_agent_says(huge):
    _all_texts_within_limits(slack_blocks(notice(**huge)))


def test_the_decided_message_has_no_buttons_and_is_escaped():
    blocks = slack_outcome_blocks("Approved by @dana <!here>")

    assert buttons(blocks) == []
    assert slack_texts(blocks) == ["Approved by @dana &lt;!here&gt;"]
    _all_texts_within_limits(slack_outcome_blocks("x" * 10_000))


@pytest.mark.parametrize("length", [4, 7, 10])
def test_a_shortened_slack_message_never_ends_inside_an_escape(length):
    crowded = notice(details={f"k{i}": "<" * length for i in range(300)})

    for text in slack_texts(slack_blocks(crowded)):
        assert re.search(r"&(?!amp;|lt;|gt;)", text) is None, text[-20:]
