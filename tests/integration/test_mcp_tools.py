"""MCP tools against a real MCP server (tests/mcp_server.py, the SDK's own `MCPServer`), over
streamable HTTP on a free local port and over stdio: the server's tools become the agent's,
listed once when the run starts and pinned in its data (a server changed later does not change
them, and a pinned tool it dropped fails the run, naming it); a read-only tool gets no key, a
side effect gets the step's key in `_meta`; a tool that is not idempotent, its server dying in
the middle of the call, is not called again: the run asks a person; and a server that is down
when a run starts refuses the start, with nothing written."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import JsonValue

from ratchet.client import Client
from ratchet.engine import Outcome
from ratchet.errors import StepAttemptFailed
from ratchet.mcp import pin_key
from ratchet.runs import McpToolsUnavailable
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.models import Bindings
from ratchet.state import RunOptions, RunStatus
from ratchet.tools import McpServer
from tests import mcp_agent
from tests.mcp_agent import AGENT, SERVER_SCRIPT
from tests.mcp_processes import free_port, wait_listening

LOG = logging.getLogger("ratchet.tests.mcp")
pytestmark = pytest.mark.slow


class Shop:
    """The MCP server process on one port, restarted at will (a deploy, a crash)."""

    def __init__(self, root: Path) -> None:
        self.log = root / "calls.jsonl"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._err = (root / "server.err").open("a")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        self.stop()
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(SERVER_SCRIPT),
                *("--log", str(self.log), "--port", str(self.port)),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._err,
        )
        wait_listening(self.process, self.port)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Shop]:
    server = Shop(tmp_path)
    yield server
    server.stop()
    server._err.close()


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    opened = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path / 'ratchet.db'}"))
    yield opened
    opened.close()


def use_server(monkeypatch: pytest.MonkeyPatch, server: McpServer) -> None:
    monkeypatch.setattr(mcp_agent, "agent", mcp_agent.make_agent(server))


def start(runtime: LocalRuntime, run_id: str, calls: list[Any]) -> Client:
    client = Client(runtime, worker_id="starter", logger=LOG)
    client.start(
        run_id=run_id, agent=AGENT, model="scripted", input={"calls": cast("JsonValue", calls)}
    )
    return client


def advance(runtime: LocalRuntime, run_id: str) -> tuple[Outcome, list[str]]:
    """Advance the run until it stops: its outcome, and the failed attempts on the way."""
    engine = runtime.engine(worker_id="worker", logger=LOG)
    failures: list[str] = []
    for _ in range(10):
        try:
            outcome = engine.advance(run_id).outcome
        except StepAttemptFailed as failed:
            failures.append(str(failed))
            continue
        if outcome is not Outcome.CONTINUE:
            return outcome, failures
    raise AssertionError("the run did not stop")


def test_the_tools_are_pinned_at_the_start_and_a_changed_server_does_not_change_them(
    tmp_path, monkeypatch, shop, runtime
):
    # Given a run started against the shop's first tool list
    shop.start()
    use_server(monkeypatch, McpServer(url=shop.url, name="shop"))
    calls = [["lookup_order", {"order_id": "A-1"}], ["refund", {"order_id": "A-1", "amount": 5}]]
    start(runtime, "pinned", calls)
    pinned = runtime.context("pinned", RunOptions()).data
    assert pinned is not None
    stored = json.loads(pinned.get(pin_key(McpServer(url=shop.url, name="shop"))) or "{}")
    assert [t["name"] for t in stored["tools"]] == ["lookup_order", "refund", "send_wire"]
    assert stored["tools"][0]["annotations"] == {"readOnlyHint": True}

    # When the server is deployed anew with another list, and a fresh process binds the run
    shop.start("--changed")
    head = runtime.store.load_head("pinned")
    assert head is not None
    binding = Bindings(runtime.context, anthropic_api_key=None)(head)

    # Then the run's tools are still those of its start: names, descriptions, schemas, classes
    specs = {t.name: t for t in binding.agent.tools}
    assert sorted(specs) == ["lookup_order", "refund", "send_wire"]
    assert specs["lookup_order"].description == "Look up an order by id."
    assert specs["refund"].spec().input_schema["required"] == ["order_id", "amount"]
    assert [(t.side_effect, t.at_most_once) for t in binding.agent.tools] == [
        (False, False),
        (True, False),
        (True, True),
    ]

    # And the pinned tool the server dropped fails the run at once, naming it and the server
    outcome, failures = advance(runtime, "pinned")
    head = runtime.store.load_head("pinned")
    assert head is not None
    assert outcome is Outcome.FAILED
    assert failures == []
    assert head.error is not None
    assert "MCP server 'shop'" in head.error
    assert "no longer has the tool 'refund' this run pinned" in head.error
    assert [c["tool"] for c in shop.calls()] == ["lookup_order"]


def test_a_new_run_takes_the_servers_new_list_and_only_the_tools_it_names(
    monkeypatch, shop, runtime
):
    shop.start("--changed")
    use_server(monkeypatch, McpServer(url=shop.url, name="shop"))
    with pytest.raises(McpToolsUnavailable, match=r"a tool named 'admin\.close_account'"):
        start(runtime, "all", [])

    chosen = McpServer(url=shop.url, name="shop", tools=["send_wire", "lookup_order"])
    use_server(monkeypatch, chosen)
    start(runtime, "chosen", [])
    head = runtime.store.load_head("chosen")
    assert head is not None
    bound = Bindings(runtime.context, anthropic_api_key=None)(head).agent
    assert [(t.name, t.description) for t in bound.tools] == [
        ("lookup_order", "Look up any order, fast."),
        ("send_wire", "Send a wire through the bank (which takes no idempotency key)."),
    ]

    use_server(monkeypatch, McpServer(url=shop.url, name="shop", tools=["refund"]))
    with pytest.raises(McpToolsUnavailable, match=r"MCP server 'shop' .* has no tool 'refund'"):
        start(runtime, "gone", [])
    assert runtime.store.load_head("all") is None
    assert runtime.store.load_head("gone") is None


def test_a_read_only_tool_gets_no_key_and_a_side_effect_gets_the_steps_key_in_meta(
    monkeypatch, shop, runtime
):
    shop.start()
    use_server(monkeypatch, McpServer(url=shop.url, headers={"Authorization": "Bearer t0ken"}))
    calls = [["lookup_order", {"order_id": "A-1"}], ["refund", {"order_id": "A-1", "amount": 5}]]
    start(runtime, "keys", calls)

    outcome, failures = advance(runtime, "keys")

    head = runtime.store.load_head("keys")
    assert head is not None
    assert (outcome, failures) == (Outcome.DONE, [])
    assert head.summary == "refunded 5 EUR on A-1"
    bearer = {"authorization": "Bearer t0ken"}
    assert shop.calls() == [
        {"tool": "lookup_order", "arguments": {"order_id": "A-1"}, "key": None, **bearer},
        {
            "tool": "refund",
            "arguments": {"order_id": "A-1", "amount": 5},
            "key": "keys/step-2",
            **bearer,
        },
    ]


def test_an_error_the_tool_reports_is_the_steps_result_for_the_model(monkeypatch, shop, runtime):
    shop.start()
    use_server(monkeypatch, McpServer(url=shop.url))
    start(runtime, "too-much", [["refund", {"order_id": "A-1", "amount": 500}]])

    outcome, failures = advance(runtime, "too-much")

    head = runtime.store.load_head("too-much")
    assert head is not None
    assert (outcome, failures) == (Outcome.DONE, [])
    assert head.summary is not None
    assert head.summary.startswith("refund reported an error: ")
    assert "500 EUR is more than order A-1's total" in head.summary


def test_arguments_the_pinned_schema_refuses_never_reach_the_server(monkeypatch, shop, runtime):
    shop.start()
    use_server(monkeypatch, McpServer(url=shop.url))
    start(runtime, "bad", [["refund", {"order_id": "A-1", "amount": "five"}]])

    outcome, failures = advance(runtime, "bad")

    assert outcome is Outcome.FAILED
    assert len(failures) == 2
    assert "invalid arguments for refund: amount: 'five' is not of type 'integer'" in failures[0]
    assert shop.calls() == []


def test_a_server_dying_mid_call_of_a_non_idempotent_tool_is_not_called_again(
    monkeypatch, shop, runtime
):
    # Given a wire tool that is not idempotent, on a server that dies in the middle of the call
    shop.start("--die-in", "send_wire")
    use_server(monkeypatch, McpServer(url=shop.url, timeout_seconds=10))
    start(runtime, "wire", [["send_wire", {"amount": 120, "to": "ACME"}]])
    engine = runtime.engine(worker_id="worker", logger=LOG)

    # When the step's call is cut off, and the server comes back
    with pytest.raises(StepAttemptFailed, match=r"MCP server .* failed calling send_wire"):
        engine.advance("wire")
    shop.start()

    # Then the retried step does not call again: it parks, asking a person whether it ran
    outcome, failures = advance(runtime, "wire")
    head = runtime.store.load_head("wire")
    assert head is not None
    assert (outcome, failures) == (Outcome.WAITING, [])
    assert head.waiting is not None
    assert head.waiting.request.prompt == (
        "send_wire may or may not have run at step 1 with these arguments: did it?"
    )
    assert [c["tool"] for c in shop.calls()] == ["send_wire"]

    # And "it ran" ends the run with what the person said, the wire sent once
    Client(runtime, worker_id="dana", logger=LOG).approve(
        "wire", by="dana", answer={"ran": True, "result": "ref 42"}
    )
    outcome, _ = advance(runtime, "wire")
    head = runtime.store.load_head("wire")
    assert head is not None
    assert outcome is Outcome.DONE
    assert head.summary == "dana says send_wire ran: ref 42"
    assert shop.calls() == [
        {"tool": "send_wire", "arguments": {"amount": 120, "to": "ACME"}, "key": "wire/step-1"}
    ]


def test_a_server_down_at_the_start_refuses_the_run_with_nothing_written(
    monkeypatch, shop, runtime
):
    use_server(monkeypatch, McpServer(url=shop.url, name="shop"))

    with pytest.raises(McpToolsUnavailable) as refused:
        start(runtime, "down", [])

    assert str(refused.value).startswith(
        f"agent 'shop' cannot start: MCP server 'shop' ({shop.url}) failed listing its tools: "
    )
    assert refused.value.fields == ("agent",)
    assert runtime.store.load_head("down") is None
    data = runtime.context("down", RunOptions()).data
    assert data is not None
    assert data.items() == []


def test_a_stdio_server_is_started_for_the_listing_and_each_call(tmp_path, monkeypatch, runtime):
    log = tmp_path / "stdio.jsonl"
    server = McpServer(
        command=sys.executable, args=[str(SERVER_SCRIPT), "--stdio", "--log", str(log)]
    )
    use_server(monkeypatch, server)
    calls = [["lookup_order", {"order_id": "B-2"}], ["refund", {"order_id": "B-2", "amount": 7}]]
    start(runtime, "stdio", calls)

    outcome, failures = advance(runtime, "stdio")

    head = runtime.store.load_head("stdio")
    assert head is not None
    assert (outcome, failures, head.status) == (Outcome.DONE, [], RunStatus.DONE)
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        {"tool": "lookup_order", "arguments": {"order_id": "B-2"}, "key": None},
        {"tool": "refund", "arguments": {"order_id": "B-2", "amount": 7}, "key": "stdio/step-2"},
    ]
