"""Approval emails over SMTP, for the local runtime off AWS: one message per recipient, HTML
and plain text, each with the recipient's own signed link (the SES email's, `email_text` and
`email_html`), through the standard library's `smtplib`.

The server is named by one URL, `RATCHET_SMTP_URL` (`SmtpServer.from_url`):

- `smtps://user:password@mail.example.com` (port 465): TLS from the first byte;
- `smtp://user:password@mail.example.com` (port 587): STARTTLS, required: a server that does
  not offer it is refused before any credential or message is sent;
- `smtp://localhost:1025`: a relay on this machine, spoken to in plain (a loopback address
  never leaves the host); `?starttls=true` asks for STARTTLS there too;
- `?starttls=false` speaks plain to any host, as the user said, but never with a password:
  it would cross the network in clear.

The URL holds the password, so it is a secret as a whole: it is never said back, not in a
refusal of a bad URL, not in an error, not in a `repr`.
"""

from __future__ import annotations

import ipaddress
import re
import smtplib
import ssl
from collections.abc import Sequence
from email.message import EmailMessage
from email.utils import formatdate, make_msgid, parseaddr
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, SecretStr

from ratchet.approvals.messages import email_html, email_text
from ratchet.state import EMAIL_PATTERN
from ratchet.waits import ApprovalNotice, Invitation

SMTP_TIMEOUT_SECONDS = 10.0
"""How long one connection, command or read may take: a server that does not answer fails
its channel (`SmtpError`) in bounded time, and the worker that parked the run goes on."""
DEFAULT_PORTS = {"smtp": 587, "smtps": 465}
LOOPBACK_NAMES = ("localhost",)

Security = Literal["tls", "starttls", "none"]


class SmtpError(RuntimeError):
    """The server could not be reached, refused the login, or refused a message. Its text names
    the server and what it answered, never the password."""


def sender_address(sender: str) -> str:
    """The address of `RATCHET_EMAIL_SENDER` (`ratchet@example.com`, or `Ratchet
    <ratchet@example.com>`); `ValueError` if it has none."""
    _name, address = parseaddr(sender)
    if not re.fullmatch(EMAIL_PATTERN, address) or "\n" in sender or "\r" in sender:
        raise ValueError("not an email address (ratchet@example.com, or Ratchet <ratchet@...>)")
    return address


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SmtpServer(BaseModel):
    """Where approval emails go, and how: parsed from `RATCHET_SMTP_URL` by `from_url`."""

    model_config = ConfigDict(frozen=True)

    host: str
    port: int
    security: Security
    username: str | None = None
    password: SecretStr | None = None

    @classmethod
    def from_url(cls, url: str) -> SmtpServer:
        """The server `url` names; `ValueError` saying what is wrong, never the URL (its
        password)."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ValueError("not a URL (smtp://user:password@host:587 or smtps://...)") from None
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise ValueError("use smtp://user:password@host:587 (STARTTLS) or smtps://...:465")
        host = parts.hostname
        if not host:
            raise ValueError("no host (smtp://user:password@host:587)")
        if parts.path not in ("", "/") or parts.fragment:
            raise ValueError("an SMTP URL has no path: smtp://user:password@host:587")
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        if (username is None) != (password is None):
            raise ValueError(
                "give both a user and a password (smtp://user:password@host), or neither"
            )
        starttls = _starttls(parts.query)
        if scheme == "smtps":
            if starttls is not None:
                raise ValueError("smtps:// is TLS from the start: starttls= is for smtp://")
            security: Security = "tls"
        elif starttls is None:
            # A relay on this machine is spoken to as it is set up (most speak plain); any
            # other host only over TLS, unless the user says otherwise.
            security = "none" if is_loopback(host) else "starttls"
        else:
            security = "starttls" if starttls else "none"
        if security == "none" and password is not None and not is_loopback(host):
            raise ValueError(
                f"a password to {host} would cross the network in clear: use smtps:// or "
                "STARTTLS (drop starttls=false)"
            )
        return cls(
            host=host,
            port=port or DEFAULT_PORTS[scheme],
            security=security,
            username=username,
            password=SecretStr(password) if password is not None else None,
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _starttls(query: str) -> bool | None:
    try:
        asked = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        raise ValueError("its query is not name=value (?starttls=false)") from None
    unknown = sorted(set(asked) - {"starttls"})
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}: the only one is starttls=true|false")
    if "starttls" not in asked:
        return None
    said = asked["starttls"].lower()
    if said not in ("true", "false"):
        raise ValueError("starttls= is true or false")
    return said == "true"


class SmtpNotifier:
    """Sends each recipient of a notice their own email, on one connection per notice. A
    recipient the server refuses does not stop the others; the refusals are said after, in
    one `SmtpError`. Recipients that are not addresses (locally, the operator is named by
    their login, and gets their link printed) are not emailed."""

    def __init__(
        self, server: SmtpServer, *, sender: str, timeout: float = SMTP_TIMEOUT_SECONDS
    ) -> None:
        self._server = server
        self._sender = sender
        self._timeout = timeout

    def send(self, notice: ApprovalNotice) -> None:
        invitations = [i for i in notice.emails if re.fullmatch(EMAIL_PATTERN, i.recipient)]
        if not invitations:
            return
        try:
            with self._connect() as smtp:
                refused = self._send_each(smtp, notice, invitations)
        except (smtplib.SMTPException, OSError) as failed:
            raise SmtpError(f"{self._server.address}: {self._said(failed)}") from None
        if refused:
            raise SmtpError(
                f"{self._server.address} refused {len(refused)} of {len(invitations)} emails: "
                f"{refused[0]}"
            )

    def _send_each(
        self, smtp: smtplib.SMTP, notice: ApprovalNotice, invitations: Sequence[Invitation]
    ) -> list[str]:
        refused: list[str] = []
        for invitation in invitations:
            try:
                smtp.send_message(self._message(notice, invitation))
            except (smtplib.SMTPRecipientsRefused, smtplib.SMTPDataError) as failed:
                # This recipient's: the next still gets theirs. A lost connection is not
                # caught here, and fails the rest (`send`).
                refused.append(self._said(failed))
        return refused

    def _connect(self) -> smtplib.SMTP:
        server, context = self._server, ssl.create_default_context()
        smtp: smtplib.SMTP
        if server.security == "tls":
            smtp = smtplib.SMTP_SSL(
                server.host, server.port, timeout=self._timeout, context=context
            )
        else:
            smtp = smtplib.SMTP(server.host, server.port, timeout=self._timeout)
        try:
            smtp.ehlo()
            if server.security == "starttls":
                # Before the login: with no STARTTLS offered, `starttls` raises, and nothing
                # (no password, no link) has been sent.
                smtp.starttls(context=context)
                smtp.ehlo()
            if server.username is not None and server.password is not None:
                smtp.login(server.username, server.password.get_secret_value())
        except BaseException:
            smtp.close()
            raise
        return smtp

    def _message(self, notice: ApprovalNotice, invitation: Invitation) -> EmailMessage:
        message = EmailMessage()
        message["Subject"] = notice.subject
        message["From"] = self._sender
        message["To"] = invitation.recipient
        message["Date"] = formatdate(localtime=False)
        message["Message-ID"] = make_msgid(domain=parseaddr(self._sender)[1].rpartition("@")[2])
        message.set_content(email_text(notice, invitation))
        message.add_alternative(email_html(notice, invitation), subtype="html")
        return message

    def _said(self, failed: BaseException) -> str:
        """What the server answered (or how the connection failed), in one line, with the
        password cut out should a server echo it back."""
        if isinstance(failed, smtplib.SMTPRecipientsRefused):
            answers = list(failed.recipients.values())
            code, answer = answers[0] if answers else (0, b"")
            said = f"{code} {answer.decode('utf-8', 'replace')}"
        elif isinstance(failed, smtplib.SMTPResponseException):
            error = failed.smtp_error
            text = error.decode("utf-8", "replace") if isinstance(error, bytes) else str(error)
            said = f"{failed.smtp_code} {text}"
        elif isinstance(failed, smtplib.SMTPNotSupportedError):
            said = f"the server does not offer STARTTLS ({failed})"
        else:
            said = f"{type(failed).__name__}: {failed}"
        said = " ".join(said.split())
        password = self._server.password
        if password is not None and password.get_secret_value():
            said = said.replace(password.get_secret_value(), "**********")
        return said
