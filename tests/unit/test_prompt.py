from __future__ import annotations

from pathlib import Path

import pytest

from ratchet.engine.prompt import render_completed_steps, render_step_prompt, step_prompt_template
from ratchet.ports import StepView
from ratchet.state import Message, ToolDigest, ToolOutput

# The step prompt from PATTERN.md, spelled out here so the test does not trust the file it checks.
EXPECTED_TEMPLATE = (
    "You are carrying out a long task one step at a time. The run may have been\n"
    "paused or restarted; the completed steps below are the source of truth.\n"
    "\n"
    "<goal>{{goal}}</goal>\n"
    "<completed_steps>\n"
    "{{completed_steps}}\n"
    "</completed_steps>\n"
    "<last_result>{{last_tool_result}}</last_result>\n"
    "\n"
    "Decide the single next step and call one tool to do it.\n"
    "Never redo a step listed as completed.\n"
    "If the goal is fully done, reply with DONE and a one-paragraph summary.\n"
)
SHARED = Path(__file__).resolve().parents[3] / "shared" / "step_prompt.md"


def test_the_shipped_template_is_the_step_prompt_byte_for_byte():
    assert step_prompt_template() == EXPECTED_TEMPLATE


@pytest.mark.skipif(not SHARED.exists(), reason="shared/ is not beside this checkout")
def test_the_shipped_template_matches_shared_step_prompt():
    assert step_prompt_template().encode() == SHARED.read_bytes()


def test_rendering_fills_exactly_the_three_placeholders():
    view = StepView(
        run_id="r",
        goal="Copy {{completed_steps}} rows",
        step=3,
        messages=[
            Message(step=1, tool="inspect_table", arguments={"table": "t"}),
            Message(step=2, tool="copy_batch", arguments={"batch": 1}),
        ],
        tool_results=[
            ToolOutput(step=1, tool="inspect_table", text="t has 2,000 rows"),
            ToolOutput(step=2, tool="copy_batch", text="Copied 1,000 rows"),
        ],
        last_result="Copied 1,000 rows",
    )
    completed = (
        '1. inspect_table {"table": "t"} -> t has 2,000 rows\n'
        '2. copy_batch {"batch": 1} -> Copied 1,000 rows'
    )

    rendered = render_step_prompt(view)

    assert rendered == (
        EXPECTED_TEMPLATE.replace("{{goal}}", "Copy {{completed_steps}} rows", 1)
        .replace("{{completed_steps}}\n", completed + "\n", 1)
        .replace("{{last_tool_result}}", "Copied 1,000 rows", 1)
    )
    assert "<goal>Copy {{completed_steps}} rows</goal>" in rendered, "values are not re-expanded"


def test_a_fresh_run_says_nothing_is_done_yet():
    rendered = render_step_prompt(StepView(run_id="r", goal="g", step=1))

    assert "<completed_steps>\n(none yet)\n</completed_steps>" in rendered
    assert "<last_result>(none yet)</last_result>" in rendered


def test_older_steps_are_summarised_per_tool():
    view = StepView(
        run_id="r",
        goal="g",
        step=40,
        digest={
            "copy_batch": ToolDigest(
                calls=33, first_step=2, last_step=34, last_arguments={"batch": 33}
            ),
            "inspect_table": ToolDigest(
                calls=1, first_step=1, last_step=1, last_arguments={"table": "t"}
            ),
        },
    )

    assert render_completed_steps(view) == (
        "Steps 1-34, summarised:\n"
        '- inspect_table: 1 call (step 1), last with {"table": "t"}\n'
        '- copy_batch: 33 calls (steps 2-34), last with {"batch": 33}'
    )
