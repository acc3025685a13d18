"""The on-call agent: check a service's health, and if it is down open one incident for it.

Both tools are `async def`, on one `httpx2.AsyncClient` (httpx's API) that the agent's async
`resources` hook opens once per run. Ratchet awaits the hook and the tools on the same event
loop, the worker process's (or Lambda container's) one, so the client's connection pool is
shared by every call of the run. A tool over the step's time limit is cancelled there.

Opening an incident is the one side effect: it sends the step's idempotency key as the
`Idempotency-Key` header, so a step retried after a crash opens no second incident.
"""

from __future__ import annotations

import os
from typing import Any

import httpx2
from pydantic import BaseModel, Field

from ratchet.tools import Agent, Decision, Done, RunContext, StepView, ToolCall, ToolContext, tool

STATUS_API_URL = "STATUS_API_URL"
"""The environment variable naming the status service (on AWS, `[tool.ratchet] environment`)."""

ServiceName = Field(pattern=r"^[a-z][a-z0-9-]{0,63}$", description="The service's name.")


class StatusInput(BaseModel):
    """What a run is started with: `--input '{"service": "payments"}'`."""

    service: str = ServiceName


class CheckService(BaseModel):
    service: str = ServiceName


class OpenIncident(BaseModel):
    service: str = ServiceName
    summary: str = Field(min_length=1, max_length=500)


async def open_client(ctx: RunContext) -> httpx2.AsyncClient:
    """The run's HTTP client, opened once per process and run on Ratchet's event loop."""
    return httpx2.AsyncClient(base_url=os.environ[STATUS_API_URL], timeout=10.0)


def _client(ctx: ToolContext) -> httpx2.AsyncClient:
    client: httpx2.AsyncClient = ctx.resources
    return client


@tool()
async def check_service(args: CheckService, ctx: ToolContext) -> str:
    """Check a service's health: up or down, and what its health check says."""
    response = await _client(ctx).get(f"/health/{args.service}")
    state = "up" if response.status_code == 200 else "down"
    return f"{args.service} is {state} (HTTP {response.status_code}): {response.text[:200]}"


@tool(side_effect=True)
async def open_incident(args: OpenIncident, ctx: ToolContext) -> str:
    """Open an incident for a service that is down. Opened once per step, however often the
    step is retried: the status service applies each Idempotency-Key once."""
    response = await _client(ctx).post(
        "/incidents",
        json={"service": args.service, "summary": args.summary},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    response.raise_for_status()
    incident: dict[str, Any] = response.json()
    return f"Incident {incident['id']} is open for {args.service}."


def on_call_policy(view: StepView) -> Decision:
    """The scripted model, for offline runs: check, then open an incident if it is down."""
    service = StatusInput.model_validate(view.params).service
    last = view.messages[-1].tool if view.messages else None
    if last is None:
        return ToolCall(name="check_service", arguments={"service": service})
    if last == "check_service" and f"{service} is down" in (view.last_result or ""):
        summary = f"{service} fails its health check: {view.last_result}"[:500]
        return ToolCall(name="open_incident", arguments={"service": service, "summary": summary})
    if last == "check_service":
        return Done(summary=f"{service} is up; nothing to do.")
    return Done(summary=f"{service} was down: {view.last_result}")


agent = Agent(
    name="status",
    goal="Check the health of {service}; if it is down, open one incident for it.",
    tools=[check_service, open_incident],
    policy=on_call_policy,
    input=StatusInput,
    resources=open_client,
    step_timeout_seconds=30,
)
