"""`RATCHET_SMTP_URL` and the other settings of the local notifiers, read as a process starts:
how each URL is spoken to (TLS, STARTTLS, plain only to this machine or when told), and each
bad setting refused in one line that never holds the password."""

from __future__ import annotations

import pytest

from ratchet.adapters.smtp import SmtpServer
from ratchet.errors import InvalidInput
from ratchet.runtime.local import LocalSettings

PASSWORD = "hunter2-s3cret-Pa55"


@pytest.mark.parametrize(
    ("url", "host", "port", "security"),
    [
        (f"smtps://me:{PASSWORD}@mail.example.com", "mail.example.com", 465, "tls"),
        (f"smtp://me:{PASSWORD}@mail.example.com", "mail.example.com", 587, "starttls"),
        (f"smtp://me:{PASSWORD}@mail.example.com:2525", "mail.example.com", 2525, "starttls"),
        ("smtp://localhost:1025", "localhost", 1025, "none"),
        ("smtp://127.0.0.1:1025", "127.0.0.1", 1025, "none"),
        ("smtp://[::1]:1025", "::1", 1025, "none"),
        (f"smtp://me:{PASSWORD}@localhost:1025", "localhost", 1025, "none"),
        ("smtp://localhost:1025?starttls=true", "localhost", 1025, "starttls"),
        ("smtp://relay.internal:25?starttls=false", "relay.internal", 25, "none"),
    ],
)
def test_each_url_is_spoken_to_as_it_says(url: str, host: str, port: int, security: str) -> None:
    server = SmtpServer.from_url(url)

    assert (server.host, server.port, server.security) == (host, port, security)


def test_the_user_and_password_are_read_unquoted_and_kept_secret() -> None:
    server = SmtpServer.from_url("smtps://me%40example.com:p%40ss%3Aword@mail.example.com")

    assert server.username == "me@example.com"
    assert server.password is not None
    assert server.password.get_secret_value() == "p@ss:word"
    assert "p@ss" not in repr(server)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            f"smtp://me:{PASSWORD}@mail.example.com?starttls=false",
            "a password to mail.example.com would cross the network in clear",
        ),
        (f"smtp://me:{PASSWORD}@10.0.0.7:25?starttls=false", "would cross the network in clear"),
        (f"smtps://me:{PASSWORD}@mail.example.com?starttls=true", "smtps:// is TLS from the start"),
        (f"smtp://me:{PASSWORD}@mail.example.com?tls=1", "unknown option 'tls'"),
        (f"smtp://me:{PASSWORD}@mail.example.com?starttls=maybe", "starttls= is true or false"),
        (f"smtp://me:{PASSWORD}@mail.example.com/inbox", "an SMTP URL has no path"),
        ("smtp://me@mail.example.com", "give both a user and a password"),
        (f"smtp://:{PASSWORD}@mail.example.com", "give both a user and a password"),
        (f"smtp://me:{PASSWORD}@:25", "no host"),
        (f"mailto://me:{PASSWORD}@mail.example.com", "use smtp://"),
        (f"smtp://me:{PASSWORD}@mail.example.com:99999", "not a URL"),
    ],
)
def test_a_bad_url_is_refused_in_one_line_without_its_password(url: str, said: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        LocalSettings.from_env(
            {"RATCHET_SMTP_URL": url, "RATCHET_EMAIL_SENDER": "approvals@example.com"}
        )

    message = str(refused.value)
    assert message.startswith("RATCHET_SMTP_URL is not valid: ")
    assert said in message
    assert "\n" not in message
    assert PASSWORD not in message


def test_the_settings_never_show_the_password_or_the_token() -> None:
    settings = LocalSettings.from_env(
        {
            "RATCHET_SMTP_URL": f"smtps://me:{PASSWORD}@mail.example.com",
            "RATCHET_EMAIL_SENDER": "Ratchet <approvals@example.com>",
            "RATCHET_SLACK_BOT_TOKEN": "xoxb-secret-bot-token",
            "RATCHET_NOTIFY_EMAILS": "dana@example.com, lee@example.com",
            "RATCHET_NOTIFY_SLACK_CHANNEL": "#approvals",
        }
    )

    shown = f"{settings!r} {settings} {settings.model_dump()} {settings.model_dump_json()}"
    assert PASSWORD not in shown
    assert "xoxb-secret-bot-token" not in shown
    assert settings.notify_emails == ("dana@example.com", "lee@example.com")
    assert settings.notify_slack_channel == "#approvals"


@pytest.mark.parametrize(
    ("env", "said"),
    [
        (
            {"RATCHET_SMTP_URL": "smtp://localhost:1025"},
            "RATCHET_EMAIL_SENDER is not valid: required with RATCHET_SMTP_URL",
        ),
        (
            {"RATCHET_NOTIFY_EMAILS": "dana@example.com, dana"},
            "RATCHET_NOTIFY_EMAILS is not valid: 'dana' is not an email address",
        ),
        (
            {"RATCHET_NOTIFY_EMAILS": ",".join(f"p{i}@example.com" for i in range(11))},
            "RATCHET_NOTIFY_EMAILS is not valid: names 11 addresses; at most 10",
        ),
        (
            {"RATCHET_SLACK_API_URL": "slack.com/api"},
            "RATCHET_SLACK_API_URL is not valid: ",
        ),
    ],
)
def test_the_other_notifier_settings_are_refused_in_one_line(
    env: dict[str, str], said: str
) -> None:
    with pytest.raises(InvalidInput, match=f"^{said}"):
        LocalSettings.from_env(env)
