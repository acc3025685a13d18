"""The checks of a webhook delivery (`ratchet.waiting.hooks`), with no store: GitHub's signature
exactly as GitHub documents it, the generic scheme's replay window, and the hook ids and secrets
derived from the key."""

from __future__ import annotations

import json

import pytest

from ratchet.errors import PayloadTooLarge
from ratchet.state import MAX_EVENT_BYTES
from ratchet.waiting.hooks import (
    REPLAY_WINDOW_SECONDS,
    DeliveryInvalid,
    HookKeys,
    HookRefused,
    NotJson,
    SignatureInvalid,
    check_length,
    generic_signature,
    github_signature,
    verify_delivery,
)

SECRET = "a6e6f3de496e0f640f80c2b978ad1c545be081f559d2ca9401f56fbe0dd55537"
BODY = json.dumps({"conclusion": "success"}).encode()
NOW = 1_767_225_600


def github(body: bytes = BODY, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "X-Hub-Signature-256": github_signature(SECRET, body),
        **(extra or {}),
    }


def generic(
    stamp: int = NOW, body: bytes = BODY, extra: dict[str, str] | None = None
) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-Delivery-Id": "evt_1",
        "X-Signature-Timestamp": str(stamp),
        "X-Signature-256": generic_signature(SECRET, stamp, body),
        **(extra or {}),
    }


def test_githubs_own_example_signs_the_same():
    # https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
    assert github_signature("It's a Secret to Everybody", b"Hello, World!") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )


def test_a_github_delivery_is_taken_whatever_the_case_of_its_headers():
    lowered = {
        k.lower(): v
        for k, v in github(extra={"Content-Type": "application/json; charset=utf-8"}).items()
    }
    delivery = verify_delivery(lowered, BODY, SECRET, now=NOW)
    assert delivery.event_id == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert delivery.payload == {"conclusion": "success"}
    assert delivery.scheme == "github"
    assert not delivery.ping


def test_a_signature_right_only_in_part_is_refused():
    right = github_signature(SECRET, BODY)
    for wrong in (right[:-1] + ("0" if right[-1] != "0" else "1"), right[:40] + "0" * 31):
        with pytest.raises(SignatureInvalid, match="does not match"):
            verify_delivery(github(extra={"X-Hub-Signature-256": wrong}), BODY, SECRET, now=NOW)


def test_the_generic_scheme_signs_the_timestamp_with_the_body():
    assert verify_delivery(generic(), BODY, SECRET, now=NOW).event_id == "evt_1"
    only_body = generic(extra={"X-Signature-256": github_signature(SECRET, BODY)})
    with pytest.raises(SignatureInvalid, match="does not match"):
        verify_delivery(only_body, BODY, SECRET, now=NOW)
    moved = generic(extra={"X-Signature-Timestamp": str(NOW + 1)})
    with pytest.raises(SignatureInvalid, match="does not match"):
        verify_delivery(moved, BODY, SECRET, now=NOW)


@pytest.mark.parametrize("skew", [-REPLAY_WINDOW_SECONDS, REPLAY_WINDOW_SECONDS])
def test_a_timestamp_at_the_edge_of_the_window_is_taken(skew):
    assert verify_delivery(generic(NOW + skew), BODY, SECRET, now=NOW).scheme == "generic"


@pytest.mark.parametrize("skew", [-REPLAY_WINDOW_SECONDS - 1, REPLAY_WINDOW_SECONDS + 1, -86_400])
def test_a_timestamp_past_the_window_is_refused_though_signed(skew):
    with pytest.raises(SignatureInvalid, match="X-Signature-Timestamp: signed"):
        verify_delivery(generic(NOW + skew), BODY, SECRET, now=NOW)


@pytest.mark.parametrize(
    "media", [None, "text/json", "application/json-patch+json", "application/x-www-form-urlencoded"]
)
def test_only_json_is_taken(media):
    headers = github()
    if media is None:
        del headers["Content-Type"]
    else:
        headers["Content-Type"] = media
    with pytest.raises(NotJson, match="application/json"):
        verify_delivery(headers, BODY, SECRET, now=NOW)


def test_a_body_over_the_limit_is_refused_by_its_length_first():
    with pytest.raises(PayloadTooLarge):
        check_length({"content-length": str(MAX_EVENT_BYTES + 1)})
    check_length({"Content-Length": str(MAX_EVENT_BYTES)})
    check_length({})
    big = b'"' + b"x" * MAX_EVENT_BYTES + b'"'
    with pytest.raises(PayloadTooLarge):
        verify_delivery(github(big), big, SECRET, now=NOW)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b"{", "not JSON"),
        (b"[" * 65 + b"]" * 65, "nested more than 64 levels"),
        (b'{"x": Infinity}', "Infinity is not a JSON number"),
    ],
)
def test_a_signed_body_that_is_not_json_is_refused(body, words):
    with pytest.raises(DeliveryInvalid, match=words):
        verify_delivery(github(body), body, SECRET, now=NOW)


def test_no_refusal_quotes_the_secret_the_signature_or_the_body():
    body = b'{"token": "body-marker-81c2"'
    signature = github_signature(SECRET, body)
    attempts = [
        (github(body), body),
        (github(body, extra={"X-Hub-Signature-256": signature[:-2] + "00"}), body),
        (github(body, extra={"X-Hub-Signature-256": "sha256=" + SECRET}), body),
        (github(body, extra={"Content-Type": "text/plain"}), body),
        (generic(NOW - 9999, body), body),
    ]
    for headers, sent in attempts:
        with pytest.raises(HookRefused) as refused:
            verify_delivery(headers, sent, SECRET, now=NOW)
        for secret in (SECRET, signature.removeprefix("sha256="), "body-marker-81c2"):
            assert secret not in str(refused.value)


def test_a_hook_id_is_the_same_for_a_run_and_name_and_unguessable_without_the_key():
    keys = HookKeys(b"k" * 32)
    first = keys.hook_id("run-1", "ci-finished")
    assert first == HookKeys(b"k" * 32).hook_id("run-1", "ci-finished")
    assert len(first) == 32
    assert int(first, 16) >= 0
    others = {
        keys.hook_id("run-2", "ci-finished"),
        keys.hook_id("run-1", "ci-finishe"),
        keys.hook_id("run-1c", "i-finished"),  # length-prefixed: no two pairs share bytes
        HookKeys(b"j" * 32).hook_id("run-1", "ci-finished"),
    }
    assert first not in others
    assert len(others) == 4
    assert keys.secret(first) != HookKeys(b"j" * 32).secret(first)
    assert len(keys.secret(first)) == 64
    assert first not in keys.secret(first)


def test_the_key_is_read_when_first_needed_and_must_be_long_enough():
    reads: list[int] = []

    def key() -> bytes:
        reads.append(1)
        return b"short"

    keys = HookKeys(key)
    assert reads == []
    with pytest.raises(ValueError, match="at least 16 bytes"):
        keys.hook_id("run-1", "x")
