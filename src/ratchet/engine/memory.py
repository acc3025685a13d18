"""A long run's memory: the facts an agent pins, and the summary of the steps it no longer sees.

The model sees the last `memory_window` steps in full. What it must never lose it pins with the
`remember` tool, which the runtime offers every agent (`Agent.remember`): a pinned fact is in
every later prompt. Older steps are folded either into a per-tool digest (the default: counts,
deterministic, a few bytes) or, with `Agent.model_summary`, into a summary the model writes
itself: every `memory_window` steps, the oldest `memory_window` are folded into it in one extra
model call, recorded in the step record of the step that pushed them out. A replay, a retried
step and every later prompt read that same text back; nothing is summarised twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ratchet.engine.timers import SLEEP_TOOL, offers_sleep
from ratchet.ports import ToolSpec
from ratchet.state import MAX_FACT_CHARS, MAX_PINNED_FACTS, RunState, Usage
from ratchet.tools import Agent

REMEMBER = "remember"


class RememberArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fact: str = Field(min_length=1, max_length=MAX_FACT_CHARS)


REMEMBER_SPEC = ToolSpec(
    name=REMEMBER,
    description=(
        "Pin a fact you must not lose for the rest of the task (an ID, a finding, a decision "
        f"a person made). Pinned facts appear in every later step. At most {MAX_PINNED_FACTS} "
        f"facts of {MAX_FACT_CHARS} characters each; it changes nothing outside the run."
    ),
    input_schema=RememberArgs.model_json_schema(),
)


def offers_remember(agent: Agent) -> bool:
    """Whether the runtime's `remember` tool is the agent's (an agent's own tool of that name
    wins, and an agent may turn it off)."""
    return agent.remember and agent.tool_named(REMEMBER) is None


def tool_specs(agent: Agent) -> list[ToolSpec]:
    """The tools the model is offered: the agent's, then the runtime's that it keeps."""
    specs = [t.spec() for t in agent.tools]
    if offers_remember(agent):
        specs.append(REMEMBER_SPEC)
    if offers_sleep(agent):
        specs.append(SLEEP_TOOL.spec())
    return specs


def remember(state: RunState, arguments: dict[str, Any]) -> str:
    """The `remember` tool's result. It starts with "Remembered" only when the fact is pinned
    (the fold pins the facts of such results: `fold.pinned_fact`)."""
    fact = " ".join(RememberArgs.model_validate(arguments).fact.split())
    if fact in state.pinned:
        return f"Already remembered: {fact}"
    if len(state.pinned) >= MAX_PINNED_FACTS:
        return (
            f"Not remembered: {MAX_PINNED_FACTS} facts are pinned already, the most a run keeps. "
            f"The fact stays in this step's record: {fact}"
        )
    return f"Remembered: {fact}"


@dataclass(frozen=True)
class Folded:
    """The model's new running summary, covering the steps up to `through`."""

    summary: str
    through: int
    usage: Usage | None


def summarise_through(state: RunState) -> int | None:
    """With `model_summary`: the last step to fold into the summary when the step being taken
    commits (its window would reach twice `memory_window`), or None."""
    options = state.options
    if not options.model_summary:
        return None
    size = options.memory_window
    if state.next_step - state.memory_through < 2 * size:
        return None
    return state.next_step - size


SUMMARY_PROMPT = """You keep the running summary of a long task that is carried out one step at a
time. Fold the steps below into the summary so far, keeping everything a later step needs:
facts found, decisions made (and by whom), what is done and what is left. Drop what no later
step needs.

<goal>{goal}</goal>
<summary_so_far>{summary}</summary_so_far>
<steps_to_fold>
{steps}
</steps_to_fold>

Reply with DONE and the new summary, at most {limit} characters.
"""
