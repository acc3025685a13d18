"""The commands that write say their lines without rich (`ratchet.cli.context.say_line`) in the
bytes rich's consoles write for them (`say`), on a terminal or not: escaped as untrusted text,
never read as markup or emoji codes, never wrapped, one line and its newline."""

from __future__ import annotations

import contextlib
import io

import pytest
from rich.console import Console

from ratchet.cli import context

SAID = [
    "run a:smile:b started in store /tmp/x [bold]y[/bold].db",
    "ratchet: --input is not JSON: Expecting value: line 1 column 1 (char 0)",
    "tab\there, newline\nhere, return\rhere, bell\x07, escape \x1b[31mred\x1b[0m",
    "bidi \u202eevil\u202c, C1 \x85, DEL \x7f, zero width \u200b",
    "wide 日本語 and combining e\u0301 and emoji 🎉",
    "trailing spaces   ",
    "   leading spaces",
    "a line far wider than any terminal " * 20,
    "back\\slash \\[not markup]",
    "",
]


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
@pytest.mark.parametrize("stderr", [False, True], ids=["stdout", "stderr"])
@pytest.mark.parametrize("text", SAID)
def test_a_plain_line_is_what_rich_writes(text, stderr, terminal):
    by_rich = io.StringIO()
    console = Console(
        file=by_rich,
        stderr=stderr,
        highlight=False,
        soft_wrap=True,
        emoji=False,
        force_terminal=terminal,
        color_system="truecolor" if terminal else None,
        width=40,
    )
    context.say(text, console=console)

    plain = io.StringIO()
    redirect = contextlib.redirect_stderr if stderr else contextlib.redirect_stdout
    with redirect(plain):
        context.say_line(text, stderr=stderr)

    assert plain.getvalue() == by_rich.getvalue()


def test_the_consoles_are_rich_and_made_once():
    # The full CLI's commands print through `out` and `err`, made at their first use.
    assert context.out is context.out
    assert isinstance(context.err, Console)
    assert context.err.stderr
    assert not context.out.stderr
