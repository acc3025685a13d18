"""An agent whose tools all come from an MCP server (tests/mcp_server.py), for the tests of MCP
tools: its scripted policy makes the calls its `calls` param lists, one a step, in order, then
is done with the last result. `agent` is set by each test to the server it started
(`use_server`), so the runtime loads it by its import path as it would any agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ratchet.tools import Agent, Done, McpServer, StepView, ToolCall

SERVER_SCRIPT = Path(__file__).with_name("mcp_server.py")


def policy(view: StepView) -> ToolCall | Done:
    calls: list[list[Any]] = view.params["calls"]
    made = view.step - 1
    if made < len(calls):
        name, arguments = calls[made]
        return ToolCall(name=name, arguments=arguments)
    return Done(summary=view.last_result or "")


def make_agent(server: McpServer) -> Agent:
    return Agent(
        name="shop",
        tools=[],
        mcp=[server],
        goal="Serve the customer",
        policy=policy,
        default_params={"calls": []},
        remember=False,
        sleep=False,
    )


agent = make_agent(McpServer(url="http://127.0.0.1:9/mcp", name="shop"))
AGENT = f"{__name__}:agent"
