"""Slack interactivity: verify that a request comes from Slack, and read which button a
verified user pressed.

Slack signs every request: `X-Slack-Signature: v0=<hex>` is HMAC-SHA256 of
`v0:<X-Slack-Request-Timestamp>:<raw body>` with the app's signing secret. A request more than
five minutes old is refused, so a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import parse_qs

from ratchet.approvals.messages import SLACK_ANSWER, SLACK_APPROVE, SLACK_REJECT
from ratchet.errors import ApprovalError
from ratchet.untrusted import loads

MAX_AGE_SECONDS = 5 * 60


class SlackRequestRefused(ApprovalError):
    """Not a genuine, fresh request from Slack."""

    http_status = 401


class SlackPayloadInvalid(ApprovalError):
    http_status = 400


class SlackLinkPressed(ApprovalError):
    """The "Answer on the page" link button: Slack opened the page and tells us; nothing to
    decide here, and Slack wants a 200."""

    http_status = 200


def verify_request(
    signing_secret: str,
    *,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    now: float,
) -> None:
    if not timestamp or not signature:
        raise SlackRequestRefused("missing Slack signature headers")
    try:
        sent = int(timestamp)
    except ValueError:
        raise SlackRequestRefused("malformed Slack timestamp") from None
    if abs(now - sent) > MAX_AGE_SECONDS:
        raise SlackRequestRefused("stale Slack request (over 5 minutes old)")
    base = b"v0:" + timestamp.encode() + b":" + body
    expected = "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogatepass")):
        raise SlackRequestRefused("bad Slack signature")


@dataclass(frozen=True)
class SlackAction:
    run_id: str
    approval_id: str
    approved: bool
    user_id: str
    user_name: str
    response_url: str | None

    @property
    def by(self) -> str:
        return f"@{self.user_name}"


def parse_action(body: str) -> SlackAction:
    """The button press in a `block_actions` payload (form field `payload`, JSON)."""
    try:
        (raw,) = parse_qs(body, strict_parsing=True)["payload"]
        # Signed by Slack, but bounded all the same: `json` recurses (a ValueError if not).
        payload = loads(raw, field="payload")
        if any(a.get("action_id") == SLACK_ANSWER for a in payload["actions"]):
            raise SlackLinkPressed("the page takes the answer")
        (action,) = [
            a for a in payload["actions"] if a.get("action_id") in (SLACK_APPROVE, SLACK_REJECT)
        ]
        value = loads(action["value"], field="value")
        user = payload["user"]
        user_id = str(user["id"])
        name = str(user.get("username") or user.get("name") or user_id)
        response_url = payload.get("response_url")
        return SlackAction(
            run_id=str(value["run_id"]),
            approval_id=str(value["approval_id"]),
            approved=action["action_id"] == SLACK_APPROVE,
            user_id=user_id,
            user_name=name[:100],
            response_url=str(response_url) if response_url else None,
        )
    except (KeyError, ValueError, TypeError, AttributeError):
        raise SlackPayloadInvalid("not a Ratchet approval button press") from None
