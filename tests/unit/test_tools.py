from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from ratchet.tools import Agent, ToolContext, ToolResult, ask_person, tool


class CopyBatch(BaseModel):
    batch: int = Field(ge=1, description="Which batch.")


@tool(side_effect=True)
def copy_batch(args: CopyBatch, ctx: ToolContext) -> str:
    """Copy one batch."""
    return f"copied {args.batch} under {ctx.idempotency_key}"


def test_the_decorator_reads_name_description_and_argument_model():
    spec = copy_batch.spec()

    assert (spec.name, spec.description, copy_batch.side_effect) == (
        "copy_batch",
        "Copy one batch.",
        True,
    )
    assert spec.input_schema["properties"]["batch"]["minimum"] == 1
    assert spec.input_schema["required"] == ["batch"]


def test_calling_a_tool_passes_the_context_and_wraps_text_results():
    ctx = ToolContext(run_id="r", step=3, idempotency_key="r/step-3", attempt=1, resources=None)

    result = copy_batch(copy_batch.parse({"batch": 2}), ctx)

    assert result == ToolResult(output="copied 2 under r/step-3")


def test_ask_person_parks_the_run():
    result = ask_person("Drop the table?", table="legacy")

    assert result.wait_for is not None
    assert result.wait_for.prompt == "Drop the table?"
    assert result.wait_for.details == {"table": "legacy"}


def test_a_tool_needs_a_model_and_a_docstring():
    with pytest.raises(TypeError, match="must be a pydantic model"):

        @tool()  # type: ignore[type-var]
        def untyped(args: int, ctx: ToolContext) -> str:
            """Doc."""
            return ""

    with pytest.raises(TypeError, match="needs a docstring"):

        @tool()
        def undocumented(args: CopyBatch, ctx: ToolContext) -> str:
            return ""


def test_an_agent_refuses_duplicate_tool_names():
    with pytest.raises(ValueError, match="duplicate tool names"):
        Agent(name="a", tools=[copy_batch, copy_batch])


def test_an_agent_goal_is_formatted_with_its_params():
    agent = Agent(
        name="a", tools=[copy_batch], goal="copy {batches}", default_params={"batches": 3}
    )

    assert agent.goal_for({}) == "copy 3"
    assert agent.goal_for({"batches": 9}) == "copy 9"
