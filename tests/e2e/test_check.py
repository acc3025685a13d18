"""`ratchet check`, as a user types it: a naive tool is reported at the step and fault point
where a crash doubles its effect, for both crash kinds; its `put_once` version, every example
and every built-in scenario end every crash schedule as the run without a crash did; a
model-driven agent is checked from a recorded run without asking its model; bad input is one
line and exit code 2.

The agent under check is tests/check_agent.py (its world: `shop.db` and `emails.txt` in each
schedule's scratch working directory). Each check runs its schedules on 2 processes, as CI's
2 cores would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.check_agent import AGENT, CLAUDE_AGENT, MODEL, MODEL_CALLS_ENV, setup
from tests.mcp_processes import free_port, wait_listening
from tests.processes import RATCHET, clean_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [
    ROOT / "examples" / name / "src"
    for name in ("billing_agent", "pr_agent", "status_agent", "support_agent")
]
WORLD = ("--effects", "tests.check_agent:effects", "--setup", "tests.check_agent:setup")
PROCESSES = ("--processes", "2")
CHECK_TIMEOUT_SECONDS = 600
pytestmark = pytest.mark.slow


def ratchet(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(ROOT), *map(str, EXAMPLES), os.environ.get("PYTHONPATH", "")])
    started = time.perf_counter()
    done = subprocess.run(
        [*RATCHET, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=path, **env),
        timeout=CHECK_TIMEOUT_SECONDS,
        check=False,
    )
    took = time.perf_counter() - started
    print(f"ratchet {' '.join(args[:2])}: exit {done.returncode} in {took:.1f} s")
    return done


def failing(report: dict[str, Any]) -> set[tuple[int, str, str]]:
    return {
        (v["crash"]["step"], v["crash"]["point"], v["crash"]["kind"])
        for v in report["verdicts"]
        if v["differences"]
    }


def test_a_naive_tool_is_reported_where_a_crash_doubles_its_effect_by_either_crash(tmp_path):
    # Given the refund that checks the balance, then pays, ignoring its key (step 2), and the
    # e-mail that appends a line on every call (step 3)
    done = ratchet(
        tmp_path,
        "check",
        AGENT,
        "--param",
        "refund=refund_naive",
        "--param",
        "email=email_naive",
        *WORLD,
        *PROCESSES,
    )
    print(done.stdout)

    # Then exactly the crashes after the tool ran and before its step committed double them,
    # raised or killed, each said in a line; and the direct test of each key says so too
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    doubled = [line.strip() for line in lines if "applied twice" in line]
    assert doubled == [
        f"step {step}, {point}, {how}: `{tool}` applied twice (effects differ: {what})"
        for step, tool, what in (
            (2, "refund_naive", "payments.count 2 ≠ 1; payments.total 60 ≠ 30"),
            (3, "email_naive", "emails: 2 items ≠ 1"),
        )
        for point in ("after_tool", "before_commit")
        for how in ("raised", "killed")
    ]
    keys = [line.strip() for line in lines if re.match(r"\s+step \d, key ", line)]
    assert [key.split(" is ")[0] for key in keys] == [
        "step 2, key checked/step-2: `refund_naive`",
        "step 3, key checked/step-3: `email_naive`",
    ]
    assert all(" is not idempotent under its key" in key for key in keys)
    schedules = re.search(r"(\d+) crash schedules \(of (\d+)\)", lines[0])
    assert schedules is not None
    assert schedules[1] == schedules[2]
    assert lines[-1].startswith("FAILED")


def test_the_put_once_version_of_the_tool_passes_every_schedule_of_both_kinds(tmp_path):
    done = ratchet(
        tmp_path, "check", AGENT, "--param", "refund=refund_once", *WORLD, *PROCESSES, "--json"
    )

    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    print({k: report[k] for k in ("planned", "ran", "seconds", "schedule_seconds")})
    assert report["ok"] is True
    assert report["differences"] == []
    assert report["ran"] == report["planned"] == len(report["verdicts"]) > 0
    assert {v["crash"]["kind"] for v in report["verdicts"]} == {"raise", "kill"}
    assert all(v["reached"] for v in report["verdicts"] if v["crash"]["point"] == "after_tool")
    assert report["baseline"]["effects"] == {"payments": {"count": 1, "total": 30}, "emails": []}
    assert [(k["tool"], k["ok"]) for k in report["key_tests"]] == [("refund_once", True)]


# --- the examples and the built-in scenarios ---------------------------------------------------


@pytest.fixture
def status_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from tests.status_service import serving

    with serving(monkeypatch):
        yield


@pytest.fixture
def orders_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    port = free_port()
    argv = [
        "-m",
        "support_agent.orders_server",
        "--port",
        str(port),
        "--data",
        str(tmp_path / "orders"),
    ]
    env = clean_env(PYTHONPATH=str(ROOT / "examples" / "support_agent" / "src"))
    server = subprocess.Popen(
        [*RATCHET[:1], *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_listening(server, port)
        monkeypatch.setenv("SUPPORT_MCP_URL", f"http://127.0.0.1:{port}/mcp")
        yield
    finally:
        server.kill()
        server.wait()


CI_SCRIPT = {"events": {"ci-finished": [{"conclusion": "failure"}, {"conclusion": "success"}]}}
CHECKED = {
    "billing": (
        "billing_agent.agent:agent",
        ["--input", '{"order_id": "A-1", "amount": 150}'],
        None,
    ),
    "pr": ("pr_agent.agent:agent", ["--param", "branch=fix-login"], CI_SCRIPT),
    "status": ("status_agent.agent:agent", ["--param", "service=payments"], None),
    "support": (
        "support_agent.agent:agent",
        ["--input", '{"order_id": "A-100", "amount": 20}'],
        None,
    ),
    "migration": ("migration", ["--param", "batches=1"], None),
    "notebook": ("notebook", [], None),
}
SERVICES = {"status": "status_service", "support": "orders_server"}


@pytest.mark.parametrize("name", list(CHECKED))
def test_every_example_and_built_in_scenario_passes_ratchet_check(name, tmp_path, request):
    if name in SERVICES:
        request.getfixturevalue(SERVICES[name])
    agent, given, script = CHECKED[name]
    if script is not None:
        (tmp_path / "script.json").write_text(json.dumps(script))
        given = [*given, "--script", str(tmp_path / "script.json")]

    done = ratchet(tmp_path, "check", agent, *given, *PROCESSES, "--json", **_service_env())

    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    print(
        f"{name}: {report['ran']} schedules in {report['seconds']:.1f} s "
        f"({report['schedule_seconds']:.1f} s of schedules on {report['processes']} processes), "
        f"{len(report['baseline']['steps'])} steps, ended {report['baseline']['status']}"
    )
    assert report["differences"] == [], report["differences"]
    assert done.returncode == 0
    assert report["baseline"]["status"] == "done"
    assert report["ran"] == report["planned"] > 0


def _service_env() -> dict[str, str]:
    return {k: os.environ[k] for k in ("STATUS_API_URL", "SUPPORT_MCP_URL") if k in os.environ}


# --- a model-driven agent, from its recorded decisions -----------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_model_driven_agent_is_checked_from_a_recorded_run_without_asking_its_model(
    tmp_path, monkeypatch, request, kind
):
    # Given a run of the agent with no scripted policy, decided by a model (the stand-in for
    # Claude counts the calls it answers), done in a store (a local file, or a Postgres one)
    calls = tmp_path / "model-calls.txt"
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    if kind == "postgres":
        postgres = request.getfixturevalue("postgres")
        store = postgres.url(postgres.fresh_database())
    env = {MODEL_CALLS_ENV: str(calls)}
    (tmp_path / "world").mkdir()
    monkeypatch.chdir(tmp_path / "world")
    setup()
    ran = ratchet(
        tmp_path / "world",
        "--store",
        store,
        "run",
        "--agent",
        CLAUDE_AGENT,
        "--model",
        MODEL,
        "--run-id",
        "r1",
        "--param",
        "refund=refund_on_key",
        **env,
    )
    assert ran.returncode == 0, ran.stderr
    asked = calls.read_text().splitlines()

    # When it is checked from that run's decisions, and from a recording the check makes
    checked = ratchet(
        tmp_path,
        "check",
        CLAUDE_AGENT,
        "--from-run",
        "r1",
        "--store",
        store,
        *WORLD,
        *PROCESSES,
        "--json",
        **env,
    )
    after_from_run = calls.read_text().splitlines()
    recording = tmp_path / "decisions.json"
    recorded = ratchet(
        tmp_path,
        "check",
        CLAUDE_AGENT,
        "--record",
        str(recording),
        "--model",
        MODEL,
        "--param",
        "refund=refund_on_key",
        *WORLD,
        *PROCESSES,
        "--json",
        **env,
    )
    after_recording = calls.read_text().splitlines()
    # Then every schedule ends as the run did, and the model was asked only by the run itself
    # and by the one run that recorded the decisions: never by a schedule
    assert asked == ["r1 1", "r1 2", "r1 3"]  # look up, refund, done
    for done in (checked, recorded):
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert report["ok"]
        assert report["ran"] == report["planned"] > 0
        assert [s["tool"] for s in report["baseline"]["steps"]] == [
            "look_up_order",
            "refund_on_key",
        ]
    assert after_from_run == asked
    assert len(after_recording) == len(asked) * 2
    assert calls.read_text().splitlines() == after_recording
    assert json.loads(recording.read_text())["params"]["refund"] == "refund_on_key"


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["no_such_module:agent"], "no_such_module"),
        (
            [AGENT, *WORLD[2:], "--effects", "tests.check_agent:effects_that_raise"],
            "raised RuntimeError: the test database is down",
        ),
        ([AGENT, *WORLD[2:], "--effects", "tests.check_agent:effects_not_json"], "not JSON"),
        ([AGENT, "--effects", "tests.check_agent:no_such_function"], "no_such_function"),
        ([CLAUDE_AGENT], "has no scripted policy"),
        ([AGENT, "--from-run", "nope", "--store", "sqlite:///runs.db"], "no Ratchet store"),
        ([AGENT, "--model", MODEL], "--record"),
    ],
    ids=[
        "no-such-agent",
        "effects-raise",
        "effects-not-json",
        "no-such-effects",
        "no-policy",
        "no-such-run",
        "model-without-record",
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, args, said):
    done = ratchet(tmp_path, "check", *args, *PROCESSES)

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("ratchet: "), done.stderr
    assert said in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("agent", "given", "said"),
    [
        (
            "tests.children_agent:child",
            ["--input", '{"i": "x"}'],
            "ratchet: bad input for agent 'child': Input should be a valid integer, unable to "
            "parse string as an integer (--input field i)",
        ),
        (
            "tests.children_agent:child",
            ["--param", "i=x"],
            "ratchet: bad input for agent 'child': Input should be a valid integer, unable to "
            "parse string as an integer (--param i)",
        ),
        (
            "billing_agent.agent:agent",
            ["--input", '{"order_id": "A-1"}'],
            "ratchet: bad input for agent 'billing': Field required (--input field amount)",
        ),
    ],
    ids=["not-an-integer", "not-an-integer-by-param", "missing"],
)
def test_bad_agent_input_is_refused_in_the_line_start_refuses_it_in(tmp_path, agent, given, said):
    # When the same input is given to `check` and to `start`
    checked = ratchet(tmp_path, "check", agent, *given, *PROCESSES)
    started = ratchet(tmp_path, "--store", "sqlite:///runs.db", "start", "--agent", agent, *given)

    # Then both refuse it in one line, exit 2, naming the field and the flag it came in, and
    # neither dumps pydantic's report (its model, the input, its link)
    for done in (checked, started):
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stdout == ""
        assert done.stderr == said + "\n"
