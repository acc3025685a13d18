"""A real SMTP server for the tests (aiosmtpd), on a free loopback port: it keeps every message
it accepts, parsed, and every login it was asked for; it can refuse a login or a recipient as
a real server would. And a port where nothing listens, and one that listens and never answers,
for a server that is down or hung."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

HOST = "127.0.0.1"
USER = "ratchet"
PASSWORD = "hunter2-s3cret-Pa55"
"""The test's SMTP password: grep every output for it."""
PATIENCE = 60.0
QUIET = "ignore:Requiring AUTH while not requiring TLS"
"""aiosmtpd's warning at each connection of a server that takes a login without TLS: what this
loopback server is for (`pytest.mark.filterwarnings(QUIET)`)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


@dataclass
class MailServer:
    port: int
    password: str | None = None
    refused_recipients: frozenset[str] = frozenset()
    echoes_password: bool = False
    """Refuse a login saying back the password it was given, as a careless server might."""
    messages: list[EmailMessage] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)

    def url(self, *, user: str = USER, password: str | None = None) -> str:
        if self.password is None and password is None:
            return f"smtp://{HOST}:{self.port}"
        return f"smtp://{user}:{password or self.password}@{HOST}:{self.port}"

    def wait_for(self, count: int) -> list[EmailMessage]:
        deadline = time.monotonic() + PATIENCE
        while len(self.messages) < count:
            assert time.monotonic() < deadline, f"{len(self.messages)} emails, not {count}"
            time.sleep(0.05)
        return list(self.messages)

    def by_recipient(self) -> dict[str, EmailMessage]:
        return {str(m["To"]): m for m in self.messages}

    # aiosmtpd's hooks

    async def handle_RCPT(  # noqa: N802 (aiosmtpd's name)
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address in self.refused_recipients:
            return "550 5.1.1 no such mailbox here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(  # noqa: N802 (aiosmtpd's name)
        self, server: Any, session: Any, envelope: Any
    ) -> str:
        parsed = message_from_bytes(envelope.content, policy=default)
        assert isinstance(parsed, EmailMessage)
        self.messages.append(parsed)
        return "250 OK"

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        login, password = data.login.decode(), data.password.decode()
        self.logins.append((login, password))
        if (login, password) == (USER, self.password):
            return AuthResult(success=True)
        # Not handled: aiosmtpd answers the client as a server does, 535.
        said = f"535 5.7.8 {password!r} is not the password" if self.echoes_password else None
        return AuthResult(success=False, handled=False, message=said)


@contextmanager
def mail_server(
    *,
    password: str | None = PASSWORD,
    refused_recipients: frozenset[str] = frozenset(),
    echoes_password: bool = False,
) -> Iterator[MailServer]:
    """A running SMTP server that takes `USER` with `password` (None: no login at all)."""
    server = MailServer(free_port(), password, refused_recipients, echoes_password)
    auth: dict[str, Any] = (
        {"authenticator": server.authenticate, "auth_require_tls": False, "auth_required": True}
        if password is not None
        else {}
    )
    controller = Controller(server, hostname=HOST, port=server.port, **auth)
    controller.start()
    try:
        yield server
    finally:
        controller.stop()


def down_port() -> int:
    """A loopback port nothing listens on: a connection is refused at once."""
    return free_port()


@contextmanager
def silent_server() -> Iterator[int]:
    """A port that takes connections and never says a word: an SMTP client waits for its
    greeting until its timeout."""
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in held:
            connection.close()
        listener.close()
