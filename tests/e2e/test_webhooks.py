"""Webhooks end to end: `ratchet hook` prints a URL and a secret, and the shell line of
docs/webhooks.md (openssl signs, curl posts) delivers the event to a run parked by a real
worker, through a real `ratchet serve`; and what a sender with the URL alone cannot do to that
server, on raw sockets: make it read or wait for a body over the limit, or get the hook's
signed deliveries refused by posting junk."""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import MAX_EVENT_BYTES, RunStatus
from ratchet.waiting.hooks import github_signature, verify_delivery
from ratchet.waits import SentEvent
from ratchet.web.serve import IDLE_SECONDS
from tests.processes import Cli, clean_env, serving

PATIENCE = 30.0
SECRET = "a6e6f3de496e0f640f80c2b978ad1c545be081f559d2ca9401f56fbe0dd55537"
NOW = 1_767_225_600
DOCS = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"


def docs_line() -> str:
    """The copy-paste line of docs/webhooks.md: the one `sh` block that runs curl."""
    blocks = re.findall(r"```sh\n(.*?)```", DOCS.read_text(), re.DOTALL)
    lines = [b.strip() for b in blocks if "curl" in b]
    assert len(lines) == 1, lines
    return str(lines[0])


def _serve(tmp_path: Path, *flags: str) -> Iterator[tuple[Cli, str]]:
    cli = Cli(tmp_path)
    cli.ok("start", "--agent", "tests.hooks_agent:agent", "--run-id", "r1")
    cli.work_until_idle()
    assert cli.head("r1").status is RunStatus.WAITING
    argv = cli.argv("serve", "--port", "0", *flags)
    with serving(argv, log=tmp_path / "serve.log", env=clean_env(PYTHONUNBUFFERED="1")) as served:
        yield cli, served.base


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Cli, str]]:
    yield from _serve(tmp_path)


@pytest.fixture
def served_unworked(tmp_path: Path) -> Iterator[tuple[Cli, str]]:
    """No worker beside the server: the run stays where the deliveries leave it."""
    yield from _serve(tmp_path, "--no-worker")


def hook(cli: Cli, base: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli.argv("hook", "r1", "ci-finished", *args),
        capture_output=True,
        text=True,
        env=clean_env(RATCHET_PUBLIC_URL=base),
        timeout=PATIENCE,
        check=False,
    )


def test_the_docs_line_delivers_a_signed_event_through_ratchet_serve(served):
    cli, base = served
    made = hook(cli, base, "--json")
    assert made.returncode == 0, made.stderr
    printed = json.loads(made.stdout)
    assert printed["url"].startswith(f"{base}/hooks/")
    sent = subprocess.run(
        ["bash", "-c", docs_line()],
        capture_output=True,
        text=True,
        env=clean_env(URL=printed["url"], SECRET=printed["secret"]),
        timeout=PATIENCE,
        check=False,
    )
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout)
    assert (answer["status"], answer["duplicate"], answer["step"]) == ("delivered", False, 1)
    assert cli.head("r1").status is RunStatus.RUNNING
    cli.work_until_idle()
    done = cli.head("r1")
    assert done.status is RunStatus.DONE
    assert '"conclusion": "success"' in (done.summary or "")


def test_the_line_ratchet_hook_prints_sends_a_signed_delivery(served):
    cli, base = served
    made = hook(cli, base)
    assert made.returncode == 0, made.stderr
    url = re.search(r"URL\s+(\S+)", made.stdout)
    assert url is not None
    assert url.group(1) == json.loads(hook(cli, base, "--json").stdout)["url"]
    line = made.stdout.strip().splitlines()[-1].strip()
    sent = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, timeout=PATIENCE, check=False
    )
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["status"] == "delivered"


def test_ratchet_hook_refuses_an_unknown_run_and_a_deployed_store(tmp_path):
    cli = Cli(tmp_path)
    cli.ok("start", "--agent", "tests.hooks_agent:agent", "--run-id", "r1")
    unknown = cli.run("hook", "nope", "ci-finished")
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr == "ratchet: no run with id 'nope' in this store\n"
    undeclared = cli.run("hook", "r1", "deploy-done")
    assert undeclared.returncode == 2
    assert "waits for no event named 'deploy-done'" in undeclared.stderr
    deployed = subprocess.run(
        [*cli.argv()[:-2], "--store", "dynamodb://t?ledger=l&app=a", "hook", "r1", "x"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=PATIENCE,
        check=False,
    )
    assert deployed.returncode == 2
    assert "needs a local sqlite:// store" in deployed.stderr
    assert not (tmp_path / "ratchet.hook-key").exists()  # a refused hook makes no key


def test_the_docs_recipe_signs_the_bytes_it_sends_as_github_does():
    """docs/webhooks.md's line: `printf '%s' "$body" | openssl dgst -sha256 -hmac "$SECRET"`
    is the HMAC of the body's exact bytes under the secret's text, and `--data-binary "$body"`
    sends those bytes (the first test runs the whole line against `ratchet serve`)."""
    line = docs_line()
    body = re.search(r"body='([^']*)'", line)
    signing = re.search(r"sig=\$\((.*?)\);", line)
    assert body is not None
    assert signing is not None
    assert '--data-binary "$body"' in line
    assert '-H "X-Hub-Signature-256: sha256=$sig"' in line
    sent = body.group(1).encode()
    sig = subprocess.run(
        ["bash", "-c", f"body='{body.group(1)}'; {signing.group(1)}"],
        capture_output=True,
        text=True,
        env=clean_env(SECRET=SECRET),
        check=True,
    ).stdout.strip()
    assert f"sha256={sig}" == github_signature(SECRET, sent)
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Delivery": "d-1",
        "X-Hub-Signature-256": f"sha256={sig}",
    }
    assert verify_delivery(headers, sent, SECRET, now=NOW).payload == json.loads(sent)


# --- what a sender with the URL alone cannot do to ratchet serve ---------------------------------

OVERSIZED = 40 * 1024 * 1024
CHUNK = 64 * 1024


def _hook(cli: Cli, base: str) -> tuple[str, str]:
    """The path and the secret of run r1's hook."""
    made = hook(cli, base, "--json")
    assert made.returncode == 0, made.stderr
    printed = json.loads(made.stdout)
    return urlsplit(printed["url"]).path, printed["secret"]


def _connect(base: str) -> socket.socket:
    host, port = urlsplit(base).hostname, urlsplit(base).port
    assert host is not None
    assert port is not None
    return socket.create_connection((host, port), timeout=PATIENCE)


def _request_head(path: str, length: int, headers: dict[str, str]) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Length: {length}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _answer(connection: socket.socket) -> tuple[int, Any]:
    """The status and JSON body of the one answer on `connection`, read to its end (the
    request said Connection: close)."""
    connection.setblocking(True)
    connection.settimeout(PATIENCE)
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass  # closed with the rest of our body unread: what came before the reset is whole
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), f"no answer: {received[:200]!r}"
    return int(head.split()[1]), json.loads(body)


def _post(base: str, path: str, body: bytes, headers: dict[str, str]) -> int:
    with _connect(base) as connection:
        connection.sendall(_request_head(path, len(body), headers) + body)
        return _answer(connection)[0]


@pytest.mark.parametrize("declared", [100_000_000, MAX_EVENT_BYTES + 1])
def test_a_declared_length_over_the_limit_is_refused_at_once_with_no_body_sent(served, declared):
    cli, base = served
    path, _ = _hook(cli, base)
    with _connect(base) as connection:
        # Given the headers of a delivery that declares its length and sends no body
        started = time.monotonic()
        connection.sendall(_request_head(path, declared, {"Content-Type": "application/json"}))

        # Then serve answers on the headers alone, long before its idle limit ends the wait
        status, answer = _answer(connection)
        seconds = time.monotonic() - started
    print(f"\nContent-Length {declared:,}, no body: {status} in {seconds:.3f} s")
    assert status == 413
    assert answer["problems"] == [
        {"field": "body", "message": f"body: over the {MAX_EVENT_BYTES:,}-byte limit"}
    ]
    assert seconds < IDLE_SECONDS
    assert cli.head("r1").status is RunStatus.WAITING


def test_an_oversized_body_is_answered_before_it_is_sent_in_full(served):
    cli, base = served
    path, _ = _hook(cli, base)
    chunk = b"x" * CHUNK
    with _connect(base) as connection:
        # Given a delivery of 40 MiB, sent as fast as the server reads it
        connection.sendall(_request_head(path, OVERSIZED, {"Content-Type": "application/json"}))
        connection.setblocking(False)
        sent = 0
        deadline = time.monotonic() + PATIENCE
        while True:
            assert time.monotonic() < deadline, f"no answer after {sent:,} bytes sent"
            writing = [connection] if sent < OVERSIZED else []
            readable, writable, _ = select.select([connection], writing, [], 1.0)
            if readable:
                break
            if writable:
                try:
                    sent += connection.send(chunk[: OVERSIZED - sent])
                except (BrokenPipeError, ConnectionResetError):
                    break  # the server answered and closed: the answer is in our buffer

        # Then the answer came while most of the body was still to send: serve stopped
        # reading at the headers (what it read is at most what was sent)
        status, _ = _answer(connection)
    print(f"\n{OVERSIZED:,} bytes declared: {status} after {sent:,} bytes sent")
    assert status == 413
    assert sent < OVERSIZED
    assert cli.head("r1").status is RunStatus.WAITING


def test_junk_from_one_address_never_gets_the_hooks_signed_deliveries_refused(served_unworked):
    cli, base = served_unworked
    path, secret = _hook(cli, base)
    junk, signed = [], []
    # Given a flood of unsigned junk to the hook's URL, from the address the signed deliveries
    # come from too (a tunnel in front of serve gives every sender one address)
    for round_ in range(5):
        for n in range(20):
            body = json.dumps({"junk": n}).encode()
            junk.append(_post(base, path, body, {"Content-Type": "application/json"}))
        # When the sender that holds the secret delivers amid it
        body = json.dumps({"conclusion": "success", "round": round_}).encode()
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": "workflow_run",
            "X-GitHub-Delivery": f"delivery-{round_}",
            "X-Hub-Signature-256": github_signature(secret, body),
        }
        signed.append(_post(base, path, body, headers))

    # Then every signed delivery is taken, and only the junk is refused (then throttled)
    taken = signed.count(200)
    print(f"\nunder {len(junk)} junk posts ({dict(Counter(junk))}): {taken} of 5 signed taken")
    assert signed == [200] * 5
    assert set(junk) <= {401, 429}
    events = [e for e in _mailbox(cli) if e.source == "webhook"]
    assert sorted(e.event_id for e in events) == [f"delivery-{n}" for n in range(5)]


def _mailbox(cli: Cli) -> list[SentEvent]:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        return runtime.mailbox.of_run("r1")
    finally:
        runtime.close()
