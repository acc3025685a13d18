"""A scripted policy knows what the whole run has done, not only the window it is shown
(issue 36): `StepView.calls` and `done` count the steps folded out of the window too."""

from __future__ import annotations

from pydantic import BaseModel

import ratchet
from ratchet.state import RunStatus
from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, tool

ORDER = [f"task_{n}" for n in range(8)]
"""More tools than the window (5 steps) holds."""


class Nothing(BaseModel):
    pass


def _task(name: str):
    def run(args: Nothing, ctx: ToolContext) -> str:
        assert ctx.resources is not None
        if not ctx.resources.put_once(f"ran/{name}", "1"):
            return f"{name} ran twice"
        return f"{name} done"

    run.__name__ = name
    run.__doc__ = f"Do {name}."
    return tool(side_effect=True)(run)


def policy(view: StepView) -> ToolCall | Done:
    # Written the natural way, against the whole run: the next task not done yet.
    left = [name for name in ORDER if not view.done(name)]
    if not left:
        return Done(summary=f"{sum(view.calls(n) for n in ORDER)} tasks")
    return ToolCall(name=left[0], arguments={})


agent = Agent(
    name="long_list",
    goal="do every task once",
    tools=[_task(name) for name in ORDER],
    policy=policy,
    resources=lambda run: run.data,
)


def test_a_policy_counts_the_steps_the_window_no_longer_shows(tmp_path):
    client = ratchet.connect(f"sqlite:///{tmp_path}/ratchet.db", environ={})
    try:
        run = client.run(run_id="long", agent=f"{__name__}:agent")
        results = [c.result for c in client.history("long") if c.event == "step"]
    finally:
        client.close()

    assert run.status is RunStatus.DONE
    assert run.step == len(ORDER)
    assert run.summary == f"{len(ORDER)} tasks"
    assert results == [f"{name} done" for name in ORDER]
