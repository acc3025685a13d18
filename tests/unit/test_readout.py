"""The pure parts of the read commands: `ratchet.cli.readout` (what they say) and the forms
`ratchet.cli.quick` answers, with the constants it keeps beside the modules that own them."""

from __future__ import annotations

import json

import pytest

from ratchet import pricing, summary
from ratchet.adapters.sqlite.database import RATCHET_APPLICATION_ID
from ratchet.cli import options, quick, readout, store_file
from ratchet.state import FINISHED, MAX_MEMORY_WINDOW, SCHEMA_VERSION, RunStatus, Usage
from ratchet.stored import window_reads


def test_the_quick_path_constants_are_those_of_the_modules_that_own_them():
    assert quick.SCHEMA_VERSION == SCHEMA_VERSION
    assert store_file.APPLICATION_ID == RATCHET_APPLICATION_ID
    assert {s.value for s in RunStatus} == quick.STATUSES
    assert {s.value for s in FINISHED} == readout.FINISHED
    assert quick.MAX_ROWS == options.MAX_ROWS
    assert quick.MAX_MEMORY_WINDOW == MAX_MEMORY_WINDOW
    assert window_reads(MAX_MEMORY_WINDOW) == 4 * (quick.MAX_MEMORY_WINDOW + 1)


def test_usage_totals_fill_absent_counts_and_share_the_cache_as_the_model_does():
    usage = Usage(input_tokens=100, cache_read_tokens=900, cache_write_tokens=900, calls=2)

    totals = summary.usage_totals({"input_tokens": 100, "cache_read_tokens": 900, "calls": 2})

    assert summary.usage_totals(usage.model_dump())["cached_share"] == round(usage.cached_share, 4)
    assert totals == {
        "input_tokens": 100,
        "output_tokens": 0,
        "cache_read_tokens": 900,
        "cache_write_tokens": 0,
        "calls": 2,
        "cached_share": 0.9,
    }
    assert summary.usage_totals(None)["cached_share"] == 0.0


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["status", "r1"], ("status", "sqlite:///d.db", "r1", False, 0, None)),
        (["status", "--json", "r1"], ("status", "sqlite:///d.db", "r1", True, 0, None)),
        (["history", "r1", "--json"], ("history", "sqlite:///d.db", "r1", True, 0, None)),
        (["history", "r1", "--after", "7"], ("history", "sqlite:///d.db", "r1", False, 7, None)),
        (
            ["history", "--last=3", "r1", "--after=2"],
            ("history", "sqlite:///d.db", "r1", False, 2, 3),
        ),
        (["--store", "sqlite:///x.db", "list"], ("list", "sqlite:///x.db", None, False, 0, None)),
        (
            ["--store=sqlite:///x.db", "list", "--json"],
            ("list", "sqlite:///x.db", None, True, 0, None),
        ),
        (["list", "--status", "done"], ("list", "sqlite:///d.db", "done", False, 0, None)),
        (
            ["list", "--status=failed", "--json"],
            ("list", "sqlite:///d.db", "failed", True, 0, None),
        ),
        (["list", "--limit", "5"], ("list", "sqlite:///d.db", None, False, 0, 5)),
        (["list", "--limit", "0"], None),
        (["list", "--last", "5"], None),
        (["history", "r1", "--limit", "5"], None),
        (["status"], None),
        (["status", "r1", "r2"], None),
        (["status", "--verbose", "r1"], None),
        (["status", "r1", "--after", "2"], None),
        (["history", "r1", "--after"], None),
        (["history", "r1", "--after", "-1"], None),
        (["history", "r1", "--after", "x"], None),
        (["history", "r1", "--last", "0"], None),
        (["history", "r1", "--last", "2", "--last", "3"], None),
        (["list", "--status"], None),
        (["list", "--status", "finished"], None),
        (["list", "r1"], None),
        (["show", "r1"], None),
        (["status", "r1", "--store", "sqlite:///x.db"], None),
        (["--help"], None),
        ([], None),
    ],
)
def test_the_quick_path_takes_only_the_read_forms_it_knows(args, command):
    read = quick._read_command(args, "sqlite:///d.db")

    shape = None
    if read is not None:
        shape = (read.name, read.store, read.operand, read.as_json, read.after, read.last)
    assert shape == command


def test_a_table_aligns_its_columns_and_trims_trailing_space():
    said = readout.table(("run", "status"), [["r1", "done"], ["a-longer-run", ""]])

    assert said.splitlines() == [
        "run           status",
        "------------  ------",
        "r1            done",
        "a-longer-run",
    ]


def _row(version: int, explanation: str, tool: str | None = None) -> dict[str, object]:
    return {
        "version": version,
        "step": version,
        "status": "running",
        "event": "step",
        "worker": "w",
        "bytes": 400,
        "time": "2026-12-01T13:00:00+00:00",
        "usage": None,
        "explanation": explanation,
        "tool": tool,
        "arguments": {"text": "x" * 300} if tool else None,
        "result": "y" * 300 if tool else None,
    }


def test_history_explains_versions_without_a_row_and_fits_a_narrow_terminal():
    rows = [_row(1, "created"), _row(3, "step committed " + "z" * 200, tool="write")]

    wide = readout.history_text(rows, head_version=4)
    narrow = readout.history_text(rows, head_version=4, width=120)

    assert [line.split()[0] for line in wide.splitlines()[2:5]] == ["1", "2", "3"]
    assert "4" in wide.splitlines()[5]
    assert "attempt counted (no record)" in wide.splitlines()[5]
    assert wide.splitlines()[-1].startswith("Versions without a row: attempts counted")
    assert max(len(line) for line in wide.splitlines()[:-1]) > 150
    assert max(len(line) for line in narrow.splitlines()[:-1]) <= 120
    assert "write(text=" in narrow
    assert "…" in narrow


def test_history_leaves_out_an_attempt_counted_then_committed_and_keeps_a_retried_one():
    rows = [
        _row(1, "created"),
        {**_row(3, "step committed", tool="write"), "attempt": 1},
        {**_row(5, "step committed", tool="write"), "attempt": 2},
    ]

    said = readout.history_text(rows, head_version=5)

    assert [line.split()[0] for line in said.splitlines()[2:-1]] == ["1", "3", "4", "5"]
    assert "attempt counted (no record)" in said.splitlines()[4]
    assert said.splitlines()[-1].startswith("Versions without a row: attempts counted")


HOSTILE = "\x1b[2J\x1b]0;pwned\x07\u202e\x9b"


def test_a_history_row_a_tool_filled_with_escapes_shows_them_escaped_and_aligned():
    row = {**_row(2, "step committed", tool="shout"), "result": HOSTILE, "worker": "w\x1b[1m"}

    said = readout.history_text([_row(1, "created"), row], head_version=2)

    assert not any(c in said for c in "\x1b\x07\u202e\x9b")
    assert "-> \\x1b[2J\\x1b]0;pwned\\x07\\u202e\\x9b" in said
    lines = said.splitlines()
    # Escaped before the columns are measured: the time column lines up on every row.
    assert len({line.index("13:00:00") for line in lines[2:]}) == 1


def test_status_shows_stored_text_escaped_and_its_json_stays_the_same_value():
    payload = {"run_id": "r1", "status": "done", "summary": HOSTILE, "usage": None}

    said = readout.status_text(
        {**payload, "usage": summary.usage_totals(None), "cost_usd": None, "attempts": 0}
        | dict.fromkeys(("error", "failed_step", "not_before", "waiting", "input"))
        | {"waiting_details": None, "goal": "g", "agent": "a", "model": "m", "max_steps": 1}
        | {"step": 1, "version": 2, "updated_at": "2026-12-01T13:00:00+00:00"}
    )
    dumped = readout.json_text(payload)

    assert "\\x1b[2J" in said
    assert not any(c in said + dumped for c in "\x1b\x07\u202e\x9b")
    assert json.loads(dumped) == payload


def test_a_damaged_runs_line_in_the_list_shows_its_stored_text_escaped():
    # A damaged row's id is read back as stored (its bytes decoded leniently): it may hold
    # anything, as the table's cells may
    row = {
        "run_id": "b\x1b]0;pwned\x07",
        "status": "damaged",
        "step": 3,
        "version": 4,
        "updated_at": "2026-12-01T10:00:00+00:00",
        "damage": "column 'state' holds text that is not UTF-8",
    }

    text = readout.list_text([row])

    assert "\x1b" not in text
    assert "\x07" not in text
    assert text.endswith(
        "b\\x1b]0;pwned\\x07: damaged, left as it is: column 'state' holds text that is not UTF-8\n"
    )


def _status_of(model: str, calls: int) -> dict[str, object]:
    head = {
        "run_id": "r1",
        "agent": "a",
        "goal": "g",
        "options": {"model": model, "max_steps": 60},
        "usage": {"input_tokens": 1_000, "output_tokens": 100, "calls": calls},
        "updated_at": "2026-12-03T05:00:00+00:00",
    }
    return readout.status_payload(head)


def _line(text: str, name: str) -> str:
    return next(line.lstrip() for line in text.splitlines() if line.lstrip().startswith(name))


def test_status_counts_one_call_as_one_call_and_names_where_its_prices_come_from(monkeypatch):
    monkeypatch.delenv(pricing.PRICES_VARIABLE, raising=False)
    text = readout.status_text(_status_of("claude-sonnet-4-5", calls=1))

    assert _line(text, "usage").endswith(" write over 1 call (0% of input cached)")
    assert _line(text, "cost_usd") == (
        f"cost_usd  0.0045 (estimated, list prices of {pricing.PRICES_AS_OF})"
    )
    assert " over 2 calls " in readout.status_text(_status_of("claude-sonnet-4-5", calls=2))

    monkeypatch.setenv(pricing.PRICES_VARIABLE, json.dumps({"claude-*": {"input": 1, "output": 1}}))
    text = readout.status_text(_status_of("claude-sonnet-4-5", calls=1))
    assert _line(text, "cost_usd") == "cost_usd  0.0011 (estimated, prices from RATCHET_PRICES)"


def test_verify_prints_a_line_per_invariant_and_a_line_per_listed_item():
    payload = {
        "run_id": "r1",
        "ok": False,
        "problems": ["2 rows were copied twice"],
        "duplicates": [{"order_id": "A-1", "copies": 2}, {"order_id": "A-2", "copies": 2}],
        "missing": [],
        "rows": 2000,
        "dropped": True,
    }

    assert readout.verify_text(payload) == (
        "    run_id  r1\n"
        "        ok  no\n"
        "  problems  2 rows were copied twice\n"
        'duplicates  {"order_id": "A-1", "copies": 2}\n'
        '            {"order_id": "A-2", "copies": 2}\n'
        "   missing  none\n"
        "      rows  2,000\n"
        "   dropped  yes\n"
    )
