"""The webhooks' signature and address rules (issue 35): a signature verifies under its secret
and body only, and not once it is old; the URLs a deployment may declare; the backoff."""

from __future__ import annotations

import socket

import pytest

from ratchet.errors import InvalidInput
from ratchet.pushes import backoff, signature, verify
from ratchet.webhook_urls import any_link_local, check_webhook_url, parse_webhook_urls

NOW = 1_767_225_600
BODY = b'{"id":"r1:9","status":"waiting"}'


def test_a_signature_verifies_under_its_secret_and_body_only():
    header = signature("s3cret", BODY, timestamp=NOW)

    assert header.startswith(f"t={NOW},v1=")
    assert verify("s3cret", header, BODY, now=NOW + 299)
    assert not verify("s3cret", header, BODY + b" ", now=NOW)
    assert not verify("other", header, BODY, now=NOW)
    assert not verify("s3cret", header, BODY, now=NOW + 301)  # replayed later
    assert not verify("s3cret", header.replace(f"t={NOW}", f"t={NOW + 1}"), BODY, now=NOW)
    assert not verify("s3cret", f"t={NOW},t={NOW},v1=x", BODY, now=NOW)
    assert not verify("s3cret", "v1=" + header.partition("v1=")[2], BODY, now=NOW)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "file:///etc/passwd",
        "http:///no-host",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/x",
        "http://[::ffff:169.254.169.254]/x",
        "https://user:secret@example.com/x",
    ],
)
def test_urls_a_webhook_is_never_sent_to(url):
    with pytest.raises(InvalidInput):
        check_webhook_url(url)


def test_urls_a_webhook_is_sent_to():
    assert parse_webhook_urls("https://a.example/x, http://127.0.0.1:8080/h  http://b") == (
        "https://a.example/x",
        "http://127.0.0.1:8080/h",
        "http://b",
    )


def test_a_name_that_resolves_to_a_link_local_address_is_refused():
    def info(address: str) -> tuple[object, ...]:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return (family, socket.SOCK_STREAM, 6, "", (address, 443))

    assert any_link_local([info("93.184.216.34"), info("169.254.169.254")])
    assert any_link_local([info("fe80::1%eth0")])
    assert not any_link_local([info("127.0.0.1"), info("::1"), info("10.0.0.1")])


def test_the_backoff_doubles_up_to_five_minutes():
    assert [backoff(n) for n in (1, 2, 3, 4, 9, 10, 50)] == [1, 2, 4, 8, 256, 300, 300]
