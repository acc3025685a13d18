"""The public approval routes: the page behind a signed link, and Slack's buttons.

    GET  /approvals/{id}?run=&to=&exp=&sig=   show the request; changes nothing (mail scanners
                                              and link unfurlers fetch every link they see)
    POST /approvals/{id}?...                  decide, once: form fields `decision`, `comment`,
                                              and `answer.<field>` for a request that asks
                                              for a structured answer (typed here, checked
                                              on the desk's one path; a refusal shows the
                                              form again, naming the field)
    POST /slack/interactions                  a verified Slack user pressed Approve or Reject

These routes carry no AWS credentials (a person clicking a link has none): the link's
signature, Slack's request signature, throttling and unguessable ids protect them, and there
is no route that lists anything. The same app serves `ratchet serve` locally; the Lambda
function is `ratchet.handlers.approvals`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from pydantic import SecretStr

from ratchet.approvals import pages
from ratchet.approvals.answers import FORM_PREFIX, MAX_ANSWER_FIELDS, answer_from_form
from ratchet.approvals.desk import ApprovalDesk
from ratchet.approvals.slack import SlackAction, parse_action, verify_request
from ratchet.errors import (
    AnswerInvalid,
    ApprovalClosed,
    ApprovalDecided,
    ApprovalError,
    ApprovalExpired,
    ApprovalNotFound,
    LinkInvalid,
    LinkOfAnotherStore,
    RunNotFound,
)

if TYPE_CHECKING:
    from ratchet.adapters.slack import SlackResponder
from ratchet.waits import MAX_COMMENT_CHARS, Verdict
from ratchet.web.outages import Outage, answer_outages, outage_words

MAX_FORM_BYTES = 128 * 1024
"""A 10,000-character comment, each character up to 4 bytes of UTF-8 sent as %XX."""

_TITLES: dict[type[ApprovalError], str] = {
    LinkInvalid: "This link is not valid",
    LinkOfAnotherStore: "This link belongs to another Ratchet store",
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
    resumes: str = pages.RESUMES
    """What the page says happens once a person decided (locally with no worker, what to
    run for the run to go on)."""


def build_app(services: Callable[[], ApprovalServices]) -> APIGatewayRestResolver:
    app = APIGatewayRestResolver()
    routes = ApprovalRoutes(app, services)
    app.get("/approvals/<approval_id>")(routes.show)
    app.post("/approvals/<approval_id>")(routes.decide)
    app.post("/slack/interactions")(routes.slack_interaction)
    # A store out of reach: a page is read once more, a decision answered 503 (a decision the
    # store or the resumer turned away was undone, the request pending again: the person may
    # send it again).
    answer_outages(app, "the approval pages", _outage, lambda: services().logger)
    return app


class ApprovalRoutes:
    """The approval routes: each reads the request from `app` and decides through the
    approval desk of the runtime's services (`build_app` registers them)."""

    def __init__(
        self, app: APIGatewayRestResolver, services: Callable[[], ApprovalServices]
    ) -> None:
        self.app = app
        self.services = services

    def show(self, approval_id: str) -> Response[str]:
        """The request's page, or why it cannot be decided; it changes nothing."""
        try:
            view = self.services().desk.view(approval_id, self._link_query())
        except ApprovalError as error:
            return _problem(error)
        if view.approval.status.is_decided:
            return _html(HTTPStatus.CONFLICT, pages.outcome_page(view, just_now=False))
        if not view.run_waits_for_it:
            return _problem(ApprovalClosed("the run went on; this request no longer applies"))
        return _html(HTTPStatus.OK, pages.request_page(view, action=_self_url(self.app)))

    def decide(self, approval_id: str) -> Response[str]:
        """The form's decision, once; a structured answer the question's schema refuses
        shows the form again, naming the field."""
        try:
            query = self._link_query()
            approved, comment, form = _read_form(self.app.current_event.decoded_body or "")
            desk = self.services().desk
            asked = desk.view(approval_id, query)
            schema = pages.answer_schema_of(asked) if approved else None
            # The form's answer is typed here and checked on the desk's path: either refusal
            # shows the form again, naming the field.
            try:
                answer = answer_from_form(schema, form) if schema is not None else None
                view = desk.decide_by_link(asked, approved=approved, comment=comment, answer=answer)
            except AnswerInvalid as refused:
                page = pages.request_page(
                    asked, action=_self_url(self.app), refused=str(refused), given=form
                )
                return _html(HTTPStatus.BAD_REQUEST, page)
        except ApprovalError as error:
            return _problem(error)
        except RunNotFound as gone:
            return _problem(ApprovalClosed(str(gone)))
        # What was asked is the request as the person saw it: the run has moved on since.
        reply = pages.asks_for_reply(asked)
        resumes = self.services().resumes
        page = pages.outcome_page(view, just_now=True, reply=reply, resumes=resumes)
        return _html(HTTPStatus.OK, page)

    def slack_interaction(self) -> Response[str]:
        """A button pressed in Slack, by a user Slack's signature vouches for."""
        wired = self.services()
        if wired.slack_signing_secret is None:
            return Response(status_code=HTTPStatus.NOT_FOUND, body="")
        secret = wired.slack_signing_secret.get_secret_value()
        try:
            action = _verified_action(self.app.current_event, secret, wired.desk.clock())
        except ApprovalError as refused:
            return Response(status_code=refused.http_status, body="")
        text = _decide_in_slack(wired.desk, action)
        if action.response_url and wired.slack_responder is not None:
            _replace_message(wired.slack_responder, action.response_url, text, wired.logger)
        # Slack wants a 200 within 3 s; the message itself is replaced via response_url.
        return Response(status_code=HTTPStatus.OK, body="")

    def _link_query(self) -> dict[str, str]:
        multi = self.app.current_event.multi_value_query_string_parameters or {}
        if any(len(values) != 1 for values in multi.values()):
            raise LinkInvalid("the link has been changed")
        return {name: values[0] for name, values in multi.items()} or dict(
            self.app.current_event.query_string_parameters or {}
        )


def _html(status: int, body: str) -> Response[str]:
    return Response(status_code=status, headers=dict(pages.HEADERS), body=body)


def _outage(error: Outage) -> Response[str]:
    return _html(HTTPStatus.SERVICE_UNAVAILABLE, pages.problem_page(*outage_words(error)))


def _problem(error: ApprovalError) -> Response[str]:
    title = _TITLES.get(type(error), "This request cannot be decided")
    return _html(error.http_status, pages.problem_page(title, str(error)))


def _verified_action(event: APIGatewayProxyEvent, secret: str, now: datetime) -> SlackAction:
    """The button pressed, once the request's signature is checked (`ApprovalError` if it
    fails, or the body is no button press)."""
    body = event.decoded_body or ""
    verify_request(
        secret,
        timestamp=event.headers.get("X-Slack-Request-Timestamp")
        or event.headers.get("x-slack-request-timestamp"),
        signature=event.headers.get("X-Slack-Signature") or event.headers.get("x-slack-signature"),
        body=body.encode("utf-8"),
        now=now.timestamp(),
    )
    return parse_action(body)


def _decide_in_slack(desk: ApprovalDesk, action: SlackAction) -> str:
    """Decide as the button says; what the Slack message should say now."""
    try:
        view = desk.decide_by_id(
            action.run_id,
            action.approval_id,
            Verdict(approved=action.approved, by=action.by),
            channel="slack",
        )
    except ApprovalError as error:
        return f"{_TITLES.get(type(error), 'Not decided')}: {error}"
    except RunNotFound as gone:
        return f"The run is gone: {gone}"
    text = f"{'Approved' if action.approved else 'Rejected'} by {action.by}"
    return text + f": run {view.approval.run_id}, step {view.approval.step}"


def _replace_message(responder: SlackResponder, response_url: str, text: str, logger: Any) -> None:
    try:
        responder.replace(response_url, text)
    except Exception as failed:  # the decision stands; the message is cosmetic
        if logger is not None:
            logger.warning("slack message not updated", extra={"error": type(failed).__name__})


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
