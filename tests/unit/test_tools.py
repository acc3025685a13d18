from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from pydantic import BaseModel, Field

from ratchet.tools import Agent, Tool, ToolContext, ToolResult, ask_person, tool


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


@tool(side_effect=True)
async def copy_batch_async(args: CopyBatch, ctx: ToolContext) -> str:
    """Copy one batch, awaiting the database."""
    await asyncio.sleep(0)
    return f"copied {args.batch} under {ctx.idempotency_key}"


CTX = ToolContext(run_id="r", step=3, idempotency_key="r/step-3", attempt=1, resources=None)


def test_the_decorator_takes_an_async_def_and_says_it_is_async():
    assert copy_batch_async.is_async
    assert not copy_batch.is_async
    assert copy_batch_async.spec().description == "Copy one batch, awaiting the database."

    result = asyncio.run(copy_batch_async.call_async(copy_batch_async.parse({"batch": 2}), CTX))

    assert result == ToolResult(output="copied 2 under r/step-3")


def test_an_async_tool_called_as_a_sync_one_says_how_to_call_it():
    with pytest.raises(TypeError, match=r"is async def: await tool.call_async\(args, ctx\)"):
        copy_batch_async(CopyBatch(batch=1), CTX)


def test_an_object_with_an_async_call_is_an_async_handler():
    class Copier:
        async def __call__(self, args: CopyBatch, ctx: ToolContext) -> str:
            return "copied"

    copier = Tool("copy", "Copy.", CopyBatch, Copier())

    assert copier.is_async
    assert asyncio.run(copier.call_async(CopyBatch(batch=1), CTX)).output == "copied"


def test_a_sync_tool_that_returns_a_coroutine_is_refused_with_the_reason():
    async def fetch() -> str:
        return "late"

    @tool()
    def forgot_await(args: CopyBatch, ctx: ToolContext) -> Any:
        """Forget to await."""
        return fetch()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the coroutine is closed: no "never awaited" warning
        with pytest.raises(TypeError, match="returned coroutine, an awaitable, not its result"):
            forgot_await(CopyBatch(batch=1), CTX)
        with pytest.raises(TypeError, match="a missing `await`"):
            asyncio.run(forgot_await.call_async(CopyBatch(batch=1), CTX))
