"""`ratchet start`, `run`, `approve` and `reject` answered by the entry point before the full CLI
loads (`ratchet.cli.quick_writes`) do what the full CLI does: the same lines on stdout and
stderr, the same exit code and the same store after, for runs made, worked, refused and decided.
What the quick path is unsure of goes to the full CLI, which answers or refuses as it always
has."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

import ratchet
from ratchet.cli import app as cli
from ratchet.cli import foreground, options, quick_writes, writes
from ratchet.state import MAX_PRIORITY

WAITING = "waiting"
"""A run parked for a person's approval."""
RUNNING = "running"
"""A run started and not worked: nobody has asked anything."""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store's folder with a run waiting for a person and one started."""
    root = tmp_path_factory.mktemp("quick-writes-base")
    with _environment(f"sqlite:///{root / 'ratchet.db'}"):
        client = ratchet.connect(os.environ["RATCHET_STORE"], environ={})
        with client:
            client.run(run_id=WAITING, scenario="migration", input={"batches": 2})
            client.start(run_id=RUNNING, scenario="migration", input={"batches": 2})
    return root


@contextlib.contextmanager
def _environment(url: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith(("RATCHET_", "ANTHROPIC_"))]:
            patch.delenv(name)
        patch.setenv("RATCHET_STORE", url)
        yield


def _said(main: Callable[[], Any]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr (without the JSON log lines, which carry times and the
    process id) of one command run in this process, times and random run ids blanked."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 0
    lines = [line for line in err.getvalue().splitlines(True) if not line.startswith('{"level"')]
    return code, _blank(out.getvalue()), _blank("".join(lines))


_TIMES = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(\+00:00|Z)?|\b1\d{9}(\.\d+)?\b"
)  # to the minute in what a person reads (`approved by dana at 2026-12-01 10:42 UTC`)
_WORKERS = re.compile(r"[\w.-]+:\d+(?=['\"])")  # host:pid, the CLI's worker id
_RUN_IDS = re.compile(r"\brun-[0-9a-f]{12}\b")  # the id of a run started without one
_STEP_TIMES = re.compile(r"  \d+ ms\b")  # what a step took, in `run`'s line of it
_LINKS = re.compile(r"/approvals/\S+")  # a new approval request's id, expiry and signature
_DURATIONS = re.compile(r'"duration_ms":[\d.]+')  # what a step took, in its record
_SIZES = re.compile(r"(?<='W', )\d+(?=, 'T')")  # a checkpoint's bytes, its duration's digits


def _blank(text: str) -> str:
    text = _STEP_TIMES.sub("  N ms", _LINKS.sub("/approvals/LINK", text))
    text = _RUN_IDS.sub("run-ID", _WORKERS.sub("W", _TIMES.sub("T", text)))
    return _SIZES.sub("N", _DURATIONS.sub('"duration_ms":N', text))


def _store(folder: Path, *, unlike: tuple[str, ...] = ()) -> list[str]:
    """Every row of every table of the store but those `unlike`, times and worker ids
    blanked."""
    database = sqlite3.connect(folder / "ratchet.db")
    try:
        tables = [
            t for (t,) in database.execute("SELECT name FROM sqlite_master WHERE type='table'")
        ]
        rows = []
        for table in sorted(set(tables) - set(unlike)):
            for row in database.execute(f"SELECT * FROM {table}"):
                rows.append(_blank(f"{table} {row!r}"))
        return sorted(rows)
    finally:
        database.close()


def _on_both_paths(
    base: Path, work: Path, commands: list[list[str]], *, unlike: tuple[str, ...] = ()
) -> list[tuple[list[tuple[int, str, str]], list[str]]]:
    """What each path says for `commands` run one after the other, and its store after (but
    its tables `unlike`); each path starts from a copy of `base` at the same place (the lines
    name the store's file)."""
    results = []
    for path in ("quick", "full"):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        said = []
        with _environment(f"sqlite:///{work / 'ratchet.db'}"):
            for typed in commands:
                args = [arg.replace(STORE, str(work / "ratchet.db")) for arg in typed]
                if path == "quick":
                    assert quick_writes.write_command(args, os.environ) is not None, args
                    said.append(_said(functools.partial(quick_writes.main, args, os.environ)))
                else:
                    said.append(_said(functools.partial(cli.main, args)))
        results.append((said, _store(work, unlike=unlike)))
    return results


MIGRATION = ["--scenario", "migration", "--param", "batches=2"]
STORE = "<the store's file>"
"""Where a case types `--store`: the path of the store the case runs on."""

SAME = {
    "start": [["start", *MIGRATION, "--run-id", "new"]],
    "start, no id": [["start", "--scenario=migration", "--batches=3"]],
    "start, every option": [
        [
            "start",
            "--scenario",
            "migration",
            "--run-id=every",
            "--input",
            '{"batches": 1}',
            "--param",
            "batches=2",
            "--max-steps",
            "9",
            "--tool-latency-ms",
            "0",
            "--notify",
            "dana@example.com",
            "--notify=sam@example.com",
            "--notify-slack",
            "#ops",
            "--approval-timeout",
            "3600",
            "--model",
            "scripted",
            "--goal",
            "move the rows",
            "--key",
            "acme",
            "--priority",
            "7",
        ]
    ],
    "start, a key and a priority": [["start", *MIGRATION, "--key=acme", "--priority=9"]],
    "start, a key not printable": [["start", *MIGRATION, "--key", "acme corp"]],
    "start, the same id under another key": [
        ["start", *MIGRATION, "--run-id", "k", "--key", "acme"],
        ["start", *MIGRATION, "--run-id", "k", "--key", "globex"],
    ],
    "start, budget": [["start", *MIGRATION, "--run-id", "b", "--budget", "0.05"]],
    "start, budget absurd": [["start", *MIGRATION, "--run-id", "b", "--budget=10000.5"]],
    "start, budget not a number": [["start", *MIGRATION, "--budget", "five"]],
    "start, own agent": [["start", "--agent", "tests.breaker_agent:agent", "--run-id", "own"]],
    "start, log lines typed after": [["start", *MIGRATION, "--run-id", "s", "--log-json"]],
    "start, store typed after": [["start", *MIGRATION, "--store", STORE, "--run-id", "s"]],
    "start, store typed before": [[f"--store={STORE}", "--log-json", "start", *MIGRATION]],
    "approve, store typed after": [["approve", WAITING, "--store", STORE]],
    "start twice": [["start", *MIGRATION, "--run-id", "t"]] * 2,
    "start, taken id": [
        ["start", "--scenario", "migration", "--batches", "4", "--run-id", RUNNING]
    ],
    "start, unknown scenario": [["start", "--scenario", "nope"]],
    "start, unknown agent": [["start", "--agent", "tests.no_such_module:agent"]],
    "start, bad input": [["start", "--scenario", "migration", "--input", "[1, 2]"]],
    "start, input not JSON": [["start", "--scenario", "migration", "--input", "{batches"]],
    "start, bad param": [["start", "--scenario", "migration", "--param", "batches"]],
    "start, input field refused": [["start", "--scenario", "migration", "--param", "batches=x"]],
    "start, bad run id": [["start", *MIGRATION, "--run-id", "no spaces"]],
    "start, paid model without key": [["start", *MIGRATION, "--model", "claude-sonnet-4-6"]],
    "start, AWS store": [
        ["--store", "dynamodb://t?ledger=l&app=a&region=eu-west-1", "start", *MIGRATION]
    ],
    "start, no folder": [["--store", "/nonexistent/dir/x.db", "start", *MIGRATION]],
    "approve": [["approve", WAITING]],
    "approve, comment and who": [["approve", WAITING, "--comment", "ok [bold]", "--by", "x"]],
    "approve, reason spelling": [["approve", WAITING, "--reason=fine", "--by=dana"]],
    "approve, answer": [["approve", WAITING, "--answer", '{"amount": 1}']],
    "approve twice": [["approve", WAITING, "--by", "dana"], ["approve", WAITING, "--by", "sam"]],
    "approve, not waiting": [["approve", RUNNING]],
    "approve, no such run": [["approve", "missing"]],
    "approve, bad run id": [["approve", "no/slash"]],
    "reject": [["reject", WAITING, "--reason", "not today"]],
    "reject, comment spelling and who": [["reject", WAITING, "--comment", "no", "--by", "sam"]],
    "reject after approve": [["approve", WAITING], ["reject", WAITING]],
    "run": [["run", "--scenario", "notebook", "--run-id", "nb"]],
    "run, every option": [
        [
            "run",
            "--scenario=notebook",
            "--run-id",
            "nb",
            "--max-steps",
            "3",
            "--notify",
            "dana@example.com",
            "--approval-timeout=60",
            "--goal",
            "file a note",
        ]
    ],
    "run after approve": [["approve", WAITING], ["run", "--run-id", WAITING]],
    "run twice": [["run", "--scenario", "notebook", "--run-id", "nb"]] * 2,
    "run, no such run": [["run", "--run-id", "missing"]],
    "run, unknown scenario": [["run", "--scenario", "nope"]],
    "run, failing agent": [["run", "--agent", "tests.breaker_agent:agent", "--run-id", "own"]],
    "run, store typed before": [[f"--store={STORE}", "run", "--scenario=notebook"]],
}


@pytest.mark.parametrize("commands", SAME.values(), ids=SAME.keys())
def test_a_write_says_and_stores_the_same_on_both_paths(base, tmp_path, commands):
    (quick_said, quick_store), (full_said, full_store) = _on_both_paths(
        base, tmp_path / "store", commands
    )

    assert quick_said == full_said
    assert quick_store == full_store


def test_ctrl_c_in_a_write_ends_alike_on_both_paths(base, tmp_path, monkeypatch):
    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    # Ctrl-C as the run is about to be written: on both paths the same functions run.
    monkeypatch.setattr(writes, "say_if_paid", interrupted)

    (quick_said, quick_store), (full_said, full_store) = _on_both_paths(
        base, tmp_path / "store", SAME["start"]
    )

    assert quick_said == full_said == [(130, "", "")]
    assert quick_store == full_store


def test_a_run_that_parks_for_a_person_says_and_stores_the_same_on_both_paths(base, tmp_path):
    # Each path opens an approval request of its own, under an id and a key drawn at random:
    # its link is blanked, and its row left out.
    (quick_said, quick_store), (full_said, full_store) = _on_both_paths(
        base, tmp_path / "store", [["run", *MIGRATION, "--run-id", "r"]], unlike=("approvals",)
    )

    assert quick_said == full_said
    assert quick_store == full_store
    code, stdout, _ = quick_said[0]
    assert code == 0
    assert "r: waiting at step 4\nWaiting for a person: Drop legacy_orders" in stdout, stdout


def test_ctrl_c_in_a_run_ends_alike_on_both_paths(base, tmp_path, monkeypatch):
    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    # Ctrl-C as the run's first step is about to be worked: it says where the run stands.
    monkeypatch.setattr(foreground, "work_showing_progress", interrupted)

    (quick_said, quick_store), (full_said, full_store) = _on_both_paths(
        base, tmp_path / "store", SAME["run"]
    )

    assert quick_said == full_said
    assert quick_store == full_store
    code, _, stderr = quick_said[0]
    assert code == 130
    assert stderr.startswith("interrupted: nb is running at step 0"), stderr


def test_a_run_id_is_printed_as_typed_not_as_an_emoji(base, tmp_path):
    # A run id may hold `:`; rich would print `a:smile:b` as an emoji, which `status` does not.
    (quick_said, _), (full_said, _) = _on_both_paths(
        base, tmp_path / "store", [["start", *MIGRATION, "--run-id", "a:smile:b"]]
    )

    assert quick_said == full_said
    code, stdout, stderr = quick_said[0]
    assert (code, stdout) == (0, "a:smile:b\n")
    assert stderr.startswith("run a:smile:b started in store "), stderr


def test_the_cases_are_not_blind(base, tmp_path):
    # Among the cases above some write and some are refused, on both paths.
    cases = {
        "start": 0,
        "start, unknown scenario": 2,
        "approve twice": 2,
        "run": 0,
        "run, failing agent": 1,
    }
    for case, code in cases.items():
        (said, _), _ = _on_both_paths(base, tmp_path / case, SAME[case])
        assert said[-1][0] == code, (case, said)


@pytest.mark.parametrize("name", sorted(quick_writes.COMMANDS))
def test_the_quick_path_knows_only_options_of_the_full_clis_command(name):
    command = typer.main.get_command(cli.app).commands[name]  # type: ignore[attr-defined]
    flags = {flag for param in command.params for flag in param.opts}

    assert set(quick_writes.COMMANDS[name]) <= flags
    if name == "start":  # every option of start: the quick path is sure of each
        assert set(quick_writes.COMMANDS[name]) == flags - {"--help"}


@pytest.mark.parametrize(
    "args",
    [
        ["start", "--help"],
        ["--help"],
        ["--version"],
        ["start", *MIGRATION, "--max-steps", "0"],  # out of range: the full CLI says the range
        ["start", *MIGRATION, "--max-steps", "07"],
        ["start", *MIGRATION, "--max-steps", "+7"],
        ["start", *MIGRATION, "--batches", "x"],
        ["start", *MIGRATION, "--batches", str(options.MAX_BATCHES + 1)],
        ["start", *MIGRATION, "--priority", str(options.MAX_PRIORITY + 1)],
        ["start", *MIGRATION, "--key", ""],
        ["start", "--scenario", ""],
        ["start", "--scenario", "  "],
        ["start", "--scenario", "migration", "--scenario", "notebook"],
        ["start", "--goal", "-x"],
        ["start", "extra"],
        ["start", "--unknown", "1"],
        ["start", "--scenario"],
        ["start", "--json"],
        ["--json", "start"],
        ["start", "--", "x"],
        ["start", "--scenario", "migration\udcff"],
        ["--store", "", "start"],
        ["--store=a.db", "--store=b.db", "start"],
        ["--version", "start"],
        ["approve"],
        ["approve", "a", "b"],
        ["approve", "a", "--comment", ""],
        ["approve", "a", "--by", ""],
        ["approve", "a", "--comment", "x", "--reason", "y"],
        ["reject", "a", "--answer", "{}"],
        ["run", *MIGRATION, "--json"],
        ["run", "--json", "--run-id", "r"],
        ["run", "r"],
        ["status", "a"],
    ],
)
def test_what_the_quick_path_is_unsure_of_goes_to_the_full_cli(args):
    assert quick_writes.write_command(args, {}) is None


def test_a_blank_store_setting_goes_to_the_full_cli():
    assert quick_writes.write_command(["start"], {"RATCHET_STORE": " "}) is None
    assert quick_writes.write_command(["start"], {"RATCHET_STORE": ""}) is not None


def test_the_quick_path_bounds_are_those_of_the_full_cli():
    assert quick_writes.MAX_STEPS == options.MAX_STEPS
    assert quick_writes.MAX_BATCHES == options.MAX_BATCHES
    assert quick_writes.MAX_TOOL_LATENCY_MS == options.MAX_TOOL_LATENCY_MS
    assert quick_writes.MAX_APPROVAL_TIMEOUT_SECONDS == options.MAX_APPROVAL_TIMEOUT_SECONDS
    assert quick_writes.MAX_PRIORITY == options.MAX_PRIORITY == MAX_PRIORITY
