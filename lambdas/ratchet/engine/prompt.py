"""The step prompt, rendered byte for byte from the template shipped in this package."""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

from ratchet.ports import StepView

_PLACEHOLDER = re.compile(r"\{\{(goal|completed_steps|last_tool_result)\}\}")
NOTHING_YET = "(none yet)"


@cache
def step_prompt_template() -> str:
    return resources.files("ratchet.engine").joinpath("step_prompt.md").read_text("utf-8")


def render_step_prompt(view: StepView) -> str:
    values = {
        "goal": view.goal,
        "completed_steps": render_completed_steps(view),
        "last_tool_result": NOTHING_YET if view.last_result is None else view.last_result,
    }
    # One pass over the template: text that arrives in a value (a goal that happens to contain
    # "{{last_tool_result}}", say) is never substituted again.
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], step_prompt_template())


def render_completed_steps(view: StepView) -> str:
    lines: list[str] = []
    if view.digest:
        summarised = max(d.last_step for d in view.digest.values())
        lines.append(f"Steps 1-{summarised}, summarised:")
        for name, digest in sorted(view.digest.items(), key=lambda item: item[1].first_step):
            span = (
                f"step {digest.first_step}"
                if digest.calls == 1
                else f"steps {digest.first_step}-{digest.last_step}"
            )
            calls = "1 call" if digest.calls == 1 else f"{digest.calls} calls"
            lines.append(f"- {name}: {calls} ({span}), last with {_compact(digest.last_arguments)}")
    results = {result.step: result for result in view.tool_results}
    for message in view.messages:
        result = results.get(message.step)
        outcome = result.text if result else "(no result recorded)"
        lines.append(f"{message.step}. {message.tool} {_compact(message.arguments)} -> {outcome}")
    return "\n".join(lines) if lines else NOTHING_YET


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), ensure_ascii=False)
