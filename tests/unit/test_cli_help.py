"""Each command's help (`ratchet.cli.usage`): its arguments named as they are typed, never
typer's `{RUN}` or `RUN <str>`, and an example that parses as its command takes it."""

from __future__ import annotations

import shlex

import pytest
import typer
from typer.testing import CliRunner

from ratchet.cli.app import COMMANDS, app
from ratchet.cli.usage import EXAMPLES

GROUP = typer.main.get_command(app)
SCHEDULE = GROUP.commands["schedule"]  # type: ignore[attr-defined]
BUDGET = GROUP.commands["budget"]  # type: ignore[attr-defined]
PATHS = [
    *COMMANDS,
    "schedule",
    *(f"schedule {name}" for name in SCHEDULE.commands),
    "budget",
    *(f"budget {name}" for name in BUDGET.commands),
]


def _help(path: str) -> str:
    done = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "100"})
    assert done.exit_code == 0, done.output
    return done.output


def test_every_command_has_one_example_and_only_those_have_one():
    assert set(EXAMPLES) == set(PATHS)


@pytest.mark.parametrize("path", PATHS)
def test_a_commands_help_ends_with_its_example(path):
    shown = _help(path)

    assert shown.rstrip().endswith(f"Example:\n\n    {EXAMPLES[path]}")


@pytest.mark.parametrize("path", PATHS)
def test_a_commands_example_parses_as_that_command(path):
    words = shlex.split(EXAMPLES[path])
    assert words[:1] == ["ratchet"]
    assert words[1 : 1 + len(path.split())] == path.split()
    command, words = GROUP, words[1:]
    while hasattr(command, "commands"):  # a group: on to the command the example names
        command, words = command.commands[words[0]], words[1:]

    with command.make_context(path, words, resilient_parsing=False) as context:
        assert not context.args, "every word of the example is taken"


@pytest.mark.parametrize(
    ("path", "usage", "argument"),
    [
        ("status", "Usage: ratchet status [OPTIONS] RUN\n", "  RUN  The run id.  [required]\n"),
        ("send", "Usage: ratchet send [OPTIONS] RUN NAME\n", "  NAME  The event's name"),
        ("schedule pause", "Usage: ratchet schedule pause [OPTIONS] NAME\n", "  NAME  The"),
    ],
)
def test_arguments_read_as_they_are_typed(path, usage, argument):
    shown = _help(path)

    assert shown.startswith(usage)
    assert argument in shown
    assert "{" not in shown.splitlines()[0]
    assert "<str>" not in shown.split("Options:")[0]


def test_the_store_is_a_url_and_the_top_level_help_says_so():
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"}).output

    assert "  --store URL " in shown
    assert "  --log-json " in shown


@pytest.mark.parametrize("path", [p for p in PATHS if p not in ("serve", "demo")])
def test_every_value_an_option_takes_is_named_not_typed(path):
    shown = _help(path)

    assert "<str>" not in shown
    assert " range>" not in shown
