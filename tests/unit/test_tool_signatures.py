"""A tool is called as `fn(args, ctx)` (issue 36): a function that cannot take that call is
refused where it is declared, not after three strikes of the run that calls it."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from ratchet.tools import ToolContext, tool


class Note(BaseModel):
    text: str


def test_a_tool_without_its_ctx_parameter_is_refused_when_declared():
    def note(args: Note) -> str:
        """Write a note."""
        return args.text

    with pytest.raises(TypeError, match=r"^note: a tool takes two parameters, \(args"):
        tool()(note)  # type: ignore[arg-type]  # as mypy says; caught without it too


def test_a_tool_with_a_third_parameter_it_is_never_given_is_refused():
    def note(args: Note, ctx: ToolContext, extra: str) -> str:
        """Write a note."""
        return args.text

    with pytest.raises(TypeError, match="add ctx even if"):
        tool()(note)  # type: ignore[arg-type]  # as mypy says; caught without it too


def test_a_tool_that_takes_the_call_is_made():
    def note(args: Note, ctx: ToolContext, extra: str = "") -> str:
        """Write a note."""
        return args.text

    assert tool()(note).name == "note"
