"""MCP servers in subprocesses for the tests: a free local port, and waiting until it listens."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_listening(process: subprocess.Popen[bytes], port: int, *, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert process.poll() is None, "the MCP server exited as it started"
            time.sleep(0.05)
    raise AssertionError(f"the MCP server did not listen on port {port} within {seconds:g} s")
