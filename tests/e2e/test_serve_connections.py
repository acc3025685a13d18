"""`ratchet serve` answers everyone while some connections say nothing: a browser's speculative
connection, or a client that sent half a request and stopped, holds up no other request, and is
closed once idle too long; SIGTERM still ends the server at once (issue 22, item 5)."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet.web.serve import server
from tests.processes import Cli, clean_env, serving

ANSWER_SECONDS = 1.0
"""The bound on one answer while the silent connections are open (it takes milliseconds)."""
CLOSED_WITHIN_SECONDS = 10.0
"""A connection idle past a 1 s limit is closed at the next check, a second later."""
PATIENCE = 30.0
"""How long a test waits for something that takes well under a second when it works."""


def _silent_connections(host: str, port: int) -> list[socket.socket]:
    """One connection that sends nothing, and one that sends half a request and stops."""
    idle = socket.create_connection((host, port), timeout=PATIENCE)
    half = socket.create_connection((host, port), timeout=PATIENCE)
    half.sendall(b"GET /dashboard HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    return [idle, half]


def _get(url: str, timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        response.read()
        return response.status, time.monotonic() - started


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    cli = Cli(tmp_path)
    cli.ok("start", "--goal", "file a note", "--run-id", "r1")
    argv = cli.argv("serve", "--port", "0")
    with serving(argv, log=tmp_path / "serve.log", env=clean_env(PYTHONUNBUFFERED="1")) as served:
        yield served.process, served.base


@pytest.mark.slow
def test_the_dashboard_answers_while_silent_connections_are_held_open(served):
    process, base = served
    host, port = base.removeprefix("http://").split(":")
    assert _get(f"{base}/dashboard", timeout=PATIENCE)[0] == 200  # warmed up

    # Given a connection that sends nothing and one that sent half a request
    silent = _silent_connections(host, int(port))
    try:
        # When a browser asks for the dashboard and a run, several times
        answers = [_get(f"{base}{path}", ANSWER_SECONDS) for path in ["/dashboard", "/runs/r1"] * 3]

        # Then each is answered at once, from the store (the server's thread may use it)
        assert [status for status, _ in answers] == [200] * 6
        assert max(seconds for _, seconds in answers) < ANSWER_SECONDS

        # And SIGTERM still ends the server, silent connections and all
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=PATIENCE) == 0
    finally:
        for connection in silent:
            connection.close()


def test_a_connection_idle_too_long_is_closed():
    # Given a server whose idle limit is a second, and a connection that sends nothing
    httpd = server([], host="127.0.0.1", port=0, idle_seconds=1)
    serving = threading.Thread(target=httpd.serve_forever, daemon=True)
    serving.start()
    try:
        idle, half = _silent_connections("127.0.0.1", httpd.server_port)

        # Then the server closes both (recv sees the end of the stream) within a few seconds
        for connection in (idle, half):
            with connection:
                connection.settimeout(CLOSED_WITHIN_SECONDS)
                assert connection.recv(1) == b"", "closed without an answer"
        # And it still answers the next request (no route here: 404)
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(f"http://127.0.0.1:{httpd.server_port}/nowhere", timeout=PATIENCE)
        assert refused.value.code == 404
    finally:
        httpd.server_close()
        serving.join(timeout=PATIENCE)
    assert not serving.is_alive(), "server_close ends serve_forever"
