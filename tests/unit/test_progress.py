"""The pure parts of progress output (`ratchet.cli.progress`), the bar a terminal is shown, and
the option bounds the CLI keeps beside the modules that own them."""

from __future__ import annotations

import io
import json
import re

import pytest

from ratchet.cli import options
from ratchet.cli.progress import (
    ProgressPrinter,
    StepLine,
    json_object,
    line_of_state,
    plain_line,
    position,
)
from ratchet.ports import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from ratchet.runs import MAX_BATCHES, MAX_STEPS, MAX_TOOL_LATENCY_MS
from ratchet.state import Message, RunOptions, RunState, RunStatus, ToolOutput
from ratchet.summary import argument_summary, shorten, version_gaps


def test_the_cli_bounds_are_those_of_the_modules_that_own_them():
    assert (options.MIN_LEASE_SECONDS, options.MAX_LEASE_SECONDS) == (
        MIN_LEASE_SECONDS,
        MAX_LEASE_SECONDS,
    )
    assert (options.MAX_STEPS, options.MAX_TOOL_LATENCY_MS, options.MAX_BATCHES) == (
        MAX_STEPS,
        MAX_TOOL_LATENCY_MS,
        MAX_BATCHES,
    )


def test_arguments_are_summarised_as_compact_json_pairs_and_cut():
    assert argument_summary({"batch": 2, "table": "orders"}) == 'batch=2, table="orders"'
    assert argument_summary({}) == ""
    long = argument_summary({"text": "x" * 200}, limit=20)
    assert len(long) == 20
    assert long.endswith("…")
    assert shorten("a\n  b\tc", 10) == "a b c"


@pytest.mark.parametrize(
    ("params", "step", "arguments", "before", "expected"),
    [
        ({}, 3, {"batch": 2}, 0, None),
        ({"steps": 10}, 3, None, 0, (3, 10)),
        ({"steps": 2}, 5, None, 0, (2, 2)),
        ({"batches": 40}, 3, {"batch": 2}, 0, (2, 40)),
        ({"batches": 40}, 9, {"table": "orders"}, 7, (7, 40)),
        ({"batches": 40}, 9, {"batch": True}, 7, (7, 40)),
        ({"batches": "40"}, 3, {"batch": 2}, 0, None),
    ],
)
def test_the_position_is_known_only_from_steps_or_batches(
    params, step, arguments, before, expected
):
    assert position(params, step, arguments, before) == expected


def test_a_committed_step_becomes_a_line_with_its_tool_arguments_and_result():
    state = RunState(
        run_id="r1",
        agent="migration",
        goal="copy",
        options=RunOptions(params={"batches": 4}),
        step=3,
        messages=[
            Message(step=2, tool="copy_batch", arguments={"batch": 1}),
            Message(step=3, tool="copy_batch", arguments={"batch": 2}),
        ],
        tool_results=[ToolOutput(step=3, tool="copy_batch", text="Copied\n1,000 rows.")],
    )

    line = line_of_state(state, ms=12.34)

    assert line == StepLine(
        run_id="r1",
        step=3,
        status="running",
        tool="copy_batch",
        arguments="batch=2",
        result="Copied 1,000 rows.",
        ms=12.34,
        done=2,
        total=4,
    )
    assert plain_line(line) == "r1  step 3  copy_batch(batch=2) -> Copied 1,000 rows.  12 ms  [2/4]"
    assert json.loads(json.dumps(json_object(line)))["ms"] == 12.3


def test_a_failed_run_ends_at_the_step_that_failed_with_its_error():
    # Step 1 is the last committed: step 2 failed, as `ratchet status` says.
    state = RunState(
        run_id="r1", agent="a", goal="g", status=RunStatus.FAILED, step=1, error="boom"
    )
    line = line_of_state(state, ms=None)
    assert (line.step, line.tool, line.result, line.done) == (2, None, "boom", None)
    assert plain_line(line) == "r1  step 2  failed -> boom"


def test_a_run_that_ends_after_its_last_step_says_how_not_a_step_again():
    state = RunState(
        run_id="r1",
        agent="a",
        goal="g",
        status=RunStatus.DONE,
        step=2,
        summary="refunded 500 cents",
        messages=[Message(step=2, tool="refund", arguments={"cents": 500})],
        tool_results=[ToolOutput(step=2, tool="refund", text="refunded 500 cents")],
    )
    line = line_of_state(state, ms=3.0)
    assert plain_line(line) == "r1  done -> refunded 500 cents  3 ms"
    assert json_object(line)["step"] == 2, "--json keeps the last step, as status does"


def test_versions_no_record_holds_are_given_as_ranges():
    assert version_gaps([1, 2, 4, 5, 8], head_version=9) == [(3, 3), (6, 7), (9, 9)]
    assert version_gaps([1, 2, 3], head_version=3) == []
    assert version_gaps([], head_version=2) == [(1, 2)]


def test_a_step_line_shows_a_tools_escapes_escaped():
    line = StepLine(
        run_id="r1",
        step=1,
        status="running",
        tool="shout",
        arguments="",
        result="\x1b]0;x\x07",
        ms=None,
    )

    assert plain_line(line) == "r1  step 1  shout() -> \\x1b]0;x\\x07"


class Terminal(io.StringIO):
    """What rich draws on a terminal, kept: a stream that says it is one."""

    def isatty(self) -> bool:
        return True


def test_the_bar_drawn_with_a_steps_line_counts_that_step():
    # Given a live display on a terminal, and a run of 3 batches
    terminal = Terminal()
    lines = [
        StepLine("r1", n, "running", "copy_batch", f"batch={n}", "ok", 1.0, n, 3) for n in (1, 2, 3)
    ]

    # When each step's line is shown
    with ProgressPrinter(stream=terminal) as printer:
        for line in lines:
            printer.show(line)

    # Then the bar drawn with each line (printing redraws it) counts the step just committed,
    # not the one before
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue())
    counts = []
    for line in lines:
        after = drawn[drawn.index(plain_line(line)) + len(plain_line(line)) :]
        bar = re.search(r"r1 [━╺╸ ]+ (\d+)/3", after)
        assert bar is not None, after
        counts.append(int(bar[1]))
    assert counts == [1, 2, 3]
