"""Slack over its Web API: post the request with its buttons (`chat.postMessage`, bot token),
and replace the message once decided (the interaction's `response_url`).

Plain HTTPS with the standard library: two JSON POSTs do not justify a client library in the
Lambda bundle.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from pydantic import SecretStr

from ratchet.approvals.messages import slack_blocks, slack_outcome_blocks, slack_text
from ratchet.waits import ApprovalNotice

SLACK_API_URL = "https://slack.com/api"
POST_TIMEOUT_SECONDS = 5.0
RESPOND_TIMEOUT_SECONDS = 2.0
"""Slack wants the interaction answered within 3 s, and the message is replaced before that."""


class SlackError(RuntimeError):
    pass


def _post_json(
    url: str, payload: dict[str, Any], *, timeout: float, token: SecretStr | None = None
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token.get_secret_value()}"
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode("utf-8"), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()
    except (urllib.error.URLError, TimeoutError) as error:
        raise SlackError(f"Slack could not be reached: {type(error).__name__}") from None


class SlackNotifier:
    def __init__(self, token: SecretStr, *, api_url: str = SLACK_API_URL) -> None:
        self._token = token
        self._api_url = api_url.rstrip("/")

    def send(self, notice: ApprovalNotice) -> None:
        if notice.slack_channel:
            self.post_message(notice.slack_channel, slack_text(notice), slack_blocks(notice))

    def post_message(self, channel: str, text: str, blocks: list[dict[str, Any]]) -> str:
        """Post and return the message's `ts`. Slack answers 200 with `ok: false` on errors."""
        status, body = _post_json(
            f"{self._api_url}/chat.postMessage",
            {"channel": channel.lstrip("#"), "text": text, "blocks": blocks},
            timeout=POST_TIMEOUT_SECONDS,
            token=self._token,
        )
        try:
            answer = json.loads(body)
        except ValueError:
            raise SlackError(f"chat.postMessage answered {status} without JSON") from None
        if not isinstance(answer, dict) or not answer.get("ok"):
            error = answer.get("error") if isinstance(answer, dict) else None
            raise SlackError(f"chat.postMessage failed: {error or status}")
        return str(answer.get("ts", ""))


class SlackResponder:
    """Replaces the interactive message through the interaction's `response_url` (it needs
    no token). `allow_http` is for tests against a local server; Slack's URLs are https."""

    def __init__(self, *, allow_http: bool = False) -> None:
        self._schemes = ("https://", "http://") if allow_http else ("https://",)

    def replace(self, response_url: str, text: str) -> None:
        if not response_url.startswith(self._schemes):
            raise SlackError("refusing a response_url that is not https")
        status, _ = _post_json(
            response_url,
            {"replace_original": True, "text": text, "blocks": slack_outcome_blocks(text)},
            timeout=RESPOND_TIMEOUT_SECONDS,
        )
        if status >= 300:
            raise SlackError(f"response_url answered {status}")
