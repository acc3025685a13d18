"""The SMTP notifier against a real SMTP server (aiosmtpd on a loopback port): each recipient
their own email and link, as SES sends them; a refusal, a server down and a server that never
answers each fail the channel in one `SmtpError`, in bounded time, without the password."""

from __future__ import annotations

import time

import pytest

from ratchet.adapters.smtp import SmtpError, SmtpNotifier, SmtpServer
from ratchet.approvals.messages import email_html, email_text
from tests.integration.test_notifiers import invitation, notice
from tests.smtp_support import (
    HOST,
    PASSWORD,
    QUIET,
    USER,
    down_port,
    mail_server,
    silent_server,
)

pytestmark = pytest.mark.filterwarnings(QUIET)

SENDER = "Ratchet <approvals@example.com>"


def _notifier(url: str, *, timeout: float = 10.0) -> SmtpNotifier:
    return SmtpNotifier(SmtpServer.from_url(url), sender=SENDER, timeout=timeout)


def _lines(text: str) -> list[str]:
    """The text as its lines: SMTP carries them ended with CRLF."""
    return text.replace("\r\n", "\n").rstrip("\n").split("\n")


def test_each_recipient_gets_their_own_email_with_their_own_link_after_a_login():
    sent = notice()
    with mail_server() as server:
        _notifier(server.url()).send(sent)
        received = server.by_recipient()

    # The password reached the server (the login is not skipped), once, on one connection
    assert server.logins == [(USER, PASSWORD)]
    assert sorted(received) == ["dana@example.com", "lee@example.com"]
    for person in sent.emails:
        email = received[person.recipient]
        assert email["From"] == SENDER
        assert email["Subject"] == sent.subject
        text = email.get_body(("plain",))
        html = email.get_body(("html",))
        assert text is not None
        assert html is not None
        assert _lines(text.get_content()) == _lines(email_text(sent, person))
        assert _lines(html.get_content()) == _lines(email_html(sent, person))
        others = [i.url for i in sent.emails if i.recipient != person.recipient]
        assert person.url in text.get_content()
        assert not any(url in text.get_content() for url in others)


def test_a_recipient_refused_does_not_keep_the_next_from_theirs():
    sent = notice(emails=[invitation("gone@example.com"), invitation("lee@example.com")])
    with mail_server(refused_recipients=frozenset({"gone@example.com"})) as server:
        with pytest.raises(SmtpError) as refused:
            _notifier(server.url()).send(sent)
        received = server.by_recipient()

    assert list(received) == ["lee@example.com"]
    said = str(refused.value)
    print(said)
    assert said == f"{HOST}:{server.port} refused 1 of 2 emails: 550 5.1.1 no such mailbox here"


def test_a_refused_login_fails_the_channel_without_saying_the_password():
    with mail_server(password="the-servers-own") as server, pytest.raises(SmtpError) as refused:
        _notifier(server.url(password=PASSWORD)).send(notice())

    said = str(refused.value)
    print(said)
    assert said.startswith(f"{HOST}:{server.port}: 535 ")
    assert PASSWORD not in said
    assert PASSWORD not in repr(refused.value)
    assert not server.messages


def test_a_server_that_says_the_password_back_has_it_cut_out_of_the_line():
    with (
        mail_server(password="the-servers-own", echoes_password=True) as server,
        pytest.raises(SmtpError) as refused,
    ):
        _notifier(server.url(password=PASSWORD)).send(notice())

    said = str(refused.value)
    print(said)
    assert said == f"{HOST}:{server.port}: 535 5.7.8 '**********' is not the password"
    # The server got it (smtplib tries each mechanism it offers, PLAIN and LOGIN)
    assert set(server.logins) == {(USER, PASSWORD)}


def test_a_server_down_fails_the_channel_at_once():
    port = down_port()
    started = time.monotonic()
    with pytest.raises(SmtpError) as refused:
        _notifier(f"smtp://{USER}:{PASSWORD}@{HOST}:{port}").send(notice())
    took = time.monotonic() - started

    print(f"{refused.value} ({took:.2f} s)")
    assert (
        str(refused.value)
        == f"{HOST}:{port}: ConnectionRefusedError: [Errno 111] Connection refused"
    )
    assert took < 5


def test_a_server_that_never_answers_fails_the_channel_within_the_timeout():
    with silent_server() as port:
        started = time.monotonic()
        with pytest.raises(SmtpError) as hung:
            _notifier(f"smtp://{HOST}:{port}", timeout=0.5).send(notice())
        took = time.monotonic() - started

    print(f"{hung.value} ({took:.2f} s)")
    assert str(hung.value).endswith("timed out")
    assert 0.4 < took < 5


def test_starttls_asked_of_a_server_without_it_sends_no_password_and_no_link():
    with mail_server() as server, pytest.raises(SmtpError) as refused:
        _notifier(server.url() + "?starttls=true").send(notice())

    assert "does not offer STARTTLS" in str(refused.value)
    assert server.logins == []
    assert not server.messages


def test_a_recipient_named_by_a_login_not_an_address_is_not_emailed():
    # Locally the operator is named by their login and gets their link printed: an SMTP
    # server would refuse "alice", and fail the channel for everyone else.
    with mail_server(password=None) as server:
        _notifier(server.url()).send(
            notice(emails=[invitation("alice"), invitation("lee@example.com")])
        )
        received = server.by_recipient()

    assert list(received) == ["lee@example.com"]


def test_the_password_is_in_no_repr():
    server = SmtpServer.from_url(f"smtps://{USER}:{PASSWORD}@mail.example.com")

    assert PASSWORD not in repr(server)
    assert PASSWORD not in str(server)
    assert PASSWORD not in repr(_notifier(f"smtps://{USER}:{PASSWORD}@mail.example.com").__dict__)
