"""What a request for a decision says, rendered for each channel: plain text and HTML email,
and Slack Block Kit. Pure functions of the notice; the adapters only send what these return.

Every value from the run (the prompt, its details, tool results) is the agent's text, not
ours: HTML is escaped, and Slack's mrkdwn control characters are neutralised.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from ratchet.approvals.answers import answer_fields
from ratchet.waits import ApprovalNotice, Invitation

SLACK_APPROVE = "ratchet_approve"
SLACK_REJECT = "ratchet_reject"
"""The `action_id`s of the two buttons; the interactivity endpoint acts on these only."""
SLACK_ANSWER = "ratchet_answer"
"""A link button to the page, for a request that asks for a structured answer; Slack still
posts its press, which the endpoint ignores."""

_DETAIL_CHARS = 500
_SLACK_TEXT_CHARS = 2900  # a section block's text is capped at 3,000 characters


def _when(notice: ApprovalNotice) -> str:
    return notice.expires_at.strftime("%Y-%m-%d %H:%M UTC")


def _detail(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"


def _wanted(notice: ApprovalNotice) -> list[str]:
    """`amount: a whole number from 1 to 500`, a line per field of the answer asked for."""
    if notice.answer_schema is None:
        return []
    return [f"{f.name}: {f.hint}" for f in answer_fields(notice.answer_schema)]


def email_text(notice: ApprovalNotice, invitation: Invitation) -> str:
    lines = [
        f"Run {notice.run_id} ({notice.agent}) is waiting for your decision at step {notice.step}.",
        "",
        notice.prompt,
        "",
    ]
    if notice.details:
        lines += ["Details:", *(f"  {k}: {_detail(v)}" for k, v in notice.details.items()), ""]
    wanted = _wanted(notice)
    if wanted:
        lines += ["To approve, answer on the page:", *(f"  {w}" for w in wanted), ""]
    if notice.recent:
        lines += ["Last steps:"]
        lines += [f"  {r.step}. {r.tool}: {r.result}" for r in notice.recent]
        lines += [""]
    lines += [
        f"Goal: {notice.goal[:500]}",
        "",
        "Open this link to approve or reject (it asks you to confirm; opening it decides nothing):",
        invitation.url,
        "",
        f"The request expires at {_when(notice)}. The link is yours alone: it decides in the "
        f"name of {invitation.recipient}.",
    ]
    return "\n".join(lines) + "\n"


def email_html(notice: ApprovalNotice, invitation: Invitation) -> str:
    e = html.escape
    details = "".join(
        f"<tr><th align='left' style='padding-right:12px'>{e(str(k))}</th>"
        f"<td><code>{e(_detail(v))}</code></td></tr>"
        for k, v in notice.details.items()
    )
    recent = "".join(f"<li><b>{r.step}. {e(r.tool)}</b>: {e(r.result)}</li>" for r in notice.recent)
    return (
        "<!doctype html><html><body style='font-family:sans-serif;max-width:640px'>"
        f"<p>Run <b>{e(notice.run_id)}</b> ({e(notice.agent)}) is waiting for your decision "
        f"at step {notice.step}.</p>"
        f"<h2 style='font-size:18px'>{e(notice.prompt)}</h2>"
        + (f"<table>{details}</table>" if details else "")
        + (
            "<p>To approve, answer on the page:</p><ul>"
            + "".join(f"<li>{e(w)}</li>" for w in _wanted(notice))
            + "</ul>"
            if notice.answer_schema is not None
            else ""
        )
        + (f"<p>Last steps:</p><ul>{recent}</ul>" if recent else "")
        + f"<p style='color:#555'>Goal: {e(notice.goal[:500])}</p>"
        f"<p><a href='{e(invitation.url)}' style='display:inline-block;padding:10px 18px;"
        "background:#1a73e8;color:#fff;text-decoration:none;border-radius:4px'>"
        "Review and decide</a></p>"
        f"<p style='color:#555;font-size:13px'>Opening the link decides nothing; you confirm "
        f"on the page. It expires at {e(_when(notice))} and decides in the name of "
        f"{e(invitation.recipient)}: do not forward it.</p>"
        "</body></html>"
    )


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_PARTIAL_ESCAPE = re.compile(r"&[a-z]{0,3}$")


def _slack_clip(text: str, limit: int = _SLACK_TEXT_CHARS) -> str:
    """At most `limit` characters of escaped mrkdwn, never cut inside an escape."""
    if len(text) <= limit:
        return text
    return _PARTIAL_ESCAPE.sub("", text[: limit - 1]) + "…"


def slack_text(notice: ApprovalNotice) -> str:
    """The message's `text`: Slack shows it in notifications, and parses mentions in it."""
    return _slack_escape(notice.subject)


def slack_button_value(notice: ApprovalNotice) -> str:
    return json.dumps({"run_id": notice.run_id, "approval_id": notice.approval_id})


def slack_blocks(notice: ApprovalNotice) -> list[dict[str, Any]]:
    s = _slack_escape
    body = f"*{s(notice.prompt)}*\nRun `{s(notice.run_id)}` ({s(notice.agent)}), step {notice.step}"
    if notice.details:
        body += "\n" + "\n".join(
            f"• {s(str(k))}: `{s(_detail(v))}`" for k, v in notice.details.items()
        )
    wanted = _wanted(notice)
    if wanted:
        body += "\nTo approve, answer on the page:\n" + "\n".join(f"• {s(w)}" for w in wanted)
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": _slack_clip(body)}}
    ]
    if notice.recent:
        recent = "\n".join(f"{r.step}. {s(r.tool)}: {s(r.result)}" for r in notice.recent)
        blocks.append(
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": _slack_clip(f"Last steps:\n{recent}")}],
            }
        )
    value = slack_button_value(notice)
    # A button carries no answer (a modal could; none is built): a request that asks for one
    # links to its page instead, and only Reject stays a button.
    approve: dict[str, Any] = (
        {
            "type": "button",
            "action_id": SLACK_ANSWER,
            "style": "primary",
            "text": {"type": "plain_text", "text": "Answer on the page"},
            "url": notice.slack_invitation.url,
        }
        if notice.slack_invitation is not None
        else {
            "type": "button",
            "action_id": SLACK_APPROVE,
            "style": "primary",
            "text": {"type": "plain_text", "text": "Approve"},
            "value": value,
        }
    )
    blocks += [
        {
            "type": "actions",
            "block_id": "ratchet_decision",
            "elements": [
                approve,
                {
                    "type": "button",
                    "action_id": SLACK_REJECT,
                    "style": "danger",
                    "text": {"type": "plain_text", "text": "Reject"},
                    "value": value,
                },
            ],
        },
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": f"Expires {s(_when(notice))}"}],
        },
    ]
    return blocks


def slack_outcome_blocks(text: str) -> list[dict[str, Any]]:
    """What the message becomes once decided (or found expired): no buttons left."""
    return [
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _slack_clip(_slack_escape(text))},
        }
    ]
