"""How an MCP tool's annotations decide how Ratchet calls it, and what `McpServer` takes: a
read-only tool is a plain tool; any other is a side effect sent the step's key; and one not
marked idempotent, on a server that does not say it honours the key, is at most once."""

from __future__ import annotations

import pytest

from ratchet.mcp import McpTool, bind_tools, side_effect_class
from ratchet.tools import Agent, McpServer

HTTP = McpServer(url="https://tools.example.com/mcp")
HONOURS_KEY = McpServer(url="https://pay.example.com/mcp", honours_idempotency_key=True)


@pytest.mark.parametrize(
    ("server", "annotations", "expected"),
    [
        (HTTP, {"readOnlyHint": True}, (False, False)),
        (HTTP, {"readOnlyHint": True, "idempotentHint": False}, (False, False)),
        (HTTP, {"idempotentHint": True}, (True, False)),
        (HTTP, {"idempotentHint": False}, (True, True)),
        (HTTP, {}, (True, True)),  # MCP's defaults: not read-only, not idempotent
        (HTTP, {"readOnlyHint": False, "destructiveHint": True}, (True, True)),
        (HONOURS_KEY, {"idempotentHint": False}, (True, False)),
        (HONOURS_KEY, {}, (True, False)),
        (HONOURS_KEY, {"readOnlyHint": True}, (False, False)),
    ],
)
def test_annotations_decide_the_side_effect_class(server, annotations, expected):
    assert side_effect_class(server, annotations) == expected


def test_a_pinned_tool_keeps_the_servers_schema_and_its_class():
    class Data:
        def __init__(self, values: dict[str, str]) -> None:
            self.values = values

        def get(self, key: str) -> str | None:
            return self.values.get(key)

    pin = (
        '{"server": "tools.example.com-mcp", "tools": [{"name": "send_wire", "description": '
        '"Send a wire.", "input_schema": {"type": "object", "properties": {"amount": {"type": '
        '"integer"}}, "required": ["amount"]}, "annotations": {"idempotentHint": false}}]}'
    )
    data = Data({"mcp-tools/tools.example.com-mcp": pin})
    agent = Agent(name="payer", tools=[], mcp=[HTTP])

    bound = bind_tools(agent, data)  # type: ignore[arg-type]  # reads only get()

    (wire,) = bound.tools
    assert isinstance(wire, McpTool)
    assert (wire.name, wire.side_effect, wire.at_most_once) == ("send_wire", True, True)
    assert wire.spec().input_schema["required"] == ["amount"]
    assert wire.parse({"amount": 5}).model_dump() == {"amount": 5}
    with pytest.raises(ValueError, match="'amount' is a required property"):
        wire.parse({})


@pytest.mark.parametrize(
    ("server", "name"),
    [
        (McpServer(url="http://127.0.0.1:8931/mcp"), "127.0.0.1-8931-mcp"),
        (McpServer(url="https://user:pw@mcp.example.com/mcp?x=1"), "mcp.example.com-mcp"),
        (
            McpServer(command="/usr/bin/python3", args=["/srv/shop/server.py", "-v"]),
            "python3-server.py",
        ),
        (McpServer(command="mcp-server-github", args=["--stdio"]), "mcp-server-github"),
        (McpServer(command="npx", args=["x"], name="github"), "github"),
    ],
)
def test_a_server_is_named_after_where_it_is(server, name):
    assert server.name == name


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({}, "either url= .* or command="),
        ({"url": "http://a/mcp", "command": "x"}, "either url="),
        ({"url": "ftp://a/mcp"}, "http:// or https://"),
        ({"command": "x", "headers": {"A": "b"}}, "headers are for url= servers"),
        ({"url": "http://a/mcp", "name": "no spaces"}, "name must be"),
        ({"url": "http://a/mcp", "timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_a_server_declared_wrongly_is_refused_when_the_agent_is_defined(given, refused):
    with pytest.raises(ValueError, match=refused):
        McpServer(**given)


def test_two_servers_of_one_agent_need_two_names():
    with pytest.raises(ValueError, match="give each McpServer a name="):
        Agent(name="a", tools=[], mcp=[HTTP, McpServer(url="https://tools.example.com/mcp")])
