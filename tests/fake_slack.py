"""A stand-in for Slack: its Web API (`chat.postMessage`) and the `response_url`s of its
interactions, served over HTTPS on 127.0.0.1 and recording every request.

HTTPS because Ratchet's Slack adapters refuse anything else for a `response_url`, and the test
should run them unchanged: the server's certificate is made for the test by a throwaway
authority, which the process trusts through `SSL_CERT_FILE` (`trust_file`). Slack is also
imitated in how it signs what it sends (`signed_interaction`), so the interactivity endpoint
is exercised with the same bytes Slack would send.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import ssl
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOST = "127.0.0.1"
API_PREFIX = "/api/"
ACTIONS_PREFIX = "/actions/"


@dataclass(frozen=True)
class Received:
    path: str
    authorization: str | None
    body: dict[str, Any]


class FakeSlack:
    """Start with `with FakeSlack(folder) as slack:`; `bot_token` is the only token accepted."""

    def __init__(self, folder: Path, *, bot_token: str = "xoxb-test-token") -> None:
        self.bot_token = bot_token
        self.trust_file = folder / "fake-slack-ca.pem"
        self._received: list[Received] = []
        self._lock = threading.Lock()
        self._context = _server_context(folder, self.trust_file)
        self._server = ThreadingHTTPServer((HOST, 0), self._handler_class())
        self._server.socket = self._context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeSlack:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def base_url(self) -> str:
        return f"https://{HOST}:{self._server.server_address[1]}"

    @property
    def api_url(self) -> str:
        return self.base_url + API_PREFIX.rstrip("/")

    def response_url(self, name: str) -> str:
        """A `response_url` as Slack makes one per interaction."""
        return f"{self.base_url}{ACTIONS_PREFIX}T0001/{name}"

    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def posted_messages(self) -> list[dict[str, Any]]:
        return [r.body for r in self.received() if r.path == API_PREFIX + "chat.postMessage"]

    def responses(self) -> list[dict[str, Any]]:
        return [r.body for r in self.received() if r.path.startswith(ACTIONS_PREFIX)]

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        slack = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                authorization = self.headers.get("Authorization")
                with slack._lock:
                    slack._received.append(Received(self.path, authorization, body))
                if self.path.startswith(API_PREFIX):
                    if authorization != f"Bearer {slack.bot_token}":
                        self._answer({"ok": False, "error": "invalid_auth"})
                    else:
                        self._answer({"ok": True, "channel": "C0001", "ts": "1700000000.000100"})
                elif self.path.startswith(ACTIONS_PREFIX):
                    self._answer({"ok": True})
                else:
                    self._answer({"ok": False, "error": "unknown_method"}, HTTPStatus.NOT_FOUND)

            def _answer(self, payload: dict[str, Any], status: int = HTTPStatus.OK) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the test reads `received()`."""

        return Handler


def button_press(
    message: dict[str, Any],
    action_id: str,
    *,
    user_id: str,
    username: str,
    response_url: str,
) -> dict[str, Any]:
    """The `block_actions` payload Slack sends when `username` presses the button
    `action_id` of a message that `chat.postMessage` posted."""
    (button,) = [
        element
        for block in message["blocks"]
        if block["type"] == "actions"
        for element in block["elements"]
        if element["action_id"] == action_id
    ]
    return {
        "type": "block_actions",
        "user": {"id": user_id, "username": username, "name": username, "team_id": "T0001"},
        "team": {"id": "T0001", "domain": "example"},
        "channel": {"id": message.get("channel", "C0001")},
        "response_url": response_url,
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": "ratchet_decision",
                "value": button["value"],
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }


def signed_interaction(
    payload: dict[str, Any], signing_secret: str, *, timestamp: int | None = None
) -> tuple[str, dict[str, str]]:
    """The form body and headers of an interaction request, signed as Slack signs them:
    `v0=` + HMAC-SHA256 of `v0:<timestamp>:<body>` with the app's signing secret."""
    body = urlencode({"payload": json.dumps(payload)})
    sent = str(int(time.time()) if timestamp is None else timestamp)
    base = f"v0:{sent}:{body}".encode()
    signature = "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": sent,
        "X-Slack-Signature": signature,
    }
    return body, headers


def _server_context(folder: Path, trust_file: Path) -> ssl.SSLContext:
    """A certificate for 127.0.0.1 issued by a throwaway authority (written to `trust_file`),
    shaped as strict X.509 verification (Python 3.13's default) wants it."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake slack test authority")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    trust_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = folder / "fake-slack-server.pem"
    chain.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        + leaf.public_bytes(serialization.Encoding.PEM)
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    return context
