"""Black-box tests of the `ratchet` CLI contract (issue 2, "CLI contract").

Every test drives the installed console script in a subprocess against its own store under
`tmp_path`, with no API key and no fault injection in the environment. Bad input must end in
exit code 2, one line on stderr, nothing on stdout and an unchanged store. A `ratchet` process
costs about a second of imports, so each case is one invocation where it can be.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

RATCHET = Path(sys.executable).with_name("ratchet")
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
STATUSES = {"running", "waiting", "done", "failed"}
BATCHES = "2"  # step 1 inspect, 2-3 copy, 4 ask; then 5 drop (if approved), 6 email, DONE
WAITING_STEP = 4
MAX_GOAL_BYTES = 64 * 1024
TIMEOUT = 60
SCRUBBED = {"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "RATCHET_FAULT", "RATCHET_STORE"}


def _environment(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SCRUBBED} | extra


@dataclass
class Cli:
    """The `ratchet` command bound to one store file (which need not exist yet)."""

    db: Path
    cwd: Path
    env: dict[str, str] = field(default_factory=_environment)

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"  # an absolute path: four slashes

    def __call__(self, *args: str, store: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(RATCHET), *(["--store", self.url] if store else []), *args]
        return subprocess.run(
            command,
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def ok(self, *args: str) -> str:
        result = self(*args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result.stdout

    def json(self, *args: str) -> dict[str, Any]:
        lines = self.ok(*args, "--json").splitlines()
        assert len(lines) == 1, lines
        payload = json.loads(lines[0])
        assert isinstance(payload, dict)
        return payload


def fresh(tmp_path: Path) -> Cli:
    """A store that does not exist yet, in a folder that does not exist yet."""
    return Cli(db=tmp_path / "store" / "ratchet.db", cwd=tmp_path)


def assert_rejected(result: subprocess.CompletedProcess[str], *mentions: str) -> None:
    """The contract for bad input: exit 2, one clear line on stderr, nothing else."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].strip()
    for mention in mentions:
        assert mention.lower() in lines[0].lower(), (mention, lines[0])


def snapshot(root: Path) -> dict[str, Any]:
    """Every file under `root` and every row of every table of every SQLite file in it."""
    files = sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if not p.name.endswith(("-wal", "-shm"))
    )
    tables: dict[str, list[str]] = {}
    for db in sorted(root.rglob("*.db")):
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            names = [
                row[0]
                for row in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
                )
            ]
            for name in names:
                rows = connection.execute(f'SELECT * FROM "{name}"').fetchall()
                tables[f"{db.relative_to(root)}:{name}"] = sorted(map(repr, rows))
        finally:
            connection.close()
    return {"files": files, "tables": tables}


def stored_head(db: Path, run_id: str) -> dict[str, Any]:
    """What the store holds of a run's head: its static part, written once, and the part each
    commit rewrites (the window is not stored: it is read back from the step records)."""
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        state, static, version, attempts = connection.execute(
            "SELECT r.state, s.state, r.version, r.attempts FROM runs AS r "
            "JOIN run_static AS s ON s.run_id = r.run_id WHERE r.run_id = ?",
            (run_id,),
        ).fetchone()
    finally:
        connection.close()
    head: dict[str, Any] = (
        json.loads(static) | json.loads(state) | {"version": version, "attempts": attempts}
    )
    return head


def _pruned(value: Any) -> Any:
    """`value` without the fields that are None (the store leaves unset fields out)."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def case_id(value: object) -> str:
    if isinstance(value, str):
        return repr(value) if len(value) <= 20 else f"<{len(value)} chars>"
    if isinstance(value, tuple):
        return " ".join(v if isinstance(v, str) and v.isidentifier() else case_id(v) for v in value)
    return repr(value)


def _run_until_waiting(cli: Cli, run_id: str) -> None:
    output = cli.ok("run", "--scenario", "migration", "--batches", BATCHES, "--run-id", run_id)
    # A line per step first (issue 10), then where the run stands.
    lines = output.splitlines()
    assert [line.split("  ")[:2] for line in lines[:WAITING_STEP]] == [
        [run_id, f"step {step}"] for step in range(1, WAITING_STEP + 1)
    ]
    assert lines[WAITING_STEP] == f"{run_id}: waiting at step {WAITING_STEP}"


# --- start -----------------------------------------------------------------------------------


def test_start_prints_the_run_id_and_a_second_start_changes_nothing(tmp_path):
    cli = fresh(tmp_path)

    first = cli("start", "--scenario", "migration", "--run-id", "r1", "--batches", BATCHES)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "r1\n"
    history = cli.json("history", "r1")
    before = snapshot(cli.db.parent)

    again = cli("start", "--scenario", "migration", "--run-id", "r1", "--batches", BATCHES)
    other = cli("start", "--scenario", "migration", "--run-id", "r1", "--batches", "3")

    assert again.returncode == 0, again.stderr
    assert again.stdout == "r1\n"
    assert "already exists" in again.stderr
    assert other.returncode == 2
    assert "exists with another goal, input" in other.stderr
    assert cli.json("history", "r1") == history
    assert snapshot(cli.db.parent) == before


def test_start_without_run_id_prints_a_generated_id_that_status_accepts(tmp_path):
    cli = fresh(tmp_path)

    lines = cli.ok("start", "--scenario", "migration", "--batches", BATCHES).splitlines()

    assert len(lines) == 1
    run_id = lines[0]
    assert RUN_ID.fullmatch(run_id)
    status = cli.json("status", run_id)
    assert status["run_id"] == run_id
    assert (status["status"], status["step"], status["summary"]) == ("running", 0, None)


def test_the_longest_run_id_and_a_goal_of_exactly_64_kb_are_accepted(tmp_path):
    cli = fresh(tmp_path)
    run_id = "a" * 128
    (tmp_path / "goal.txt").write_text("g" * MAX_GOAL_BYTES, encoding="utf-8")
    goal = (tmp_path / "goal.txt").read_text(encoding="utf-8")

    assert cli.ok("start", "--scenario", "migration", "--goal", goal, "--run-id", run_id) == (
        f"{run_id}\n"
    )


def test_the_store_can_come_from_ratchet_store(tmp_path):
    cli = fresh(tmp_path)
    cli.env = _environment(RATCHET_STORE=cli.url)

    started = cli("start", "--scenario", "migration", "--run-id", "e1", store=False)

    assert started.returncode == 0, started.stderr
    assert started.stdout == "e1\n"
    assert cli.db.is_file()
    status = cli("status", "e1", "--json", store=False)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["run_id"] == "e1"


def test_the_store_is_a_plain_path_and_the_options_go_before_or_after_the_command(tmp_path):
    """`--store runs.db` after the command, `--json` before it, `RATCHET_STORE=runs.db`: the
    file `runs.db` in the current folder, as `sqlite:///runs.db` would name it."""
    cli = fresh(tmp_path)
    cli.env = _environment()

    started = cli("start", "--scenario", "migration", "--run-id", "p1", "--store", "runs.db",
                  store=False)  # fmt: skip
    worked = cli("worker", "--until-idle", "--store", "runs.db", store=False)
    status = cli("--json", "status", "p1", "--store", "runs.db", store=False)
    cli.env = _environment(RATCHET_STORE="runs.db")
    history = cli("history", "p1", "--json", store=False)

    assert started.returncode == worked.returncode == 0, started.stderr + worked.stderr
    assert (tmp_path / "runs.db").is_file()
    assert not (tmp_path / ".ratchet").exists()
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["status"] == "waiting"
    assert history.returncode == 0, history.stderr
    assert json.loads(history.stdout)["run_id"] == "p1"


def test_the_default_store_is_under_the_current_directory(tmp_path):
    cli = fresh(tmp_path)

    started = cli("start", "--scenario", "migration", "--run-id", "d1", store=False)

    assert started.returncode == 0, started.stderr
    assert (tmp_path / ".ratchet" / "ratchet.db").is_file()
    assert not cli.db.parent.exists()


# --- the migration from start to finish ------------------------------------------------------


def test_approve_path_from_run_to_verify_history_and_show(tmp_path):
    cli = fresh(tmp_path)

    cli.ok("run", "--scenario", "migration", "--batches", BATCHES, "--run-id", "r1")
    waiting = cli.json("status", "r1")
    assert {"run_id", "status", "step", "version", "attempts", "summary"} <= waiting.keys()
    assert (waiting["run_id"], waiting["status"], waiting["step"]) == ("r1", "waiting", 4)
    assert isinstance(waiting["version"], int)
    assert isinstance(waiting["attempts"], int)
    assert waiting["summary"] is None

    approved = cli("approve", "r1", "--comment", "x")
    assert approved.returncode == 0, approved.stderr
    assert "approved" in approved.stdout
    cli.ok("worker", "--until-idle")

    done = cli.json("status", "r1")
    assert done["status"] == "done"
    assert done["version"] > waiting["version"]
    assert isinstance(done["summary"], str)
    assert "2,000 rows" in done["summary"]
    assert "was dropped" in done["summary"]
    verify = cli.json("verify", "r1")
    assert verify["ok"] is True
    assert (verify["source_rows"], verify["target_rows"]) == (2000, 2000)
    assert verify["duplicate_rows"] == 0
    assert verify["emails_sent"] == 1
    assert verify["legacy_dropped"] is True

    history = cli.json("history", "r1")
    assert history["run_id"] == "r1"
    checkpoints = history["checkpoints"]
    assert isinstance(checkpoints, list)
    assert len(checkpoints) >= 8  # created, steps 1-6, the decision, finished
    for checkpoint in checkpoints:
        assert {"version", "step", "status", "worker", "bytes", "time"} <= checkpoint.keys()
        assert isinstance(checkpoint["version"], int)
        assert isinstance(checkpoint["step"], int)
        assert checkpoint["status"] in STATUSES
        assert isinstance(checkpoint["worker"], str)
        assert checkpoint["worker"]
        assert isinstance(checkpoint["bytes"], int)
        assert checkpoint["bytes"] > 0
        assert datetime.fromisoformat(checkpoint["time"]).tzinfo is not None
    versions = [c["version"] for c in checkpoints]
    assert all(a < b for a, b in itertools.pairwise(versions))
    steps = [c["step"] for c in checkpoints]
    assert steps == sorted(steps)
    assert [(c["step"], c["status"]) for c in checkpoints if c["status"] != "running"] == [
        (4, "waiting"),
        (done["step"], "done"),
    ]
    assert (checkpoints[0]["step"], checkpoints[0]["status"]) == (0, "running")
    assert (checkpoints[-1]["version"], checkpoints[-1]["step"]) == (done["version"], done["step"])

    head = cli.json("show", "r1")
    stored = stored_head(cli.db, "r1")
    assert _pruned({name: head[name] for name in stored}) == stored
    assert [m["step"] for m in head["messages"]] == [2, 3, 4, 5, 6]  # the window, read back
    for name in ("run_id", "status", "step", "version", "attempts", "summary"):
        assert head[name] == done[name], name
    assert cli.json("show", "r1", "--step", str(done["step"])) == head
    at_3 = cli.json("show", "r1", "--step", "3")
    last_of_step_3 = [c for c in checkpoints if c["step"] == 3][-1]
    assert (at_3["run_id"], at_3["step"], at_3["status"]) == ("r1", 3, "running")
    assert at_3["version"] == last_of_step_3["version"]
    assert [m["step"] for m in at_3["messages"]] == [1, 2, 3]
    assert at_3["summary"] is None

    before = snapshot(cli.db.parent)
    assert_rejected(cli("approve", "r1"), "r1", "not waiting")
    assert snapshot(cli.db.parent) == before


def test_reject_path_keeps_the_legacy_table_and_still_reports(tmp_path):
    cli = fresh(tmp_path)
    _run_until_waiting(cli, "r1")

    rejected = cli("reject", "r1", "--reason", "not yet")
    assert rejected.returncode == 0, rejected.stderr
    assert "rejected" in rejected.stdout
    cli.ok("worker", "--until-idle")

    status = cli.json("status", "r1")
    assert status["status"] == "done"
    assert "was kept" in status["summary"]
    verify = cli.json("verify", "r1")
    assert verify["ok"] is True
    assert verify["target_rows"] == 2000
    assert verify["duplicate_rows"] == 0
    assert verify["emails_sent"] == 1
    assert verify["legacy_dropped"] is False

    before = snapshot(cli.db.parent)
    assert_rejected(cli("reject", "r1", "--reason", "again"), "r1", "not waiting")
    assert snapshot(cli.db.parent) == before


def test_worker_until_idle_leaves_a_waiting_run_alone(tmp_path):
    cli = fresh(tmp_path)
    _run_until_waiting(cli, "r1")
    before = snapshot(cli.db.parent)

    started = time.monotonic()
    result = cli("worker", "--until-idle")
    elapsed = time.monotonic() - started

    assert result.returncode == 0, result.stderr
    assert elapsed < 15  # it returns once nothing is runnable; it does not wait on the run
    assert cli.json("status", "r1")["status"] == "waiting"
    assert snapshot(cli.db.parent) == before


def test_a_parked_run_prints_its_link_and_the_outbox_holds_the_same_one(tmp_path):
    cli = fresh(tmp_path)
    cli.env["RATCHET_PUBLIC_URL"] = "http://127.0.0.1:9911"

    out = cli.ok("run", "--scenario", "migration", "--batches", BATCHES, "--run-id", "r1")

    found = re.search(r"Approve or reject at: (\S+)", out)
    assert found, out
    link = found.group(1)
    assert link.startswith("http://127.0.0.1:9911/approvals/")
    assert re.search(r"[?&]run=r1&", link)
    assert re.search(r"[?&]sig=[0-9a-f]{64}$", link)
    (message,) = [
        json.loads(p.read_text()) for p in (cli.db.parent / "ratchet.outbox").glob("*.json")
    ]
    assert (message["channel"], message["link"]) == ("email", link)
    assert "Drop legacy_orders" in message["subject"]
    assert link in message["text"]
    assert "step 4" in message["text"]
    assert cli.ok("link", "r1").strip() == link, "the same request, the same recipient"


def test_a_worker_prints_the_link_of_the_run_it_parks(tmp_path):
    cli = fresh(tmp_path)
    cli.ok("start", "--scenario", "migration", "--batches", BATCHES, "--run-id", "r2")

    out = cli.ok("worker", "--until-idle")

    assert re.search(
        r"^r2 waits for a person; approve or reject at: http://\S+/approvals/", out, re.MULTILINE
    )
    assert cli.json("status", "r2")["status"] == "waiting"


def test_link_and_serve_refuse_what_they_cannot_serve(tmp_path):
    cli = fresh(tmp_path)
    _run_until_waiting(cli, "r1")
    cli.ok("approve", "r1")
    before = snapshot(cli.db.parent)

    assert_rejected(cli("link", "nope"), "nope")
    assert_rejected(cli("link", "r1"), "r1", "not waiting")
    # serve reads a deployed stack's tables (issue 40), but only from a store URL that names
    # them: a table name DynamoDB would refuse is one line before anything is asked of AWS.
    aws = "dynamodb://t1?ledger=t2&app=t3&region=eu-west-1"
    assert_rejected(cli("--store", aws, "serve", store=False), "t1", "checkpoints table")
    assert snapshot(cli.db.parent) == before


# Bad input against a store with runs in it is the catalogue in test_bad_input.py.


def test_help_is_still_help(tmp_path):
    cli = fresh(tmp_path)

    result = cli("start", "--help")

    assert result.returncode == 0, result.stderr
    assert "--max-steps" in result.stdout
    assert result.stderr == ""
    assert not cli.db.parent.exists()


# --- bad input to start and run on a fresh path: no store comes into existence --------------

NEW_RUN_CASES: list[tuple[Sequence[str], Sequence[str]]] = [
    (("start", "--run-id", "r1"), ("--goal", "--scenario")),
    (("start", "--scenario", "nope"), ("nope",)),
    (("run", "--scenario", "nope", "--batches", BATCHES), ("nope",)),
    (
        ("start", "--scenario", "migration", "--agent", "ratchet.scenarios.migration:agent"),
        ("both",),
    ),
    (("start", "--agent", "no_such_module:agent"), ("no_such_module",)),
    (("start", "--scenario", "migration", "--model", "claude-x"), ("ANTHROPIC_API_KEY",)),
    (("start", "--scenario", "migration", "--run-id", "bad/id"), ("malformed",)),
    (("start", "--scenario", "migration", "--run-id", ""), ("malformed",)),
]


@pytest.mark.parametrize(("args", "mentions"), NEW_RUN_CASES, ids=case_id)
def test_bad_new_run_creates_no_store(tmp_path, args, mentions):
    cli = fresh(tmp_path)

    assert_rejected(cli(*args), *mentions)

    assert not cli.db.parent.exists()


@pytest.mark.parametrize(
    ("command", "text"),
    [
        ("start", "a" * (MAX_GOAL_BYTES + 1)),
        ("run", "\N{EURO SIGN}" * (MAX_GOAL_BYTES // 3 + 1)),  # over 64 KB in fewer characters
    ],
    ids=["start-ascii", "run-three-byte-chars"],
)
def test_a_goal_over_64_kb_is_refused(tmp_path, command, text):
    cli = fresh(tmp_path)
    (tmp_path / "goal.txt").write_text(text, encoding="utf-8")
    goal = (tmp_path / "goal.txt").read_text(encoding="utf-8")
    assert len(goal.encode("utf-8")) > MAX_GOAL_BYTES

    assert_rejected(cli(command, "--goal", goal, "--run-id", "g1"), "64 KB")

    assert not cli.db.parent.exists()


# --- unreadable stores -----------------------------------------------------------------------

COMMAND_ARGS = {
    "status": ("status", "r1"),
    "verify": ("verify", "r1"),
    "reject": ("reject", "r1"),
    "start": ("start", "--scenario", "migration", "--run-id", "r1"),
    "worker": ("worker", "--until-idle"),
}


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("command", ["status", "start", "worker"])
def test_a_file_of_random_bytes_is_an_unreadable_store(tmp_path, command):
    cli = fresh(tmp_path)
    cli.db.parent.mkdir()
    cli.db.write_bytes(os.urandom(8192))
    before = _files(cli.db.parent)

    assert_rejected(cli(*COMMAND_ARGS[command]), "store")

    assert _files(cli.db.parent) == before


@pytest.mark.parametrize("command", ["status", "verify", "reject"])
def test_read_commands_on_a_missing_store_create_nothing(tmp_path, command):
    cli = fresh(tmp_path)

    assert_rejected(cli(*COMMAND_ARGS[command]), "store")

    assert not cli.db.parent.exists()


@pytest.mark.parametrize("kind", ["empty-file", "other-apps-sqlite"])
def test_a_file_that_is_not_a_ratchet_store_is_left_alone(tmp_path, kind):
    cli = fresh(tmp_path)
    cli.db.parent.mkdir()
    if kind == "empty-file":
        cli.db.touch()
    else:
        connection = sqlite3.connect(cli.db)
        connection.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
        connection.commit()
        connection.close()
    before = _files(cli.db.parent)

    assert_rejected(cli("status", "r1"), "store")

    assert _files(cli.db.parent) == before


# --- your own agent, by module:attr ---------------------------------------------------------

USER_AGENT = textwrap.dedent(
    '''
    from pathlib import Path

    from pydantic import BaseModel

    from ratchet.tools import Agent, Done, ToolCall, ToolContext, tool

    EFFECTS = Path(__file__).with_name("effects.txt")


    class Note(BaseModel):
        text: str


    @tool(side_effect=True)
    def write_note(args: Note, ctx: ToolContext) -> str:
        """Append a note to the effects file."""
        with EFFECTS.open("a", encoding="utf-8") as effects:
            effects.write(f"{ctx.idempotency_key} {args.text}\\n")
        return "noted"


    def policy(view):
        if not view.messages:
            return ToolCall(name="write_note", arguments={"text": "hello"})
        return Done(summary="wrote one note")


    agent = Agent(name="noter", goal="Write one note.", tools=[write_note], policy=policy)
    not_an_agent = 42
    '''
)


@pytest.fixture
def user_agent(tmp_path: Path) -> Cli:
    (tmp_path / "my_agent.py").write_text(USER_AGENT, encoding="utf-8")
    (tmp_path / "broken_agent.py").write_text("raise RuntimeError('boom')\n", encoding="utf-8")
    (tmp_path / "typo_agent.py").write_text("def agent(:\n", encoding="utf-8")
    return fresh(tmp_path)


def test_run_with_your_own_agent_module(user_agent):
    user_agent.ok("run", "--agent", "my_agent:agent", "--run-id", "a1")

    status = user_agent.json("status", "a1")
    assert (status["status"], status["summary"]) == ("done", "wrote one note")
    effects = user_agent.cwd / "effects.txt"
    assert effects.read_text(encoding="utf-8").splitlines() == ["a1/step-1 hello"]


def test_a_worker_in_the_same_directory_works_a_run_of_your_own_agent(user_agent):
    user_agent.ok("start", "--agent", "my_agent:agent", "--run-id", "a2")
    user_agent.ok("worker", "--until-idle")

    assert user_agent.json("status", "a2")["status"] == "done"
    effects = user_agent.cwd / "effects.txt"
    assert effects.read_text(encoding="utf-8").splitlines() == ["a2/step-1 hello"]


@pytest.mark.parametrize(
    ("reference", "mentions"),
    [
        ("my_agent:not_an_agent", ("not", "Agent")),
        ("broken_agent:agent", ("broken_agent", "boom")),
        ("typo_agent:agent", ("typo_agent", "SyntaxError")),
    ],
)
def test_an_agent_reference_that_is_not_an_agent_is_refused(user_agent, reference, mentions):
    assert_rejected(user_agent("start", "--agent", reference, "--run-id", "a1"), *mentions)

    assert not user_agent.db.parent.exists()
    assert not (user_agent.cwd / "effects.txt").exists()


def test_a_worker_that_stops_when_idle_makes_no_store_where_there_is_none(tmp_path):
    cli = fresh(tmp_path)

    idle = cli("worker", "--until-idle")

    assert idle.returncode == 0, idle.stderr
    assert idle.stderr.strip().splitlines()[-1].startswith("nothing to work: no Ratchet store at")
    assert not (tmp_path / "store").exists()


def test_the_commands_run_prints_to_run_next_name_the_store_it_was_given(tmp_path):
    # Given a run on a store named with --store, waiting for a person
    cli = fresh(tmp_path)
    printed = cli.ok("run", "--scenario", "migration", "--batches", BATCHES, "--run-id", "m1")

    # Then the commands it suggests name that store, so that they act on the same run
    store = shlex.quote(cli.url)
    assert f"(serve it with: ratchet serve --store {store})" in printed
    approve = re.search(r"or decide here: (ratchet approve m1 --store \S+)  /  ", printed)
    assert approve, printed
    assert f"ratchet reject m1 --store {store}" in printed

    # And the one printed runs as printed, on that store
    args = shlex.split(approve.group(1))[1:]
    cli(*args, store=False).check_returncode()
    assert cli.json("status", "m1")["status"] != "waiting"
