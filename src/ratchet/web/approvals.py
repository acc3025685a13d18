"""The public approval routes: the page behind a signed link, and Slack's buttons.

    GET  /approvals/{id}?run=&to=&exp=&sig=   show the request; changes nothing (mail scanners
                                              and link unfurlers fetch every link they see)
    POST /approvals/{id}?...                  decide, once: form fields `decision`, `comment`,
                                              and `answer.<field>` for a request that asks
                                              for a structured answer (checked here; a
                                              refusal shows the form again, naming the field)
    POST /slack/interactions                  a verified Slack user pressed Approve or Reject

These routes carry no AWS credentials (a person clicking a link has none): the link's
signature, Slack's request signature, throttling and unguessable ids protect them, and there
is no route that lists anything. The same app serves `ratchet serve` locally; the Lambda function is
`ratchet.handlers.approvals`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from pydantic import SecretStr

from ratchet.adapters.slack import SlackResponder
from ratchet.approvals import pages
from ratchet.approvals.answers import FORM_PREFIX, MAX_ANSWER_FIELDS, answer_from_form
from ratchet.approvals.desk import ApprovalDesk
from ratchet.approvals.slack import parse_action, verify_request
from ratchet.errors import (
    AnswerInvalid,
    ApprovalClosed,
    ApprovalDecided,
    ApprovalError,
    ApprovalExpired,
    ApprovalNotFound,
    LinkInvalid,
    RunNotFound,
    StoreBusy,
)
from ratchet.waits import MAX_COMMENT_CHARS, Verdict

MAX_FORM_BYTES = 128 * 1024
"""A 10,000-character comment, each character up to 4 bytes of UTF-8 sent as %XX."""

_TITLES: dict[type[ApprovalError], str] = {
    LinkInvalid: "This link is not valid",
    ApprovalExpired: "This request has expired",
    ApprovalNotFound: "No such request",
    ApprovalDecided: "Already decided",
    ApprovalClosed: "The run is no longer waiting",
}


@dataclass(frozen=True)
class ApprovalServices:
    desk: ApprovalDesk
    slack_signing_secret: SecretStr | None = None
    slack_responder: SlackResponder | None = None
    logger: Any = None


def build_app(services: Callable[[], ApprovalServices]) -> APIGatewayRestResolver:
    app = APIGatewayRestResolver()

    def html(status: int, body: str) -> Response[str]:
        return Response(status_code=status, headers=dict(pages.HEADERS), body=body)

    def problem(error: ApprovalError) -> Response[str]:
        title = _TITLES.get(type(error), "This request cannot be decided")
        return html(error.http_status, pages.problem_page(title, str(error)))

    def link_query() -> dict[str, str]:
        multi = app.current_event.multi_value_query_string_parameters or {}
        if any(len(values) != 1 for values in multi.values()):
            raise LinkInvalid("the link has been changed")
        return {name: values[0] for name, values in multi.items()} or dict(
            app.current_event.query_string_parameters or {}
        )

    @app.get("/approvals/<approval_id>")
    def show(approval_id: str) -> Response[str]:
        try:
            view = services().desk.view(approval_id, link_query())
        except ApprovalError as error:
            return problem(error)
        if view.approval.status.is_decided:
            return html(HTTPStatus.CONFLICT, pages.outcome_page(view, just_now=False))
        if not view.run_waits_for_it:
            return problem(ApprovalClosed("the run went on; this request no longer applies"))
        return html(HTTPStatus.OK, pages.request_page(view, action=_self_url(app)))

    @app.post("/approvals/<approval_id>")
    def decide(approval_id: str) -> Response[str]:
        try:
            query = link_query()
            approved, comment, form = _read_form(app.current_event.decoded_body or "")
            desk = services().desk
            asked = desk.view(approval_id, query)
            schema = pages.answer_schema_of(asked) if approved else None
            # The form's answer is typed here and checked on the desk's path: either refusal
            # shows the form again, naming the field.
            try:
                answer = answer_from_form(schema, form) if schema is not None else None
                view = desk.decide_by_link(asked, approved=approved, comment=comment, answer=answer)
            except AnswerInvalid as refused:
                page = pages.request_page(
                    asked, action=_self_url(app), refused=str(refused), given=form
                )
                return html(HTTPStatus.BAD_REQUEST, page)
        except ApprovalError as error:
            return problem(error)
        except RunNotFound as gone:
            return problem(ApprovalClosed(str(gone)))
        except StoreBusy:
            # The decision was undone (the request is pending again): the person may retry.
            page = pages.problem_page("Busy, please try again", "AWS is busy for the moment.")
            return html(HTTPStatus.SERVICE_UNAVAILABLE, page)
        return html(HTTPStatus.OK, pages.outcome_page(view, just_now=True))

    @app.post("/slack/interactions")
    def slack() -> Response[str]:
        wired = services()
        if wired.slack_signing_secret is None:
            return Response(status_code=HTTPStatus.NOT_FOUND, body="")
        event = app.current_event
        body = event.decoded_body or ""
        try:
            verify_request(
                wired.slack_signing_secret.get_secret_value(),
                timestamp=event.headers.get("X-Slack-Request-Timestamp")
                or event.headers.get("x-slack-request-timestamp"),
                signature=event.headers.get("X-Slack-Signature")
                or event.headers.get("x-slack-signature"),
                body=body.encode("utf-8"),
                now=wired.desk.clock().timestamp(),
            )
            action = parse_action(body)
        except ApprovalError as refused:
            return Response(status_code=refused.http_status, body="")
        try:
            view = wired.desk.decide_by_id(
                action.run_id,
                action.approval_id,
                Verdict(approved=action.approved, by=action.by),
                channel="slack",
            )
            text = f"{'Approved' if action.approved else 'Rejected'} by {action.by}"
            text += f": run {view.approval.run_id}, step {view.approval.step}"
        except ApprovalError as error:
            text = f"{_TITLES.get(type(error), 'Not decided')}: {error}"
        except RunNotFound as gone:
            text = f"The run is gone: {gone}"
        if action.response_url and wired.slack_responder is not None:
            try:
                wired.slack_responder.replace(action.response_url, text)
            except Exception as failed:  # the decision stands; the message is cosmetic
                if wired.logger is not None:
                    wired.logger.warning(
                        "slack message not updated", extra={"error": type(failed).__name__}
                    )
        # Slack wants a 200 within 3 s; the message itself is replaced via response_url.
        return Response(status_code=HTTPStatus.OK, body="")

    return app


def _read_form(body: str) -> tuple[bool, str, dict[str, list[str]]]:
    """The decision, the comment, and every field (the answer's are typed by its schema)."""
    if len(body.encode("utf-8")) > MAX_FORM_BYTES:
        raise _BadForm("the form is too large")
    try:
        fields = parse_qs(body, keep_blank_values=True, max_num_fields=8 + MAX_ANSWER_FIELDS)
    except ValueError:
        raise _BadForm("the form could not be read") from None
    # Other fields are ignored (who decides comes from the link, never the form), but only a
    # few: the answer's own fields are bounded by its schema.
    if sum(len(v) for k, v in fields.items() if not k.startswith(FORM_PREFIX)) > 8:
        raise _BadForm("the form has too many fields")
    decisions = fields.get("decision", [])
    comments = fields.get("comment", [""])
    if len(decisions) != 1 or decisions[0] not in ("approve", "reject") or len(comments) != 1:
        raise _BadForm("choose Approve or Reject")
    comment = comments[0].strip()
    if len(comment) > MAX_COMMENT_CHARS:
        raise _BadForm(f"the comment is over {MAX_COMMENT_CHARS:,} characters")
    return decisions[0] == "approve", comment, fields


class _BadForm(ApprovalError):
    http_status = 400


def _self_url(app: APIGatewayRestResolver) -> str:
    """The form posts back to the link it was opened from, relative to the page (the stage
    prefix on API Gateway, none locally), query and all."""
    event = app.current_event
    query = urlencode(dict(event.query_string_parameters or {}), quote_via=quote)
    last = event.path.rsplit("/", 1)[-1]
    return f"{last}?{query}"
