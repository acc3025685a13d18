"""What the model is given: the view of a run's state, and the step prompt rendered from it
byte for byte from the template shipped in this package (and the summary prompt)."""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

from ratchet.engine.memory import SUMMARY_PROMPT
from ratchet.ports import StepView
from ratchet.state import RunState

_PLACEHOLDER = re.compile(r"\{\{(goal|completed_steps|last_tool_result)\}\}")
NOTHING_YET = "(none yet)"


def step_prompt(state: RunState) -> tuple[StepView, str]:
    """What the model is given for the next step of `state`: the view, and the step prompt
    rendered from it. `Client.replay` renders through this same function from the state the
    records fold into before the step, so replay shows what the model was given exactly when
    that state is the one the step loaded (the store's contract, `tests/conformance`)."""
    view = view_of(state)
    return view, render_step_prompt(view)


def view_of(state: RunState) -> StepView:
    return StepView(
        run_id=state.run_id,
        goal=state.goal,
        step=state.next_step,
        messages=state.messages,
        tool_results=state.tool_results,
        digest=state.digest,
        last_result=state.last_result,
        params=state.options.params,
        previous_failure=state.error,
        pinned=state.pinned,
        summary=state.memory,
        summarised_through=state.memory_through,
    )


@cache
def step_prompt_template() -> str:
    return resources.files("ratchet.engine").joinpath("step_prompt.md").read_text("utf-8")


def render_step_prompt(view: StepView) -> str:
    values = {
        "goal": view.goal,
        "completed_steps": render_completed_steps(view),
        "last_tool_result": render_last_result(view),
    }
    # One pass over the template: text that arrives in a value (a goal that happens to contain
    # "{{last_tool_result}}", say) is never substituted again.
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], step_prompt_template())


def render_last_result(view: StepView) -> str:
    """The last result; after a failed attempt at this step, followed by why it failed, so the
    model does not repeat the same mistake."""
    text = NOTHING_YET if view.last_result is None else view.last_result
    if view.previous_failure:
        text += f"\n\nThe previous attempt at step {view.step} failed: {view.previous_failure}"
    return text


def render_completed_steps(view: StepView) -> str:
    """The pinned facts, what the window no longer shows (the model's summary, or a per-tool
    digest), then each step of the window with its result."""
    lines: list[str] = []
    if view.pinned:
        lines.append("Facts to keep (pinned with remember):")
        lines.extend(f"- {fact}" for fact in view.pinned)
    if view.summary:
        lines.append(f"Steps 1-{view.summarised_through}, summarised:")
        lines.append(view.summary)
    elif view.digest:
        summarised = max(d.last_step for d in view.digest.values())
        lines.append(f"Steps 1-{summarised}, summarised:")
        for name, digest in sorted(view.digest.items(), key=lambda item: item[1].first_step):
            span = (
                f"step {digest.first_step}"
                if digest.calls == 1
                else f"steps {digest.first_step}-{digest.last_step}"
            )
            calls = "1 call" if digest.calls == 1 else f"{digest.calls} calls"
            last = (
                f", last with {_compact(digest.last_arguments)}"
                if digest.last_arguments is not None
                else ""
            )
            lines.append(f"- {name}: {calls} ({span}){last}")
    lines.extend(_step_lines(view, after=view.summarised_through))
    return "\n".join(lines) if lines else NOTHING_YET


def render_summary_prompt(view: StepView, *, limit: int) -> str:
    """What the model is asked when the oldest steps of the window are folded into its
    summary: the summary so far and the steps up to `view.summarise_through`."""
    steps = _step_lines(view, after=view.summarised_through, through=view.summarise_through)
    return SUMMARY_PROMPT.format(
        goal=view.goal,
        summary=view.summary or NOTHING_YET,
        steps="\n".join(steps),
        limit=f"{limit:,}",
    )


def _step_lines(view: StepView, *, after: int, through: int | None = None) -> list[str]:
    """`N. tool {arguments} -> result` for each step of the window after `after` (and up to
    `through`)."""
    results = {result.step: result for result in view.tool_results}
    lines = []
    for message in view.messages:
        if message.step <= after or (through is not None and message.step > through):
            continue
        result = results.get(message.step)
        outcome = result.text if result else "(no result recorded)"
        lines.append(f"{message.step}. {message.tool} {_compact(message.arguments)} -> {outcome}")
    return lines


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), ensure_ascii=False)
