"""The shop's orders service as an MCP server (the `mcp` SDK's `MCPServer`, streamable HTTP):
`python -m support_agent.orders_server --port 8931 --data .orders`.

Its three tools show the three ways Ratchet calls an MCP tool, decided by their annotations:

- `find_order` is `readOnlyHint`: a plain tool, called again freely after a crash;
- `refund` is `idempotentHint`, and honours Ratchet's idempotency key: a refund is kept under
  the key its request's `_meta` carries (`ratchet/idempotency_key`), so the same key twice
  refunds once, however often a crashed step is retried;
- `email_customer` is neither (a legacy mail relay that takes no key): Ratchet calls it at most
  once, and asks a person if a call was cut off.

What it did is kept in `--data`: `refunds.json` (by key) and `emails.jsonl` (one line a mail).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

IDEMPOTENCY_KEY = "ratchet/idempotency_key"
ORDERS = {
    "A-100": {"customer": "ada@example.com", "total": 120},
    "A-200": {"customer": "grace@example.com", "total": 45},
}


def build(data: Path) -> MCPServer:
    server = MCPServer("orders", log_level="WARNING")
    refunds = data / "refunds.json"
    emails = data / "emails.jsonl"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def find_order(order_id: str) -> str:
        """Look an order up: its customer and total, in euros."""
        order = ORDERS.get(order_id)
        if order is None:
            return f"no order {order_id}"
        return f"order {order_id}: customer {order['customer']}, total {order['total']} EUR"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    def refund(order_id: str, amount: int, ctx: Context) -> str:
        """Refund part of an order, in euros (once per idempotency key)."""
        key = (ctx.request_context.meta or {}).get(IDEMPOTENCY_KEY) or f"{order_id}:{amount}"
        done = json.loads(refunds.read_text()) if refunds.exists() else {}
        if key not in done:
            done[key] = {"order_id": order_id, "amount": amount}
            refunds.write_text(json.dumps(done, indent=2, sort_keys=True))
        return f"refunded {done[key]['amount']} EUR on {order_id} (refund {key})"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=False))
    def email_customer(order_id: str, message: str) -> str:
        """Email the order's customer (through a relay that takes no idempotency key)."""
        order = ORDERS.get(order_id)
        if order is None:
            return f"no order {order_id}"
        with emails.open("a") as out:
            out.write(json.dumps({"to": order["customer"], "message": message}) + "\n")
        return f"emailed {order['customer']}"

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--data", type=Path, default=Path(".orders"))
    given = parser.parse_args()
    given.data.mkdir(parents=True, exist_ok=True)
    build(given.data).run(transport="streamable-http", host="127.0.0.1", port=given.port)


if __name__ == "__main__":
    main()
