"""A support agent whose tools all come from the orders service's MCP server
(`support_agent.orders_server`): it looks the order up, refunds it, and emails the customer.

It declares the server, not the tools: `McpServer(url=...)` (`SUPPORT_MCP_URL`, by default the
server on this machine's port 8931). When a run starts, Ratchet lists the server's tools and
pins them in the run, so a deploy of the server mid-run does not change what a running run may
call. The annotations the server gives each tool decide how it is called (docs/mcp.md): the
refund gets the step's idempotency key in `_meta` and is applied once however often a crashed
step is retried; the email, which takes no key, is sent at most once.

    python -m support_agent.orders_server --port 8931 --data .orders &
    ratchet run --agent support_agent.agent:agent --input '{"order_id": "A-100", "amount": 20}'
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

from ratchet.tools import Agent, Done, McpServer, StepView, ToolCall

ORDERS_URL = os.environ.get("SUPPORT_MCP_URL", "http://127.0.0.1:8931/mcp")


class Ticket(BaseModel):
    order_id: str = Field(pattern=r"^[A-Z]-[0-9]{3}$", description="The order the ticket is about.")
    amount: int = Field(gt=0, le=500, description="The refund the customer was promised, EUR.")


def policy(view: StepView) -> ToolCall | Done:
    """The offline model: the three calls, in order, then done with the last result."""
    order = {"order_id": view.params["order_id"]}
    calls = [
        ToolCall(name="find_order", arguments=order),
        ToolCall(name="refund", arguments={**order, "amount": view.params["amount"]}),
        ToolCall(
            name="email_customer",
            arguments={**order, "message": f"We refunded {view.params['amount']} EUR. Sorry!"},
        ),
    ]
    if view.step <= len(calls):
        return calls[view.step - 1]
    return Done(summary=view.last_result or "")


agent = Agent(
    name="support",
    tools=[],
    mcp=[McpServer(url=ORDERS_URL, name="orders")],
    goal="Refund {amount} EUR on order {order_id} and tell the customer.",
    instructions="Look the order up first. Refund only what the ticket says, then email once.",
    input=Ticket,
    policy=policy,
)
