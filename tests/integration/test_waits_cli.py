"""`ratchet send`, `ratchet wake`, and what `status`, `worker` and `run` say of a run that
waits for an event or a time, on a real SQLite store.

One session drives the real `ratchet` command in subprocesses from start to done (the quick
read path answering `status`); the rest call the full CLI's `main` in this process, which is
what the console script runs, to keep the many refusals cheap. Every refusal is exit code 2,
one line on stderr naming what is wrong, nothing on stdout, and the store file byte for byte
as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ratchet.cli import app as cli
from ratchet.cli import quick
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import MAX_EVENT_BYTES, RunState, RunStatus
from tests.e2e.test_cli_contract import snapshot
from tests.processes import clean_env
from tests.waits_agent import AGENT

RATCHET = Path(sys.executable).with_name("ratchet")
"""The console script (`ratchet.cli.quick:main`): the quick path first, as a user runs it."""
PASSED = '{"conclusion": "success", "url": "https://ci.example/1"}'


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Said:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.err.splitlines()


@dataclass
class Store:
    root: Path

    @property
    def db(self) -> Path:
        return self.root / "ratchet.db"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"

    def __call__(self, *args: str) -> Said:
        """The full CLI's `main`, in this process, on this store."""
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main(["--store", self.url, *args])
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 1
        return Said(code, out.getvalue(), err.getvalue())

    def ok(self, *args: str) -> str:
        said = self(*args)
        assert said.code == 0, (args, said.out, said.err)
        return said.out

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def process(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The real `ratchet` command, in a process of its own."""
        return subprocess.run(
            [str(RATCHET), "--store", self.url, *args],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=120,
            check=False,
        )

    def head(self, run_id: str) -> RunState:
        runtime = LocalRuntime.open(LocalSettings(store=self.url), create=False)
        try:
            state = runtime.store.load_head(run_id)
        finally:
            runtime.close()
        assert state is not None
        return state

    def waiting_for_event(self, run_id: str = "w1", *params: str) -> str:
        self.ok("start", "--agent", AGENT, "--run-id", run_id, *params)
        self.ok("worker", "--until-idle")
        return run_id

    def sleeping(self, run_id: str = "s1") -> str:
        self.waiting_for_event(run_id, "--param", "nap=true")
        self.ok("send", run_id, "ci-finished", "--data", PASSED)
        self.ok("worker", "--until-idle")
        return run_id


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith(("RATCHET_", "ANTHROPIC_"))]:
            patch.delenv(name)
        patch.chdir(Path(__file__).parents[2])  # where `tests.waits_agent` imports from
        yield Store(tmp_path)


def assert_refused(said: Said, *mentions: str) -> None:
    assert said.code == 2, (said.code, said.out, said.err)
    assert said.out == ""
    assert len(said.lines) == 1, said.err
    assert "Traceback" not in said.err
    for mention in mentions:
        assert mention in said.lines[0], (mention, said.lines[0])


# --- one session, in real processes ----------------------------------------------------------


def test_a_run_waits_for_an_event_is_sent_it_and_finishes_through_the_command(store):
    def ok(*args: str) -> str:
        done = store.process(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return str(done.stdout)

    ok("start", "--agent", AGENT, "--run-id", "ci-run")
    worked = store.process("worker", "--until-idle")
    assert worked.returncode == 0, worked.stderr
    assert "ci-run waits for the event 'ci-finished' (until " in worked.stdout
    assert "send it: ratchet send ci-run ci-finished --data JSON)" in worked.stdout
    assert "approve or reject" not in worked.stdout
    assert '"level":"ERROR"' not in worked.stderr, "parking on an event is not a failure"

    status = ok("status", "ci-run")
    head = store.head("ci-run")
    assert head.waiting is not None
    due = head.waiting.due
    assert due is not None
    assert (
        f"waiting  for the event 'ci-finished' (until {due:%Y-%m-%d %H:%M:%S} UTC; "
        "send it: ratchet send ci-run ci-finished --data JSON)\n"
    ) in status
    wait = json.loads(ok("status", "ci-run", "--json"))["wait"]
    assert (wait["kind"], wait["name"], wait["step"]) == ("event", "ci-finished", 1)
    assert wait["until"] == due.isoformat()

    before = sha256(store.db)
    refused = store.process("send", "ci-run", "ci-finished", "--data", '{"conclusion": "maybe"}')
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.startswith("ratchet: --data: conclusion: 'maybe' is not one of")
    assert len(refused.stderr.splitlines()) == 1
    assert sha256(store.db) == before

    sending = store.process("send", "ci-run", "ci-finished", "--data", PASSED, "--id", "gh-1")
    assert sending.returncode == 0, sending.stderr
    assert sending.stdout.startswith("ci-run: event 'ci-finished' (gh-1) delivered at step 1;")
    assert '"message":"event sent"' in sending.stderr
    assert "ci.example" not in sending.stderr, "the log says what was sent, not the payload"
    again = json.loads(
        ok("send", "ci-run", "ci-finished", "--data", PASSED, "--id", "gh-1", "--json")
    )
    assert again == {
        "run_id": "ci-run",
        "name": "ci-finished",
        "event_id": "gh-1",
        "status": "delivered",
        "step": 1,
        "duplicate": True,
        "refused": None,
    }

    ok("worker", "--until-idle")
    done = json.loads(ok("status", "ci-run", "--json"))
    assert (done["status"], done["wait"]) == ("done", None)
    assert '"conclusion": "success"' in done["summary"]
    history = ok("history", "ci-run")
    assert "step committed; waits for the event 'ci-finished'" in history
    assert "event 'ci-finished' arrived (gh-1)" in history


# --- sleeping, waking, and `ratchet run` ------------------------------------------------------


def test_a_sleeping_run_says_when_it_wakes_and_is_woken_by_the_command(store):
    store.waiting_for_event("s1", "--param", "nap=true")
    store.ok("send", "s1", "ci-finished", "--data", PASSED)
    worked = store.ok("worker", "--until-idle")
    head = store.head("s1")
    assert head.waiting is not None
    until = f"{head.waiting.due:%Y-%m-%d %H:%M:%S} UTC"
    assert f"s1 is sleeping until {until} (wake it: ratchet wake s1); a worker resumes" in worked
    assert f"  waiting  sleeping until {until} (wake it: ratchet wake s1)\n" in store.ok(
        "status", "s1"
    )

    woken = store.ok("wake", "s1", "--by", "dana")

    assert (
        woken
        == "s1: woken at step 2; the next free worker resumes it (or: ratchet run --run-id s1)\n"
    )
    assert store.head("s1").last_result.startswith("Woken early by dana at ")
    store.ok("worker", "--until-idle")
    assert store.head("s1").status is RunStatus.DONE


def test_ratchet_run_says_how_to_send_the_event_and_opens_no_approval(store):
    said = store.ok("run", "--agent", AGENT, "--run-id", "r1")
    as_json = json.loads(store.ok("run", "--run-id", "r1", "--json").splitlines()[-1])

    assert "r1 waits for the event 'ci-finished' (until " in said
    assert "send it: ratchet send r1 ci-finished --data JSON)" in said
    assert "Approve or reject" not in said
    assert (as_json["status"], as_json["approval_link"]) == ("waiting", None)
    assert as_json["wait"]["kind"] == "event"
    assert not (store.root / "outbox").exists(), "no approval was opened, so nothing mailed"


def test_an_event_sent_before_the_run_waits_is_queued_and_taken_by_the_wait(store):
    store.ok("start", "--agent", AGENT, "--run-id", "early")

    said = store.ok("send", "early", "ci-finished", "--data", PASSED, "--id", "first")
    store.ok("worker", "--until-idle")

    assert said == (
        "early: event 'ci-finished' (first) queued in the mailbox: the run takes it when it "
        "waits for 'ci-finished'\n"
    )
    assert store.head("early").status is RunStatus.DONE


# --- the quick read path and the full CLI say the same ----------------------------------------


@pytest.mark.parametrize("kind", ["event", "timer"])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_waiting_runs_status_reads_the_same_on_both_paths(store, kind, as_json):
    run_id = store.waiting_for_event() if kind == "event" else store.sleeping()
    args = ["--store", store.url, "status", run_id, *(["--json"] if as_json else [])]

    quickly = quick.answer(args, os.environ)
    fully = store.ok(*args[2:])

    assert quickly is not None, "the quick path answers a run of the current schema"
    assert quickly == fully
    assert ("sleeping until" if kind == "timer" else "for the event 'ci-finished'") in fully.lower()


# --- refusals: one line, exit 2, nothing written ----------------------------------------------

OVER = '"' + "x" * MAX_EVENT_BYTES + '"'


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (("send", "nope", "ci-finished"), ("no run with id 'nope'",)),
        (("send", "ended", "ci-finished"), ("run 'ended' is cancelled", "takes no more events")),
        (("send", "w1", "bad name"), ("NAME: an event name is",)),
        (("send", "w1", "ci-finished", "--id", "a b"), ("--id: an event id is",)),
        (("send", "w1", "ci-finished", "--id", ""), ("--id", "must not be empty")),
        (("send", "w1", "ci-finished", "--data", "{nope"), ("--data is not JSON",)),
        (("send", "w1", "ci-finished", "--data", "NaN"), ("--data: the payload is not JSON",)),
        (
            ("send", "w1", "ci-finished", "--data", OVER),
            (f"--data: the payload is {MAX_EVENT_BYTES + 2:,} bytes, over the 262,144-byte",),
        ),
        (
            ("send", "w1", "ci-finished", "--data", '{"conclusion": "maybe"}'),
            ("--data: conclusion: 'maybe' is not one of", "the 'ci-finished' wait's schema"),
        ),
        (
            ("send", "w1", "ci-finished", "--data", '{"url": "x"}'),
            ("--data: 'conclusion' is a required property",),
        ),
        (
            ("send", "w1", "deploy-done"),
            ("waits for no event named 'deploy-done' (it waits for: 'ci-finished')",),
        ),
        (("send", "w1"), ("Missing argument 'NAME'",)),
        (("wake", "w1"), ("run 'w1' waits for an event, not a time: it cannot be woken",)),
        (("wake", "nope"), ("no run with id 'nope'",)),
        (("wake", "ended"), ("run 'ended' is cancelled, not sleeping",)),
        (("wake", "w1", "--by", ""), ("--by", "must not be empty")),
        (("wake", "w1", "--by", "x" * 400), ("bad wake: by:",)),
        (
            ("--store", "dynamodb://t?ledger=l&app=a&region=eu-west-1", "send", "w1", "x"),
            ("ratchet send needs a local sqlite:// store", "POST /runs/RUN/events/NAME"),
        ),
        (
            ("--store", "dynamodb://t?ledger=l&app=a&region=eu-west-1", "wake", "w1"),
            ("ratchet wake needs a local sqlite:// store", "POST /runs/RUN/wake"),
        ),
    ],
)
def test_a_refused_send_or_wake_is_one_line_and_changes_no_byte(store, args, mentions):
    store.waiting_for_event()
    store.ok("start", "--agent", AGENT, "--run-id", "ended")
    store.ok("cancel", "ended")
    before, rows = sha256(store.db), snapshot(store.root)

    assert_refused(store(*args), *mentions)
    assert sha256(store.db) == before
    assert snapshot(store.root) == rows


def test_a_send_or_wake_with_no_store_makes_none(store):
    assert_refused(store("send", "w1", "ci-finished"), "no Ratchet store")
    assert_refused(store("wake", "w1"), "no Ratchet store")
    assert not store.db.exists()


def test_a_payload_from_a_file_is_sent_and_one_over_the_bound_is_refused(store, tmp_path):
    store.waiting_for_event()
    big = tmp_path / "big.json"
    big.write_text(OVER)
    missing = tmp_path / "missing.json"
    before, rows = sha256(store.db), snapshot(store.root)
    # A real process: a payload this large cannot come as one command-line argument.
    refused = store.process("send", "w1", "ci-finished", "--data", f"@{big}")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"ratchet: --data: the payload is {MAX_EVENT_BYTES + 2:,} bytes, over the "
        f"{MAX_EVENT_BYTES:,}-byte limit"
    ]
    assert_refused(store("send", "w1", "ci-finished", "--data", f"@{missing}"), "cannot read")
    assert sha256(store.db) == before
    assert snapshot(store.root) == rows
    good = tmp_path / "good.json"
    good.write_text(PASSED)
    assert "delivered at step 1" in store.ok("send", "w1", "ci-finished", "--data", f"@{good}")
