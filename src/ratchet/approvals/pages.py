"""The approval page: HTML that works with no script, shows what the agent asks, and decides
only through its form's POST. Everything from the run is escaped."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.approvals.answers import FORM_PREFIX, AnswerField, answer_fields
from ratchet.approvals.desk import ApprovalView, decided_text, steps_before
from ratchet.state import ApprovalRequest
from ratchet.waits import MAX_COMMENT_CHARS, ApprovalStatus

HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    # The link is a credential: keep it out of caches, referrers and frames.
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "X-Robots-Tag": "noindex, nofollow",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
}

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;background:#f4f5f7;margin:0;
color:#1d2330}
main{max-width:680px;margin:40px auto;background:#fff;border-radius:8px;padding:28px 32px;
box-shadow:0 1px 3px rgba(0,0,0,.12)}
h1{font-size:22px;margin:0 0 8px}.meta{color:#5b6475;font-size:14px;margin:0 0 20px}
table{border-collapse:collapse;margin:12px 0;width:100%}th,td{text-align:left;padding:6px 8px;
border-bottom:1px solid #e6e8ec;vertical-align:top;font-size:14px}th{width:30%;color:#5b6475}
code{white-space:pre-wrap;word-break:normal;overflow-wrap:break-word}
ul.steps{list-style:none;padding-left:0;font-size:14px;color:#394150}ul.steps li{margin:3px 0}
label{font-size:14px;font-weight:600;color:#394150}
textarea{width:100%;box-sizing:border-box;min-height:80px;font:inherit;padding:8px}
.buttons{display:flex;gap:12px;margin-top:14px}button{font:inherit;font-size:16px;
padding:10px 22px;border:0;border-radius:6px;cursor:pointer;color:#fff}
.approve{background:#1e7e34}.reject{background:#b3261e}.note{color:#5b6475;font-size:13px}
.banner{padding:12px 14px;border-radius:6px;margin:12px 0;font-size:15px}
.ok{background:#e6f4ea}.bad{background:#fce8e6}.info{background:#e8f0fe}
fieldset{border:1px solid #e6e8ec;border-radius:6px;margin:0 0 14px;padding:10px 14px}
legend{font-weight:600;font-size:15px}.field{margin:8px 0}.field label{display:block}
.field input,.field select{font:inherit;padding:6px 8px;margin-top:4px;min-width:12em}
"""


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<meta name='robots' content='noindex'><title>{html.escape(title)} · Ratchet</title>"
        f"<style>{_STYLE}</style></head><body><main>{body}</main></body></html>"
    )


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return html.escape(text)


@dataclass(frozen=True)
class _Asked:
    """What the request asked: its question, the call that asked and the request's details."""

    prompt: str
    details: Mapping[str, Any]
    tool: str | None
    arguments: Mapping[str, Any]


def _asked(view: ApprovalView) -> _Asked:
    """The request as the waiting run holds it, or, once the run has moved on (decided), as
    the request kept it when it was opened."""
    approval, run = view.approval, view.run
    call = next((m for m in (run.messages if run else ()) if m.step == approval.step), None)
    tool = approval.tool or (call.tool if call else None)
    arguments = approval.arguments or (call.arguments if call and not approval.tool else {})
    if view.run_waits_for_it and run is not None and run.waiting is not None:
        request = run.waiting.request
        if isinstance(request, ApprovalRequest):
            return _Asked(request.prompt, request.details, tool, arguments)
    return _Asked(approval.prompt or "Approval request", approval.details, tool, arguments)


def _call_text(tool: str, arguments: Mapping[str, Any]) -> str:
    """`refund(order_id="A-1", amount=120)`, escaped, with a break opportunity after each
    comma, so a narrow page wraps it between arguments and never inside a name."""
    pairs = (
        html.escape(f"{name}={json.dumps(value, ensure_ascii=False, default=str)}")
        for name, value in arguments.items()
    )
    return f"{html.escape(tool)}({',<wbr> '.join(pairs)})"


def _request_summary(view: ApprovalView) -> str:
    e = html.escape
    approval, run = view.approval, view.run
    asked = _asked(view)
    verb = "asked" if approval.status.is_decided else "asks"
    agent = f", agent {e(run.agent)}," if run is not None else ""
    parts = [
        f"<p class='meta' id='asker'>Step {approval.step} of run <b>{e(approval.run_id)}</b>"
        f"{agent} {verb}:</p>",
        f"<h1>{e(asked.prompt)}</h1>",
    ]
    rows = []
    if asked.tool:
        call = _call_text(asked.tool, asked.arguments)
        rows.append(f"<tr><th>tool call</th><td><code class='call'>{call}</code></td></tr>")
    rows += [
        f"<tr><th>{e(str(k))}</th><td><code>{_value(v)}</code></td></tr>"
        for k, v in asked.details.items()
    ]
    if rows:
        parts.append(f"<table id='asked'>{''.join(rows)}</table>")
    # The steps the request kept when it was opened, so the page shows, decided, what the
    # person saw pending: by then the run's window has moved on past some of them. A request
    # an older Ratchet opened kept none: the window, as it stands, is all there is.
    recent = approval.recent or (steps_before(run, approval.step) if run is not None else [])
    if recent:
        items = "".join(
            f"<li>Step {r.step}, <b>{e(r.tool)}</b>: {e(r.result)}</li>" for r in recent
        )
        parts.append(
            f"<p class='note'>The last steps before step {approval.step}:</p>"
            f"<ul class='steps' id='before'>{items}</ul>"
        )
    if run is not None:
        parts.append(f"<p class='note'>Goal: {e(run.goal[:500])}</p>")
    return "".join(parts)


def answer_schema_of(view: ApprovalView) -> dict[str, Any] | None:
    """The schema of the answer the waiting request asks for, if it asks for one."""
    run = view.run
    if run is None or run.waiting is None or run.step != view.approval.step:
        return None
    return run.waiting.request.answer_schema


def asks_for_reply(view: ApprovalView) -> bool:
    """Whether the waiting request asks for a reply (`wait_for_reply`), not an approval."""
    run = view.run
    if run is None or run.waiting is None or run.step != view.approval.step:
        return False
    return bool(getattr(run.waiting.request, "reply", False))


def _answer_fieldset(
    schema: dict[str, Any], given: Mapping[str, Sequence[str]], *, reply: bool = False
) -> str:
    """A form field per answer field. The browser's own checks are off (the form is
    `novalidate`): the server checks every answer, and its refusal names the field."""
    rows = "".join(_answer_input(f, given.get(FORM_PREFIX + f.name)) for f in answer_fields(schema))
    legend = "Your reply" if reply else "Your answer (needed to approve)"
    return f"<fieldset><legend>{legend}</legend>{rows}</fieldset>"


def _answer_input(field: AnswerField, given: Sequence[str] | None) -> str:
    e = html.escape
    name = FORM_PREFIX + field.name
    ident = e("answer-" + field.name)
    label = e(field.title) + ("" if field.required else " (optional)")
    if given:
        value = given[0]
    elif field.has_default and field.default is not None:
        value = field.default if isinstance(field.default, str) else json.dumps(field.default)
    else:
        value = ""
    s = field.schema
    if field.kind == "choice":
        # Nothing chosen is a choice only where the field may be left out with no default.
        settled = field.required or (field.has_default and field.default is not None)
        options = "" if settled else "<option value=''>—</option>"
        for choice in field.choices:
            encoded = json.dumps(choice, ensure_ascii=False)
            chosen = " selected" if encoded == value or choice == value else ""
            shown = choice if isinstance(choice, str) else encoded
            options += f"<option value='{e(encoded)}'{chosen}>{e(shown)}</option>"
        control = f"<select id='{ident}' name='{e(name)}'>{options}</select>"
    elif field.kind == "boolean":
        ticked = (
            " checked"
            if (given and given[-1] in ("true", "on")) or (not given and field.default is True)
            else ""
        )
        control = f"<input type='checkbox' id='{ident}' name='{e(name)}' value='true'{ticked}>"
    elif field.kind in ("integer", "number"):
        bounds = "".join(
            f" {attr}='{e(str(s[key]))}'"
            for attr, key in (("min", "minimum"), ("max", "maximum"))
            if key in s
        )
        step = "1" if field.kind == "integer" else "any"
        control = (
            f"<input type='number' id='{ident}' name='{e(name)}' step='{step}'{bounds} "
            f"value='{e(value)}'>"
        )
    elif field.kind == "string":
        control = f"<input type='text' id='{ident}' name='{e(name)}' value='{e(value)}'>"
    else:
        control = f"<textarea id='{ident}' name='{e(name)}'>{e(value)}</textarea>"
    note = f"<span class='note'> {e(field.hint)}</span>"
    about = f"<div class='note'>{e(field.description)}</div>" if field.description else ""
    return f"<div class='field'><label for='{ident}'>{label}{note}</label>{control}{about}</div>"


def request_page(
    view: ApprovalView,
    action: str,
    *,
    refused: str | None = None,
    given: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The pending request with its form. `action` is the link itself: the POST carries the
    same signed query, and nothing else in the form is trusted but the choice, the comment
    and the answer (checked against the request's schema). `refused` shows why the last
    answer was not taken, with the form as it was (`given`)."""
    e = html.escape
    who = e(view.recipient or "")
    given = given or {}
    schema = answer_schema_of(view)
    reply = asks_for_reply(view)
    comment = (given.get("comment") or [""])[0]
    send, decline = ("Send reply", "Decline") if reply else ("Approve", "Reject")
    banner = (
        f"<div class='banner bad' role='alert'><b>Not decided:</b> {e(refused)}. "
        "Nothing was changed.</div>"
        if refused
        else ""
    )
    form = (
        banner
        + f"<form method='post' action='{e(action)}'"
        + (
            " novalidate>" + _answer_fieldset(schema, given, reply=reply)
            if schema is not None
            else ">"
        )
        + f"<label for='comment'>Comment (optional)</label>"
        f"<textarea id='comment' name='comment' maxlength='{MAX_COMMENT_CHARS}'>"
        f"{e(comment)}</textarea>"
        "<div class='buttons'>"
        f"<button class='approve' type='submit' name='decision' value='approve'>{send}</button>"
        f"<button class='reject' type='submit' name='decision' value='reject'>{decline}</button>"
        "</div></form>"
        f"<p class='note'>You decide as <b>{who}</b>. Nothing happens until you press a "
        "button; each request can be decided once. It expires "
        f"{e(view.approval.expires_at.strftime('%Y-%m-%d %H:%M UTC'))}.</p>"
    )
    return _page("Reply needed" if reply else "Approval needed", _request_summary(view) + form)


RESUMES = "The run resumes with your answer."


def outcome_page(
    view: ApprovalView, *, just_now: bool, reply: bool = False, resumes: str = RESUMES
) -> str:
    """What the decision did (`just_now`), or what it was; `reply` for a `wait_for_reply`
    request, as the person saw it before deciding. `resumes` says what happens next (locally
    with no worker, what to run)."""
    approval = view.approval
    approved = approval.status is ApprovalStatus.APPROVED
    if just_now:
        if reply:
            verb = "Reply sent" if approved else "Declined"
        else:
            verb = "Approved" if approved else "Rejected"
        when = approval.decided_at.strftime(" at %Y-%m-%d %H:%M UTC") if approval.decided_at else ""
        banner = (
            f"<div class='banner {'ok' if approved else 'bad'}' id='decided'>{verb} by "
            f"{html.escape(approval.decided_by or '')}{when}. {html.escape(resumes)}</div>"
        )
        title = verb
    else:
        said = html.escape(decided_text(approval))
        banner = (
            f"<div class='banner info' id='decided'><b>Already decided.</b> This request was "
            f"{said}.</div>"
        )
        title = "Already decided"
    if approval.answer is not None:
        rows = "".join(
            f"<tr><th>{html.escape(str(k))}</th><td><code>{_value(v)}</code></td></tr>"
            for k, v in approval.answer.items()
        )
        banner += f"<p class='note'>Answer:</p><table class='answer'>{rows}</table>"
    if approval.comment:
        banner += f"<p class='note'>Comment: {html.escape(approval.comment)}</p>"
    # Who decided and when first, then what they decided on: the request as it was asked.
    return _page(title, banner + _request_summary(view))


def problem_page(title: str, message: str) -> str:
    return _page(
        title,
        f"<h1>{html.escape(title)}</h1><div class='banner bad'>{html.escape(message)}</div>"
        "<p class='note'>Nothing was changed.</p>",
    )
