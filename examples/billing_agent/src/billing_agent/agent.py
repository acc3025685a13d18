"""The refund agent: look the order up, ask a person to approve a refund above
`APPROVAL_ABOVE`, refund it once, report.

Its one side effect, the refund, is applied at most once per step key (`ctx.idempotency_key`):
a step retried after a crash finds the refund already recorded under its key. The records live
in the run's durable data (`RunContext.data`), which every runtime keeps in its own store
(SQLite locally, DynamoDB on AWS), never on a disk that a Lambda container takes with it.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, Field, field_validator

from ratchet.tools import (
    Agent,
    Decision,
    Done,
    RunContext,
    RunData,
    RunState,
    StepView,
    ToolCall,
    ToolContext,
    ToolResult,
    ask_person,
    tool,
)

APPROVAL_ABOVE = Decimal("100.00")
"""A refund above this amount waits for a person's approval."""
REFUNDS = "refunds/"
"""The run's data keys of applied refunds: `refunds/<idempotency key>`."""

OrderId = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$", description="The order to refund.")
Amount = Field(gt=0, le=10_000, max_digits=7, decimal_places=2, description="In dollars.")


class RefundInput(BaseModel):
    """What a run is started with (its params): `--input '{"order_id": ..., "amount": ...}'`."""

    order_id: str = OrderId
    amount: Decimal = Amount

    @field_validator("amount")
    @classmethod
    def _in_cents(cls, amount: Decimal) -> Decimal:
        return amount.quantize(Decimal("0.01"))


class LookUpOrder(BaseModel):
    order_id: str = OrderId


class RequestApproval(BaseModel):
    order_id: str = OrderId
    amount: Decimal = Amount
    reason: str = Field(min_length=1, max_length=500)


class Refund(BaseModel):
    order_id: str = OrderId
    amount: Decimal = Amount


def _data(ctx: ToolContext) -> RunData:
    data: RunData = ctx.resources
    return data


def _refunds(data: RunData, order_id: str | None = None) -> list[dict[str, Any]]:
    records = [json.loads(value) for _, value in data.items(REFUNDS)]
    return [r for r in records if order_id is None or r["order_id"] == order_id]


@tool()
def look_up_order(args: LookUpOrder, ctx: ToolContext) -> str:
    """Look an order up: whether it has been refunded already in this run."""
    done = _refunds(_data(ctx), args.order_id)
    if done:
        return f"Order {args.order_id}: already refunded ${done[0]['amount']}."
    return f"Order {args.order_id}: paid, not refunded."


@tool()
def request_approval(args: RequestApproval, ctx: ToolContext) -> ToolResult:
    """Ask a person to approve a refund; the run waits for their answer."""
    return ask_person(
        f"Refund ${args.amount} on order {args.order_id}. {args.reason}",
        order_id=args.order_id,
        amount=str(args.amount),
    )


@tool(side_effect=True)
def refund(args: Refund, ctx: ToolContext) -> str:
    """Refund an order. Applied at most once per step, however often the step is retried."""
    record = {"order_id": args.order_id, "amount": str(args.amount), "key": ctx.idempotency_key}
    # A payment provider would take the key itself (Stripe's Idempotency-Key); the write below
    # stands for it: put_once applies the key once, and a retry finds it applied.
    applied = _data(ctx).put_once(REFUNDS + ctx.idempotency_key, json.dumps(record))
    if applied:
        return f"Refunded ${args.amount} on order {args.order_id}."
    return f"Refund of ${args.amount} on order {args.order_id} was already applied."


def refund_policy(view: StepView) -> Decision:
    """The scripted model, for offline runs: a pure function of the bounded view."""
    asked = RefundInput.model_validate(view.params)
    order = {"order_id": asked.order_id, "amount": str(asked.amount)}
    last = view.messages[-1].tool if view.messages else None
    if last is None:
        return ToolCall(name="look_up_order", arguments={"order_id": asked.order_id})
    if last == "look_up_order":
        if "already refunded" in (view.last_result or ""):
            return Done(summary=f"Order {asked.order_id} was already refunded; nothing to do.")
        if asked.amount > APPROVAL_ABOVE:
            reason = f"It is above the ${APPROVAL_ABOVE} a refund may reach unapproved."
            return ToolCall(name="request_approval", arguments={**order, "reason": reason})
        return ToolCall(name="refund", arguments=order)
    if last == "request_approval":
        if (view.last_result or "").startswith("Approved"):
            return ToolCall(name="refund", arguments=order)
        return Done(summary=f"Did not refund order {asked.order_id}: the refund was rejected.")
    return Done(summary=f"Refunded ${asked.amount} on order {asked.order_id}.")


def run_data(ctx: RunContext) -> RunData:
    if ctx.data is None:
        raise RuntimeError("the billing agent keeps its refunds in the run's data (ctx.data)")
    return ctx.data


def verify(ctx: RunContext, state: RunState) -> dict[str, Any]:
    refunds = _refunds(run_data(ctx))
    problems = [] if len(refunds) <= 1 else [f"{len(refunds)} refunds were applied"]
    return {"ok": not problems, "problems": problems, "refunds": refunds}


agent = Agent(
    name="billing",
    goal=(
        "Refund ${amount} on order {order_id}. Look the order up first; ask a person to approve "
        f"any refund above ${APPROVAL_ABOVE}; refund it once, and only if allowed."
    ),
    tools=[look_up_order, request_approval, refund],
    policy=refund_policy,
    input=RefundInput,
    resources=run_data,
    verify=verify,
)
