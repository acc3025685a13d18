"""Slack interactivity: only a fresh request signed with the app's secret is believed, and only
a press of one of Ratchet's two buttons is read as a decision."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import urlencode

import pytest

from ratchet.approvals.messages import SLACK_APPROVE, SLACK_REJECT
from ratchet.approvals.slack import (
    MAX_AGE_SECONDS,
    SlackPayloadInvalid,
    SlackRequestRefused,
    parse_action,
    verify_request,
)

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
NOW = 1_767_225_600
BODY = b"payload=%7B%22type%22%3A%22block_actions%22%7D"


def signature(body: bytes = BODY, timestamp: str = str(NOW), secret: str = SECRET) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify(
    *,
    timestamp: str | None = str(NOW),
    signature: str | None = None,
    body: bytes = BODY,
    now: float = NOW,
) -> None:
    verify_request(
        SECRET,
        timestamp=timestamp,
        signature=signature if signature is not None else globals()["signature"](body),
        body=body,
        now=now,
    )


# --- the request signature ---------------------------------------------------------------------


def test_a_request_signed_with_the_secret_is_believed():
    verify()


def test_slacks_documented_example_verifies():
    # The worked example of Slack's "Verifying requests from Slack" page: its secret (SECRET),
    # timestamp, body and published signature.
    body = (
        b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&"
        b"channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&"
        b"command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2F"
        b"commands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&"
        b"trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
    )
    expected = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"

    verify_request(
        SECRET, timestamp="1531420618", signature=expected, body=body, now=1531420618 + 10
    )


@pytest.mark.parametrize(
    "bad",
    [
        "v0=" + "0" * 64,
        "",
        "v0=",
        signature()[3:],
        "v1=" + signature()[3:],
        signature().upper(),
        signature(secret="another secret"),
        signature(timestamp=str(NOW - 1)),
    ],
)
def test_a_bad_signature_is_refused(bad):
    with pytest.raises(SlackRequestRefused):
        verify(signature=bad)


def test_a_body_changed_after_signing_is_refused():
    with pytest.raises(SlackRequestRefused, match="bad Slack signature"):
        verify(signature=signature(BODY), body=BODY + b"&x=1")


def test_a_signature_header_with_non_ascii_characters_is_refused():
    with pytest.raises(SlackRequestRefused):
        verify(signature="v0=" + "é" * 64)


@pytest.mark.parametrize(
    ("sent", "now"),
    [
        (NOW - MAX_AGE_SECONDS - 1, NOW),
        (NOW - 24 * 3600, NOW),
        (NOW + MAX_AGE_SECONDS + 1, NOW),
        (0, NOW),
    ],
    ids=["just-stale", "a-day-old", "from-the-future", "epoch"],
)
def test_a_request_over_five_minutes_from_now_is_refused_even_if_signed(sent, now):
    with pytest.raises(SlackRequestRefused, match="stale"):
        verify(timestamp=str(sent), signature=signature(timestamp=str(sent)), now=now)


@pytest.mark.parametrize("sent", [NOW - MAX_AGE_SECONDS, NOW + MAX_AGE_SECONDS])
def test_a_request_exactly_five_minutes_off_is_still_believed(sent):
    verify(timestamp=str(sent), signature=signature(timestamp=str(sent)), now=NOW)


@pytest.mark.parametrize(
    ("timestamp", "sig"),
    [(None, signature()), ("", signature()), (str(NOW), None), (str(NOW), "")],
    ids=["no-timestamp", "empty-timestamp", "no-signature", "empty-signature"],
)
def test_a_request_without_the_signature_headers_is_refused(timestamp, sig):
    with pytest.raises(SlackRequestRefused, match="missing"):
        verify_request(SECRET, timestamp=timestamp, signature=sig, body=BODY, now=NOW)


@pytest.mark.parametrize("timestamp", ["soon", "1.5e9", "0x10", f"{NOW}.5", "9" * 5000])
def test_a_malformed_timestamp_is_refused(timestamp):
    with pytest.raises(SlackRequestRefused, match="malformed"):
        verify(timestamp=timestamp, signature=signature(timestamp=timestamp))


def test_refusals_are_401():
    assert SlackRequestRefused.http_status == 401
    assert SlackPayloadInvalid.http_status == 400


# --- the button press --------------------------------------------------------------------------


def press(action_id: str = SLACK_APPROVE, **overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "type": "block_actions",
        "user": {"id": "U024BE7LH", "username": "dana", "name": "dana.w"},
        "response_url": "https://hooks.slack.com/actions/T0/1/abc",
        "actions": [
            {
                "action_id": action_id,
                "block_id": "ratchet_decision",
                "value": json.dumps({"run_id": "run-1", "approval_id": "A" * 22}),
            }
        ],
    }
    payload.update(overrides)
    return payload


def form(payload: Any) -> str:
    return urlencode({"payload": payload if isinstance(payload, str) else json.dumps(payload)})


@pytest.mark.parametrize(("action_id", "approved"), [(SLACK_APPROVE, True), (SLACK_REJECT, False)])
def test_a_button_press_names_the_run_the_approval_the_choice_and_the_user(action_id, approved):
    action = parse_action(form(press(action_id)))

    assert (action.run_id, action.approval_id, action.approved) == ("run-1", "A" * 22, approved)
    assert (action.user_id, action.by) == ("U024BE7LH", "@dana")
    assert action.response_url == "https://hooks.slack.com/actions/T0/1/abc"


def test_a_user_without_a_username_is_named_by_name_then_by_id():
    by_name = press(user={"id": "U1", "name": "dana.w"})
    by_id = press(user={"id": "U1"})

    assert parse_action(form(by_name)).by == "@dana.w"
    assert parse_action(form(by_id)).by == "@U1"


def test_other_actions_in_the_payload_are_ignored():
    payload = press()
    payload["actions"].insert(0, {"action_id": "overflow_menu", "value": "x"})

    assert parse_action(form(payload)).approved is True


def test_a_press_without_a_response_url_can_still_decide():
    assert parse_action(form(press(response_url=None))).response_url is None


def _without(key: str) -> dict[str, Any]:
    payload = press()
    del payload[key]
    return payload


@pytest.mark.parametrize(
    "body",
    [
        "",
        "payload=",
        "token=x",
        "payload",
        form("not json"),
        form([1, 2]),
        form(_without("actions")),
        form(_without("user")),
        form(press(actions=[])),
        form(press(actions=None)),
        form(press(user="dana")),
        form(press(user={"username": "dana"})),
        form(press("some_other_button")),
        form(press(actions=press()["actions"] * 2)),
        form(press(actions=[{"action_id": SLACK_APPROVE, "value": "not json"}])),
        form(press(actions=[{"action_id": SLACK_APPROVE, "value": "[1]"}])),
        form(press(actions=[{"action_id": SLACK_APPROVE, "value": '{"run_id": "r"}'}])),
        form(press(actions=[{"action_id": SLACK_APPROVE}])),
        form(press()) + "&" + form(press(SLACK_REJECT)),
        form('{"actions": ' + "[" * 60_000 + "]" * 60_000 + "}"),
        form(press(actions=[{"action_id": SLACK_APPROVE, "value": "[" * 5_000 + "]" * 5_000}])),
    ],
    ids=[
        "empty",
        "empty-payload",
        "no-payload",
        "bare-field",
        "not-json",
        "a-list",
        "no-actions",
        "no-user",
        "empty-actions",
        "null-actions",
        "user-not-an-object",
        "user-without-id",
        "another-button",
        "both-buttons",
        "value-not-json",
        "value-a-list",
        "value-without-approval",
        "no-value",
        "two-payloads",
        "nested-too-deep",
        "value-nested-too-deep",
    ],
)
def test_anything_but_one_press_of_a_ratchet_button_is_refused(body):
    with pytest.raises(SlackPayloadInvalid):
        parse_action(body)


def test_an_action_that_is_not_an_object_is_refused():
    with pytest.raises(SlackPayloadInvalid):
        parse_action(form(press(actions=["approve"])))
