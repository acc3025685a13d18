"""The notifiers against what they talk to: SES v2 on moto, Slack's Web API and response_url
as a local HTTP server that records each request, and the local outbox on disk."""

from __future__ import annotations

import copy
import hashlib
import json
import socket
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

import boto3
import pytest
from moto import mock_aws
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.ses.models import ses_backends
from pydantic import SecretStr

from ratchet.adapters.outbox import OutboxNotifier
from ratchet.adapters.ses import SesNotifier
from ratchet.adapters.slack import SlackError, SlackNotifier, SlackResponder
from ratchet.approvals.messages import SLACK_APPROVE, SLACK_REJECT, email_html, email_text
from ratchet.waits import ApprovalNotice, Invitation, RecentStep

REGION = "us-east-1"
SENDER = "approvals@example.com"
BOT_TOKEN = SecretStr("xoxb-0000-test-bot-token")


def invitation(recipient: str) -> Invitation:
    """A recipient's own link (its signature stands in for a real one)."""
    return Invitation(
        recipient=recipient,
        url="https://approvals.example.com/approvals/A1b2C3d4E5f6G7h8I9j0Kq?run=run-7f3a"
        f"&to={quote(recipient)}&exp=1772366400"
        f"&sig={hashlib.sha256(recipient.encode()).hexdigest()}",
    )


def notice(**changes: Any) -> ApprovalNotice:
    fields: dict[str, Any] = {
        "approval_id": "A1b2C3d4E5f6G7h8I9j0Kq",
        "run_id": "run-7f3a",
        "step": 42,
        "agent": "migration",
        "goal": "Migrate legacy_orders into orders",
        "prompt": "Drop legacy_orders. All 40 batches are copied",
        "details": {"action": "Drop legacy_orders", "rows": 40_000},
        "recent": [RecentStep(step=41, tool="copy_batch", result="batch 40 copied")],
        "expires_at": datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        "emails": [invitation("dana@example.com"), invitation("lee@example.com")],
        "slack_channel": "#ops",
    }
    return ApprovalNotice(**{**fields, **changes})


# --- SES ---------------------------------------------------------------------------------------


@dataclass
class Ses:
    client: Any
    calls: list[dict[str, Any]]
    """The exact arguments of every SendEmail call, as the SDK received them."""

    @property
    def sent(self) -> list[Any]:
        """What moto's SES accepted (it keeps the HTML body of a message with both)."""
        return list(ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages)


@pytest.fixture(scope="module")
def moto_ses() -> Iterator[Ses]:
    """One moto SES for the module (a client costs a fifth of a second to make)."""
    with mock_aws():
        client = boto3.client("sesv2", region_name=REGION)
        client.create_email_identity(EmailIdentity=SENDER)
        calls: list[dict[str, Any]] = []
        client.meta.events.register(
            "provide-client-params.sesv2.SendEmail",
            lambda params, **_: calls.append(copy.deepcopy(params)),
        )
        yield Ses(client, calls)


@pytest.fixture
def ses(moto_ses: Ses) -> Ses:
    moto_ses.calls.clear()
    ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages.clear()
    return moto_ses


def test_ses_sends_one_email_per_recipient_each_with_their_own_link(ses):
    sent_notice = notice()

    SesNotifier(ses.client, sender=SENDER).send(sent_notice)

    assert [m.destinations for m in ses.sent] == [
        {"ToAddresses": ["dana@example.com"]},
        {"ToAddresses": ["lee@example.com"]},
    ]
    for message, mine in zip(ses.sent, sent_notice.emails, strict=True):
        assert message.source == SENDER
        assert message.subject == sent_notice.subject
        assert message.body == email_html(sent_notice, mine)
        others = [i for i in sent_notice.emails if i != mine]
        assert all(o.recipient not in message.body for o in others)


def test_ses_sends_html_and_plain_text_in_utf8(ses):
    sent_notice = notice(emails=[invitation("dana@example.com")])

    SesNotifier(ses.client, sender=SENDER).send(sent_notice)

    (call,) = ses.calls
    mine = sent_notice.emails[0]
    assert call == {
        "FromEmailAddress": SENDER,
        "Destination": {"ToAddresses": ["dana@example.com"]},
        "Content": {
            "Simple": {
                "Subject": {"Data": sent_notice.subject, "Charset": "UTF-8"},
                "Body": {
                    "Text": {"Data": email_text(sent_notice, mine), "Charset": "UTF-8"},
                    "Html": {"Data": email_html(sent_notice, mine), "Charset": "UTF-8"},
                },
            }
        },
    }
    assert mine.url in call["Content"]["Simple"]["Body"]["Text"]["Data"]


def test_ses_uses_the_configuration_set_when_there_is_one(ses):
    ses.client.create_configuration_set(ConfigurationSetName="ratchet-approvals")

    SesNotifier(ses.client, sender=SENDER, configuration_set="ratchet-approvals").send(notice())

    assert [c["ConfigurationSetName"] for c in ses.calls] == ["ratchet-approvals"] * 2


def test_ses_sends_nothing_when_no_one_has_an_email(ses):
    SesNotifier(ses.client, sender=SENDER).send(notice(emails=[]))

    assert ses.calls == []
    assert ses.sent == []


def test_an_unverified_sender_is_refused_by_ses_and_the_caller_hears_of_it(ses):
    with pytest.raises(Exception, match="MessageRejected"):
        SesNotifier(ses.client, sender="nobody@unverified.example").send(notice())

    assert ses.sent == []


# --- Slack -------------------------------------------------------------------------------------


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class RecordingServer:
    """An HTTP server on 127.0.0.1 that records every POST and answers each with the next
    of `answers` (status and raw body), or `{"ok": true}`."""

    answers: list[tuple[int, bytes]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                recorder.requests.append(Request(self.path, dict(self.headers.items()), body))
                status, answer = (
                    recorder.answers.pop(0)
                    if recorder.answers
                    else (200, b'{"ok": true, "ts": "1700000000.000100"}')
                )
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the test reads `requests`."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def slack() -> Iterator[RecordingServer]:
    server = RecordingServer()
    yield server
    server.close()


def test_slack_posts_the_request_with_its_buttons_to_the_channel_with_the_bot_token(slack):
    sent_notice = notice()

    SlackNotifier(BOT_TOKEN, api_url=slack.url + "/api").send(sent_notice)

    (request,) = slack.requests
    assert request.path == "/api/chat.postMessage"
    assert request.headers["Authorization"] == f"Bearer {BOT_TOKEN.get_secret_value()}"
    assert request.headers["Content-Type"] == "application/json; charset=utf-8"
    posted = request.json
    assert posted["channel"] == "ops"
    assert posted["text"] == sent_notice.subject
    actions = [b for b in posted["blocks"] if b["type"] == "actions"]
    assert [e["action_id"] for a in actions for e in a["elements"]] == [
        SLACK_APPROVE,
        SLACK_REJECT,
    ]
    assert "sig=" not in request.body.decode(), "Slack decides by button, never by link"


def test_slack_returns_the_messages_timestamp(slack):
    slack.answers.append((200, b'{"ok": true, "channel": "C1", "ts": "1700000001.000200"}'))

    ts = SlackNotifier(BOT_TOKEN, api_url=slack.url).post_message("C1", "hi", [])

    assert ts == "1700000001.000200"


def test_slack_sends_nothing_when_the_run_names_no_channel(slack):
    SlackNotifier(BOT_TOKEN, api_url=slack.url).send(notice(slack_channel=None))

    assert slack.requests == []


@pytest.mark.parametrize(
    ("status", "answer", "error"),
    [
        (200, b'{"ok": false, "error": "channel_not_found"}', "channel_not_found"),
        (200, b'{"ok": false}', "failed: 200"),
        (200, b"[]", "failed: 200"),
        (500, b'{"ok": false, "error": "fatal_error"}', "fatal_error"),
        (500, b"<html>Internal Server Error</html>", "answered 500 without JSON"),
        (429, b"", "answered 429 without JSON"),
        (200, b"ok", "answered 200 without JSON"),
    ],
    ids=["ok-false", "ok-false-no-error", "not-an-object", "500-json", "500-html", "429", "text"],
)
def test_slack_failures_are_slack_errors_that_never_show_the_token(slack, status, answer, error):
    slack.answers.append((status, answer))

    with pytest.raises(SlackError, match=error) as raised:
        SlackNotifier(BOT_TOKEN, api_url=slack.url).send(notice())

    assert BOT_TOKEN.get_secret_value() not in str(raised.value)


def test_slack_out_of_reach_is_a_slack_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]

    with pytest.raises(SlackError, match="could not be reached"):
        SlackNotifier(BOT_TOKEN, api_url=f"http://127.0.0.1:{closed_port}").send(notice())


def test_slack_escapes_the_agents_text_in_the_notification_text_too(slack):
    SlackNotifier(BOT_TOKEN, api_url=slack.url).send(notice(prompt="<!channel> drop it?"))

    (request,) = slack.requests
    assert "<!channel>" not in request.json["text"]


def test_the_responder_replaces_the_message_without_a_token(slack):
    SlackResponder(allow_http=True).replace(slack.url + "/actions/T0/1/abc", "Approved by @dana")

    (request,) = slack.requests
    assert request.path == "/actions/T0/1/abc"
    assert "Authorization" not in request.headers
    replaced = request.json
    assert replaced["replace_original"] is True
    assert replaced["text"] == "Approved by @dana"
    assert not [b for b in replaced["blocks"] if b["type"] == "actions"], "no buttons left"


def test_the_responder_refuses_http_unless_told_otherwise(slack):
    for url in (slack.url + "/actions/x", "ftp://hooks.slack.com/x", "file:///etc/passwd"):
        with pytest.raises(SlackError, match="not https"):
            SlackResponder().replace(url, "Approved by @dana")

    assert slack.requests == []


@pytest.mark.parametrize("status", [404, 500])
def test_the_responder_reports_a_response_url_that_fails(slack, status):
    slack.answers.append((status, b"expired_url"))

    with pytest.raises(SlackError, match=f"answered {status}"):
        SlackResponder(allow_http=True).replace(slack.url + "/actions/x", "Approved")


# --- the local outbox --------------------------------------------------------------------------


def test_the_outbox_holds_one_file_per_recipient_and_one_for_slack_owner_only(tmp_path):
    outbox = OutboxNotifier(tmp_path / "ratchet.outbox")
    sent_notice = notice()

    outbox.send(sent_notice)

    files = sorted(outbox.folder.iterdir())
    assert len(files) == 3
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert not [f for f in files if f.name.startswith(".")], "no draft is left behind"
    messages = outbox.messages()
    emails = {m["to"]: m for m in messages if m["channel"] == "email"}
    assert set(emails) == {"dana@example.com", "lee@example.com"}
    for mine in sent_notice.emails:
        email = emails[mine.recipient]
        assert email["subject"] == sent_notice.subject
        assert email["link"] == mine.url
        assert email["text"] == email_text(sent_notice, mine)
        assert email["html"] == email_html(sent_notice, mine)
    (posted,) = [m for m in messages if m["channel"] == "slack"]
    assert posted["to"] == "#ops"
    assert [b["type"] for b in posted["blocks"]].count("actions") == 1


def test_the_outbox_of_a_store_never_used_is_empty(tmp_path):
    assert OutboxNotifier(tmp_path / "nothing.outbox").messages() == []


def test_a_recipient_cannot_write_outside_the_outbox(tmp_path):
    outbox = OutboxNotifier(tmp_path / "box" / "ratchet.outbox")

    outbox.send(notice(emails=[invitation("../../../escape/x@example.com")], slack_channel=None))

    assert [p.parent for p in (tmp_path / "box").rglob("*.json")] == [outbox.folder]
    assert not (tmp_path / "escape").exists()


def test_two_recipients_never_share_an_outbox_file(tmp_path):
    outbox = OutboxNotifier(tmp_path / "ratchet.outbox")

    outbox.send(
        notice(
            emails=[invitation("a+b@example.com"), invitation("a_b@example.com")],
            slack_channel=None,
        )
    )

    assert {m["to"] for m in outbox.messages()} == {"a+b@example.com", "a_b@example.com"}
