"""A refund agent for the tests of `ratchet check` and `ratchet.testing`, whose world is the user's
own: a SQLite file `shop.db` (an order, and a row per payment) and a text file `emails.txt`, both
relative, so each schedule of a check has its own (its scratch working directory).

The policy looks the order up, refunds it with the tool `params.refund` names, e-mails the
customer with the tool `params.email` names (none: no e-mail), and is done with a summary of its
own (never a tool's words). With `params.nap` (seconds), it first sleeps that long.

- `refund_naive` checks, then writes, and ignores its key: it checks that the order's balance
  covers the refund (as a careful person would), not whether this very refund was made; a
  retried step refunds again.
- `refund_once` is the same refund under `put_once` of its key in the run's data: applied once.
- `refund_saying_so` is `refund_once`, but a second call says "already refunded": the world
  is right, only the words differ.
- `email_naive` appends a line to `emails.txt` on every call.
- `refund_on_key` keys the payment on the call's key in the shop's own table (a primary key),
  `refund_ignoring_key` on a fresh id each call: for the direct test of a key.

`claude_agent` is the same agent with no scripted policy: a model decides (for the tests, the
`Recorded` stand-in for Claude, which counts its calls in `$CHECK_AGENT_MODEL_CALLS`).
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ratchet.tools import (
    Agent,
    Decision,
    Done,
    ModelRequest,
    RunData,
    StepView,
    Tool,
    ToolCall,
    ToolContext,
    ToolResult,
    sleep,
    tool,
)

SHOP = Path("shop.db")
EMAILS = Path("emails.txt")
ORDER = "A1"
ORDER_TOTAL = 100
REFUND = 30
SUMMARY = f"Refunded {REFUND} on order {ORDER}."
AGENT = f"{__name__}:agent"
CLAUDE_AGENT = f"{__name__}:claude_agent"
MODEL_CALLS_ENV = "CHECK_AGENT_MODEL_CALLS"


class Refund(BaseModel):
    order_id: str
    amount: int


class Order(BaseModel):
    order_id: str


class Nap(BaseModel):
    seconds: int


class Email(BaseModel):
    to: str
    text: str


def setup() -> None:
    """A fresh shop: one order of `ORDER_TOTAL`, no payments, no e-mails."""
    SHOP.unlink(missing_ok=True)
    EMAILS.unlink(missing_ok=True)
    with sqlite3.connect(SHOP) as shop:
        shop.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)")
        shop.execute("CREATE TABLE payments (id TEXT PRIMARY KEY, order_id TEXT, amount INTEGER)")
        shop.execute("INSERT INTO orders VALUES (?, ?)", (ORDER, ORDER_TOTAL))
    shop.close()


def effects() -> dict[str, Any]:
    """What the tools did to the world: the payments (how many, how much) and the e-mails."""
    with sqlite3.connect(SHOP) as shop:
        count, total = shop.execute(
            "SELECT count(*), coalesce(sum(amount), 0) FROM payments"
        ).fetchone()
    shop.close()
    emails = EMAILS.read_text(encoding="utf-8").splitlines() if EMAILS.exists() else []
    return {"payments": {"count": count, "total": total}, "emails": emails}


def effects_that_raise() -> dict[str, Any]:
    raise RuntimeError("the test database is down")


def effects_not_json() -> object:
    return {"payments": {1, 2}}


def _pay(payment_id: str, args: Refund) -> None:
    with sqlite3.connect(SHOP) as shop:
        shop.execute(
            "INSERT INTO payments VALUES (?, ?, ?)", (payment_id, args.order_id, args.amount)
        )
    shop.close()


def _balance(order_id: str) -> int:
    with sqlite3.connect(SHOP) as shop:
        (total,) = shop.execute("SELECT total FROM orders WHERE id = ?", (order_id,)).fetchone()
        (paid,) = shop.execute(
            "SELECT coalesce(sum(amount), 0) FROM payments WHERE order_id = ?", (order_id,)
        ).fetchone()
    shop.close()
    return int(total) - int(paid)


@tool()
def look_up_order(args: Order, ctx: ToolContext) -> str:
    """Look the order up."""
    return f"Order {args.order_id}: balance {_balance(args.order_id)}."


@tool(side_effect=True)
def refund_naive(args: Refund, ctx: ToolContext) -> str:
    """Refund the order: checks the balance covers it, then pays (the key is ignored)."""
    if _balance(args.order_id) < args.amount:
        return f"Order {args.order_id}'s balance does not cover {args.amount}."
    _pay(uuid.uuid4().hex, args)
    return f"Refunded {args.amount} on order {args.order_id}."


@tool(side_effect=True)
def refund_once(args: Refund, ctx: ToolContext) -> str:
    """Refund the order, once per step key."""
    data: RunData = ctx.resources
    if data.put_once("refunds/" + ctx.idempotency_key, str(args.amount)):
        _pay(uuid.uuid4().hex, args)
    return f"Refunded {args.amount} on order {args.order_id}."


@tool(side_effect=True)
def refund_saying_so(args: Refund, ctx: ToolContext) -> str:
    """Refund the order, once per step key; a second call says it was done already."""
    data: RunData = ctx.resources
    if not data.put_once("refunds/" + ctx.idempotency_key, str(args.amount)):
        return f"Order {args.order_id} was already refunded; nothing to do."
    _pay(uuid.uuid4().hex, args)
    return f"Refunded {args.amount} on order {args.order_id}."


@tool(side_effect=True)
def refund_on_key(args: Refund, ctx: ToolContext) -> str:
    """Refund the order; the payment's id is the key, so a second call changes nothing."""
    try:
        _pay(ctx.idempotency_key, args)
    except sqlite3.IntegrityError:
        return f"Refund {ctx.idempotency_key} was made already."
    return f"Refunded {args.amount} on order {args.order_id}."


@tool(side_effect=True)
def refund_ignoring_key(args: Refund, ctx: ToolContext) -> str:
    """Refund the order under a fresh payment id each call: `ctx.idempotency_key` unused."""
    _pay(uuid.uuid4().hex, args)
    return f"Refunded {args.amount} on order {args.order_id}."


@tool()
def nap(args: Nap, ctx: ToolContext) -> ToolResult:
    """Sleep before refunding (`params.nap` seconds; a week, say)."""
    return sleep(args.seconds)


@tool(side_effect=True)
def email_naive(args: Email, ctx: ToolContext) -> str:
    """E-mail the customer: a line appended to the outbox file, on every call."""
    with EMAILS.open("a", encoding="utf-8") as out:
        out.write(f"to {args.to}: {args.text}\n")
    return f"E-mailed {args.to}."


TOOLS: list[Tool[Any]] = [
    look_up_order,
    refund_naive,
    refund_once,
    refund_saying_so,
    refund_on_key,
    refund_ignoring_key,
    email_naive,
    nap,
]


def policy(view: StepView) -> Decision:
    done = [m.tool for m in view.messages if m.tool != "nap"]
    if view.params.get("nap") and not any(m.tool == "nap" for m in view.messages):
        return ToolCall(name="nap", arguments={"seconds": view.params["nap"]})
    if not done:
        return ToolCall(name="look_up_order", arguments={"order_id": ORDER})
    if len(done) == 1:
        refund = str(view.params.get("refund") or "refund_once")
        return ToolCall(name=refund, arguments={"order_id": ORDER, "amount": REFUND})
    email = view.params.get("email")
    if email and len(done) == 2:
        return ToolCall(name=str(email), arguments={"to": "ada@example.com", "text": SUMMARY})
    return Done(summary=SUMMARY)


agent = Agent(
    name="check-refunds",
    tools=TOOLS,
    goal="Refund order A1 and tell the customer.",
    policy=policy,
    resources=lambda ctx: ctx.data,
    default_params={"refund": "refund_once", "email": "", "nap": 0},
)
claude_agent = Agent(
    name="check-refunds-claude",
    tools=TOOLS,
    goal="Refund order A1 and tell the customer.",
    resources=lambda ctx: ctx.data,
    default_params={"refund": "refund_once", "email": "", "nap": 0},
)


class Recorded:
    """A stand-in for Claude: decides as the policy would, and counts each call it answers in
    the file `$CHECK_AGENT_MODEL_CALLS` (a line each), so a test sees whether it was asked."""

    def decide(self, request: ModelRequest) -> Decision:
        with Path(os.environ[MODEL_CALLS_ENV]).open("a", encoding="utf-8") as calls:
            calls.write(f"{request.view.run_id} {request.view.step}\n")
        return policy(request.view)


model = Recorded()
MODEL = f"{__name__}:model"
