"""The pull-request agent: open a pull request, wait for CI to report on it, sleep and re-run
CI once if it failed, ask a person before merging, merge.

It waits on the world three ways, and holds no process (and on AWS no compute) while it does:

- for CI: `wait_for_event("ci-finished", timeout=..., schema=CiFinished, webhook=True)`: the
  run parks until an event of that name arrives, by `ratchet send`, the runs API, or a signed
  webhook delivery to the wait's URL (`ratchet hook RUN ci-finished` prints it). A payload the
  schema refuses is refused to its sender. No report within the timeout: the step's result
  says so and the agent gives up waiting.
- for a time: `sleep(RETRY_AFTER_SECONDS)` before re-running a failed CI (a flaky test gets a
  moment; `ratchet wake RUN` ends the nap early).
- for a person: `ask_person` before the merge.

The pull request and the merge are fake and local: records in the run's durable data, each
written at most once per step key (`ctx.idempotency_key`), as a real forge's API would take an
idempotency key. So a step retried after a crash opens no second pull request and merges once.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field

from ratchet.tools import (
    Agent,
    Decision,
    Done,
    RunData,
    StepView,
    ToolCall,
    ToolContext,
    ToolResult,
    ask_person,
    sleep,
    tool,
    wait_for_event,
)

CI_TIMEOUT_SECONDS = 2 * 3600
"""How long the agent waits for CI to report before it gives up on it."""
RETRY_AFTER_SECONDS = 60
"""How long it sleeps before re-running a CI that failed."""
PULLS = "pulls/"
MERGES = "merges/"
CI_RUNS = "ci-runs/"


class PrInput(BaseModel):
    """What a run is started with: `--param branch=fix-login --param title='Fix the login'`."""

    branch: str = Field(default="fix-login", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")
    title: str = Field(default="Fix the login redirect", min_length=1, max_length=200)


class CiFinished(BaseModel):
    """The `ci-finished` event's payload: what CI says when it is done."""

    conclusion: Literal["success", "failure"]
    url: str = Field(default="", max_length=2000)


class OpenPullRequest(BaseModel):
    branch: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")
    title: str = Field(min_length=1, max_length=200)


class Nothing(BaseModel):
    pass


def _data(ctx: ToolContext) -> RunData:
    data: RunData = ctx.resources
    return data


def _pull_number(ctx: ToolContext) -> int:
    """The run's pull request: the one `open_pull_request` recorded."""
    pulls = _data(ctx).items(PULLS)
    if not pulls:
        raise ValueError("no pull request has been opened in this run")
    number: int = json.loads(pulls[0][1])["number"]
    return number


@tool(side_effect=True)
def open_pull_request(args: OpenPullRequest, ctx: ToolContext) -> str:
    """Open a pull request for the branch (once per step, however often the step is tried)."""
    data = _data(ctx)
    number = 100 + len(data.items(PULLS)) + 1
    record = json.dumps({"number": number, "branch": args.branch, "title": args.title})
    if not data.put_once(PULLS + ctx.idempotency_key, record):
        number = json.loads(data.get(PULLS + ctx.idempotency_key) or "{}")["number"]
    return f"Opened pull request #{number} ({args.branch}): {args.title}. CI is running."


@tool()
def wait_for_ci(args: Nothing, ctx: ToolContext) -> ToolResult:
    """Wait for CI to report on the pull request (the `ci-finished` event or its webhook)."""
    return wait_for_event(
        "ci-finished",
        timeout=CI_TIMEOUT_SECONDS,
        schema=CiFinished,
        webhook=True,
        details={"what": "CI's report on the pull request"},
    )


@tool()
def pause_before_retry(args: Nothing, ctx: ToolContext) -> ToolResult:
    """Sleep a minute before re-running a failed CI: flaky tests get a moment."""
    return sleep(RETRY_AFTER_SECONDS)


@tool(side_effect=True)
def rerun_ci(args: Nothing, ctx: ToolContext) -> str:
    """Re-run CI on the pull request (once per step)."""
    _data(ctx).put_once(CI_RUNS + ctx.idempotency_key, "requested")
    return "CI re-run requested."


@tool()
def ask_to_merge(args: Nothing, ctx: ToolContext) -> ToolResult:
    """Ask a person to approve merging the pull request; the run waits for their answer."""
    number = _pull_number(ctx)
    return ask_person(f"CI passed on pull request #{number}. Merge it?", number=number)


@tool(side_effect=True)
def merge(args: Nothing, ctx: ToolContext) -> str:
    """Merge the pull request (applied at most once per step)."""
    number = _pull_number(ctx)
    if _data(ctx).put_once(MERGES + ctx.idempotency_key, str(number)):
        return f"Merged pull request #{number}."
    return f"Pull request #{number} was merged already."


def pr_policy(view: StepView) -> Decision:
    """The scripted model, for offline runs: a pure function of the bounded view."""
    asked = PrInput.model_validate(view.params)
    tools = [m.tool for m in view.messages]
    last, result = (tools[-1] if tools else None), (view.last_result or "")
    if last is None:
        return ToolCall(name="open_pull_request", arguments=asked.model_dump())
    if last in ("open_pull_request", "rerun_ci"):
        return ToolCall(name="wait_for_ci", arguments={})
    if last == "wait_for_ci":
        if '"conclusion": "success"' in result:
            return ToolCall(name="ask_to_merge", arguments={})
        if result.startswith("No 'ci-finished' event"):
            return Done(summary="CI never reported on the pull request; left it open.")
        if tools.count("rerun_ci") == 0:
            return ToolCall(name="pause_before_retry", arguments={})
        return Done(summary="CI failed twice; left the pull request open for a person.")
    if last == "pause_before_retry":
        return ToolCall(name="rerun_ci", arguments={})
    if last == "ask_to_merge":
        if result.startswith("Approved"):
            return ToolCall(name="merge", arguments={})
        return Done(summary=f"Not merged: {result}")
    return Done(summary=result)


agent = Agent(
    name="pr",
    tools=[open_pull_request, wait_for_ci, pause_before_retry, rerun_ci, ask_to_merge, merge],
    goal="Open a pull request for {branch}, get CI green, and merge it once a person agrees.",
    input=PrInput,
    policy=pr_policy,
    resources=lambda ctx: ctx.data,
    events=["ci-finished"],
    instructions=(
        "You land pull requests. Open one, wait for CI with wait_for_ci; if CI failed, pause "
        "before retrying and re-run it once; ask a person before merging."
    ),
)
