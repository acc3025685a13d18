"""A real MCP server for the tests of MCP tools, built with the SDK's own `MCPServer`: run it as
`python tests/mcp_server.py --log FILE (--port N | --stdio) [--changed] [--die-in send_wire]`.

Every call it serves is appended to `--log` as a JSON line (the tool, its arguments, the
`ratchet/idempotency_key` its request's `_meta` carried and any `Authorization` header),
before the tool acts, so a test reads exactly what the server received, across restarts.
`--changed` is the same server after a deploy: `refund` gone, `lookup_order` described anew,
`admin.close_account` added (a name MCP allows and model APIs do not).
`--die-in TOOL` makes the process die (SIGKILL) in the middle of that tool's call, after
logging it: the effect happened, and the caller never hears back.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

IDEMPOTENCY_KEY = "ratchet/idempotency_key"


def build(log: Path, *, changed: bool, die_in: str | None) -> MCPServer:
    server = MCPServer("shop", log_level="WARNING")

    def record(tool: str, arguments: dict[str, object], ctx: Context) -> None:
        meta = ctx.request_context.meta or {}
        line = {"tool": tool, "arguments": arguments, "key": meta.get(IDEMPOTENCY_KEY)}
        request = ctx.request_context.request  # the HTTP request; None over stdio
        authorization = getattr(request, "headers", {}).get("authorization")
        if authorization is not None:
            line["authorization"] = authorization
        with log.open("a") as out:
            out.write(json.dumps(line, sort_keys=True) + "\n")
        if tool == die_in:
            os.kill(os.getpid(), signal.SIGKILL)

    description = "Look up an order by id." if not changed else "Look up any order, fast."

    @server.tool(description=description, annotations=ToolAnnotations(read_only_hint=True))
    def lookup_order(order_id: str, ctx: Context) -> str:
        record("lookup_order", {"order_id": order_id}, ctx)
        return f"order {order_id}: 2 items, paid 120 EUR"

    if not changed:

        @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
        def refund(order_id: str, amount: int, ctx: Context) -> str:
            """Refund part of an order (applied once per idempotency key)."""
            record("refund", {"order_id": order_id, "amount": amount}, ctx)
            if amount > 120:
                # A ToolError's words reach the caller; any other exception's are masked.
                raise ToolError(f"{amount} EUR is more than order {order_id}'s total")
            return f"refunded {amount} EUR on {order_id}"

    else:

        @server.tool(name="admin.close_account", annotations=ToolAnnotations(destructive_hint=True))
        def close_account(customer: str, ctx: Context) -> str:
            """Close a customer's account."""
            record("close_account", {"customer": customer}, ctx)
            return f"closed {customer}"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=False))
    def send_wire(amount: int, to: str, ctx: Context) -> str:
        """Send a wire through the bank (which takes no idempotency key)."""
        record("send_wire", {"amount": amount, "to": to}, ctx)
        return f"wired {amount} EUR to {to}"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--port", type=int)
    parser.add_argument("--stdio", action="store_true")
    parser.add_argument("--changed", action="store_true")
    parser.add_argument("--die-in")
    given = parser.parse_args()
    server = build(given.log, changed=given.changed, die_in=given.die_in)
    if given.stdio:
        server.run()
    else:
        server.run(transport="streamable-http", host="127.0.0.1", port=given.port)


if __name__ == "__main__":
    main()
