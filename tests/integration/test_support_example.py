"""The MCP example (examples/support_agent), as its docstring runs it: the orders service's MCP
server in a process of its own, and `ratchet run` on the agent whose tools all come from it.
The refund reaches the server with the step's idempotency key and is applied once, the email
is sent once, and running the same run again changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mcp_processes import free_port, wait_listening
from tests.processes import RATCHET, clean_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support_agent" / "src"
pytestmark = pytest.mark.slow


@pytest.fixture
def orders(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The orders server: its URL, and the folder where it keeps what it did."""
    port, data = free_port(), tmp_path / "orders"
    env = clean_env(PYTHONPATH=str(EXAMPLE))
    argv = ["-m", "support_agent.orders_server", "--port", str(port), "--data", str(data)]
    with (tmp_path / "orders.err").open("w") as err:
        server = subprocess.Popen(
            [sys.executable, *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            wait_listening(server, port)
            yield f"http://127.0.0.1:{port}/mcp", data
        finally:
            server.kill()
            server.wait()


def ratchet(root: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(PYTHONPATH=os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")]))
    env["SUPPORT_MCP_URL"] = url
    return subprocess.run(
        [*RATCHET, "--store", f"sqlite:///{root / 'ratchet.db'}", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_support_agent_refunds_once_and_emails_once_through_the_mcp_server(tmp_path, orders):
    url, data = orders
    run = ("run", "--agent", "support_agent.agent:agent", "--run-id", "t-1", "--model", "scripted")
    ticket = ("--input", '{"order_id": "A-100", "amount": 20}')

    done = ratchet(tmp_path, url, *run, *ticket)
    again = ratchet(tmp_path, url, *run, *ticket)
    status = ratchet(tmp_path, url, "status", "t-1", "--json")

    assert done.returncode == 0, done.stderr
    assert again.returncode == 0, again.stderr
    head = json.loads(status.stdout)
    assert (head["status"], head["step"]) == ("done", 3)
    assert head["summary"] == "emailed ada@example.com"
    assert json.loads((data / "refunds.json").read_text()) == {
        "t-1/step-2": {"order_id": "A-100", "amount": 20}
    }
    assert [json.loads(line) for line in (data / "emails.jsonl").read_text().splitlines()] == [
        {"to": "ada@example.com", "message": "We refunded 20 EUR. Sorry!"}
    ]
