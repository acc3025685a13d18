"""Text a tool returns, or a store holds, never acts on the terminal (issue 22, item 6).

A tool's output, a goal, a summary are untrusted: each human-facing output of the `ratchet`
command (run, worker, watch, history, status, list, show, replay) shows their control
characters escaped, so none can clear the screen, retitle the window or reorder a line; and
the quick read path says the same bytes as the full CLI.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_terminal_output import Cli

HOSTILE = "\x1b[2J\x1b]0;pwned\x07 \u202eevil\u202c \x9b31m \x7f"
"""Clear the screen, retitle the window, a right-to-left override, a C1 CSI, a DEL."""
ACTING = ("\x1b", "\x07", "\u202e", "\u202c", "\x9b", "\x7f", "\r")
"""What no human-facing output may carry."""

SHOUTER = f"""
from pydantic import BaseModel

from ratchet.tools import Agent, Done, ToolCall, tool

HOSTILE = {HOSTILE!r}


class Nothing(BaseModel):
    pass


@tool()
def shout(args: Nothing, ctx) -> str:
    \"\"\"Shout.\"\"\"
    return "loud " + HOSTILE


def policy(view):
    if len(view.messages) < 2:
        return ToolCall(name="shout", arguments={{}})
    return Done(summary="shouted " + HOSTILE)


agent = Agent(name="shouter", goal="Shout " + HOSTILE, tools=[shout], policy=policy)
"""

FULL_CLI = {"RATCHET_LOG_LEVEL": "INFO"}
"""A setting the quick path does not read: with it set, the full CLI answers."""


def _assert_inert(said: str) -> None:
    for acting in ACTING:
        assert acting not in said, (acting, said)


@pytest.fixture
def shouted(tmp_path) -> Cli:
    cli = Cli(tmp_path)
    (tmp_path / "shouter.py").write_text(SHOUTER, encoding="utf-8")
    return cli


@pytest.mark.slow
def test_no_output_of_a_run_whose_tool_returns_escapes_acts_on_the_terminal(shouted):
    cli = shouted
    ran = cli("run", "--agent", "shouter:agent", "--run-id", "h1")
    cli("start", "--agent", "shouter:agent", "--run-id", "h2")
    worked = cli("worker", "--until-idle")

    outputs = {
        "run": ran.stdout + ran.stderr,
        "worker": worked.stdout,
        "run --json": cli("run", "--agent", "shouter:agent", "--run-id", "h3", "--json").stdout,
        "watch": cli("watch", "h1").stdout,
        "watch --json": cli("watch", "h1", "--json").stdout,
        "history": cli("history", "h1").stdout,
        "history --json": cli("history", "h1", "--json").stdout,
        "status": cli("status", "h1").stdout,
        "status --json": cli("status", "h1", "--json").stdout,
        "list": cli("list").stdout,
        "show": cli("show", "h1").stdout,
        "show --json": cli("show", "h1", "--json").stdout,
        "replay": cli("replay", "h1", "--step", "2").stdout,
    }

    for name, said in outputs.items():
        assert said.strip(), name
        _assert_inert(said)
    # What was escaped still shows, as escapes.
    assert "loud \\x1b[2J\\x1b]0;pwned\\x07 \\u202eevil" in outputs["run"]
    assert "shouted \\x1b[2J" in outputs["status"]
    assert "loud \\x1b[2J" in outputs["history"]
    # The JSON forms still carry the text itself.
    status = json.loads(outputs["status --json"])
    assert status["summary"] == "shouted " + HOSTILE
    assert status["goal"] == "Shout " + HOSTILE


@pytest.mark.slow
def test_the_quick_read_path_escapes_as_the_full_cli_does(shouted):
    cli = shouted
    cli("run", "--agent", "shouter:agent", "--run-id", "h1")

    for args in (("status", "h1"), ("history", "h1"), ("list",)):
        for form in ((), ("--json",)):
            quick = cli(*args, *form).stdout
            cli.env.update(FULL_CLI)
            full = cli(*args, *form).stdout
            for name in FULL_CLI:
                cli.env.pop(name)
            assert quick == full, (args, form)
            _assert_inert(quick)
