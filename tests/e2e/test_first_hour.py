"""The first hour of a new user (issue 36): what the README's commands do with the environment
a user has (a key set, a typo, Ctrl-C), each held by the real `ratchet` command or client."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import ratchet
from ratchet.runtime.local import LocalRuntime
from ratchet.state import RunStatus
from tests.integration.fake_messages_api import FakeMessagesApi, overloaded, text_response
from tests.processes import RATCHET, Cli, clean_env, serving

PAID = "claude-sonnet-4-6"


def ratchet_in(
    root: Path,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """The `ratchet` command on the store in `root`, to its end."""
    return subprocess.run(
        [*RATCHET, "--store", f"sqlite:///{root / 'ratchet.db'}", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def test_a_key_in_the_environment_leaves_an_agent_with_a_policy_offline(tmp_path):
    # Given a key and an API that refuses every call (an empty queue answers 400)
    with FakeMessagesApi() as api:
        client = ratchet.connect(
            f"sqlite:///{tmp_path}/ratchet.db",
            environ={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url},
        )
        try:
            # When a run names no model
            run = client.run(run_id="offline", goal="file this")
            state = client.runtime.store.load_head("offline")
        finally:
            client.close()

    # Then the agent's policy ran it, and nothing was billed
    assert run.status is RunStatus.DONE
    assert state is not None
    assert state.options.model == "scripted"
    assert api.requests == []


def test_a_run_on_a_paid_model_names_it_in_its_first_line(tmp_path):
    with FakeMessagesApi() as api:
        api.enqueue(text_response("DONE: filed."))
        done = ratchet_in(
            tmp_path,
            *("run", "--goal", "g", "--model", PAID, "--run-id", "paid"),
            env=clean_env(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url),
        )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"model: {PAID}"
    assert len(api.requests) == 1


AGENT_MODULE = '''
from pydantic import BaseModel
from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, ask_person, tool


class Note(BaseModel):
    text: str


@tool()
def note(args: Note, ctx: ToolContext) -> str:
    """Write a note."""
    return "noted"


def policy(view: StepView):
    if view.messages:
        return Done(summary="noted")
    return ToolCall(name="note", arguments={"text": "x"})


agent = Agent(name="first_hour", goal="note", tools=[note], policy=policy)


@tool()
def ask(args: Note, ctx: ToolContext):
    """Ask a person."""
    return ask_person(f"May I {args.text}?")


def asking(view: StepView):
    if view.messages:
        return Done(summary=view.last_result or "")
    return ToolCall(name="ask", arguments={"text": "refund"})


asker = Agent(name="first_hour_asker", goal="ask", tools=[ask], policy=asking)


@tool(side_effect=True)
def flaky(args: Note, ctx: ToolContext) -> str:
    """Fails at its first try."""
    if ctx.resources.put_once("tried", "1"):
        raise RuntimeError("the service is down")
    return "worked"


def retrying(view: StepView):
    if view.messages:
        return Done(summary=view.last_result or "")
    return ToolCall(name="flaky", arguments={"text": "x"})


@tool()
def hold(args: Note, ctx: ToolContext) -> str:
    """Holds its step until the test lets it go."""
    import time
    from pathlib import Path

    here = Path(__file__).parent
    (here / "held").touch()
    deadline = time.monotonic() + 120
    while not (here / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return "let go"


def holding(view: StepView):
    if view.messages:
        return Done(summary=view.last_result or "")
    return ToolCall(name="hold", arguments={"text": "x"})


holder = Agent(name="first_hour_holder", goal="hold", tools=[hold], policy=holding)
noted = Agent(name="first_hour_noted", goal="note", tools=[note], policy=policy, input=Note)


flaky_agent = Agent(
    name="first_hour_flaky",
    goal="try",
    tools=[flaky],
    policy=retrying,
    resources=lambda run: run.data,
)
'''


def a_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "first_hour_agent.py").write_text(AGENT_MODULE, encoding="utf-8")
    return project


def test_a_worker_that_cannot_load_an_agent_leaves_its_run_untouched(tmp_path):
    project = a_project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    started = ratchet_in(tmp_path, "start", "--agent", "first_hour_agent:agent", cwd=project)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()

    # When a worker started in another folder finds the run
    skipped = ratchet_in(tmp_path, "worker", "--until-idle", cwd=elsewhere)

    # Then it says which agent it cannot load and why, and ends non-zero; the run has no strike
    assert skipped.returncode == 1, skipped.stdout + skipped.stderr
    assert "cannot load agent 'first_hour_agent:agent'" in skipped.stdout
    assert "first_hour_agent" in skipped.stdout
    assert f"left runs whose agent this worker cannot load: {run_id}" in skipped.stderr
    state = json.loads(ratchet_in(tmp_path, "status", run_id, "--json").stdout)
    assert (state["status"], state["step"], state["attempts"]) == ("running", 0, 0)
    # And a worker that can load it does the run from its first attempt
    worked = ratchet_in(tmp_path, "worker", "--until-idle", cwd=project)
    assert worked.returncode == 0, worked.stderr
    state = json.loads(ratchet_in(tmp_path, "status", run_id, "--json").stdout)
    assert state["status"] == "done"


def test_a_run_worked_from_python_asks_its_person(tmp_path, monkeypatch):
    project = a_project(tmp_path)
    monkeypatch.syspath_prepend(str(project))
    client = ratchet.connect(f"sqlite:///{tmp_path}/ratchet.db", environ={})
    try:
        # When a script works a run to where it waits for a person
        run = client.run(
            run_id="asks",
            agent="first_hour_agent:asker",
            notify={"email": ["dana@example.com"]},
        )
        # Then the request is open and dana has the message, as a worker would have done
        assert run.status is RunStatus.WAITING
        runtime = client.runtime
        assert isinstance(runtime, LocalRuntime)
        [request] = runtime.approvals.of_run("asks")
        assert request.status.value == "pending"
        [message] = runtime.outbox.messages()
        assert "May I refund?" in json.dumps(message)
        assert "dana@example.com" in json.dumps(message)
    finally:
        client.close()


def test_a_failed_attempt_is_said_as_it_happens(tmp_path):
    project = a_project(tmp_path)

    done = ratchet_in(
        tmp_path, "run", "--agent", "first_hour_agent:flaky_agent", "--run-id", "r", cwd=project
    )

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    failed = next(i for i, line in enumerate(lines) if "attempt 1 of step 1 failed" in line)
    stepped = next(i for i, line in enumerate(lines) if line.startswith("r  step 1"))
    # Said before the retry that took the step, with why and when the next attempt starts
    assert failed < stepped, lines
    assert re.fullmatch(
        r"r: attempt 1 of step 1 failed: .*the service is down.*; next in \d+ s", lines[failed]
    ), lines[failed]


def test_links_point_where_a_serve_of_the_store_listens(tmp_path):
    project = a_project(tmp_path)
    cli = Cli(tmp_path)
    log = tmp_path / "serve.log"
    env = clean_env(PYTHONUNBUFFERED="1")
    env.pop("RATCHET_PUBLIC_URL", None)
    with serving(cli.argv("serve", "--port", "0", "--no-worker"), log=log, env=env) as served:
        assert not served.base.endswith(":8765")
        # When a run started elsewhere parks for a person
        parked = ratchet_in(
            tmp_path, "run", "--agent", "first_hour_agent:asker", "--run-id", "a", cwd=project
        )
    # Then its link is the serve's, not the default port's
    assert parked.returncode == 0, parked.stderr
    [link] = re.findall(r"Approve or reject at: (\S+)", parked.stdout)
    assert link.startswith(f"{served.base}/approvals/"), link
    assert not (tmp_path / "ratchet.serve").exists()  # gone with the serve


def test_a_mistyped_store_is_refused_and_a_start_names_its_store(tmp_path):
    nowhere = tmp_path / "nonexistent" / "dir" / "x.db"

    refused = subprocess.run(
        [*RATCHET, "--store", str(nowhere), "start", "--goal", "g"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    started = ratchet_in(tmp_path, "start", "--goal", "g", "--run-id", "s")

    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"no folder {nowhere.parent} for the store {nowhere}" in refused.stderr
    assert not (tmp_path / "nonexistent").exists()
    assert started.returncode == 0, started.stderr
    assert started.stdout == "s\n"
    assert f"run s started in store {tmp_path / 'ratchet.db'}" in started.stderr
    ran = ratchet_in(tmp_path, "run", "--goal", "g", "--run-id", "t")
    assert ran.returncode == 0, ran.stderr
    assert f"(the run is in store {tmp_path / 'ratchet.db'})" in ran.stdout.splitlines()


def interrupted_in_its_step(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`ratchet ARGS`, sent SIGINT (Ctrl-C) once its step is under way, to its end."""
    project = tmp_path / "project"
    process = subprocess.Popen(
        [*RATCHET, "--store", f"sqlite:///{tmp_path / 'ratchet.db'}", *args],
        cwd=project,
        env=clean_env(PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (project / "held").exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the step never began"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        (project / "go").touch()  # lets the abandoned tool's thread end
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_ctrl_c_in_run_says_where_the_run_stands_and_how_to_go_on(tmp_path):
    a_project(tmp_path)

    stopped = interrupted_in_its_step(
        tmp_path, "run", "--agent", "first_hour_agent:holder", "--run-id", "h"
    )

    assert stopped.returncode == 130, stopped.stderr
    assert "interrupted: h is running at step 0" in stopped.stderr
    assert "go on with: ratchet run --run-id h" in stopped.stderr


def test_a_worker_stopped_by_ctrl_c_says_so_and_exits_non_zero(tmp_path):
    project = a_project(tmp_path)
    started = ratchet_in(tmp_path, "start", "--agent", "first_hour_agent:holder", cwd=project)
    assert started.returncode == 0, started.stderr

    stopped = interrupted_in_its_step(tmp_path, "worker")

    assert stopped.returncode == 130, stopped.stderr
    assert "worker interrupted" in stopped.stderr


def test_a_worker_until_idle_leaves_a_run_a_live_worker_holds(tmp_path):
    project = a_project(tmp_path)
    started = ratchet_in(
        tmp_path, "start", "--agent", "first_hour_agent:holder", "--run-id", "held", cwd=project
    )
    assert started.returncode == 0, started.stderr
    live = subprocess.Popen(
        [*RATCHET, "--store", f"sqlite:///{tmp_path / 'ratchet.db'}", "worker"],
        cwd=project,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (project / "held").exists():
            assert live.poll() is None, "the live worker ended"
            assert time.monotonic() < deadline, "the live worker never began its step"
            time.sleep(0.05)

        # When another worker is asked to work until idle
        idle = ratchet_in(tmp_path, "worker", "--until-idle", cwd=project, timeout=60)
    finally:
        (project / "go").touch()
        live.send_signal(signal.SIGTERM)
        live.wait(timeout=60)

    # Then it ends (nothing is left that it could work) and says what it left to whom
    assert idle.returncode == 0, idle.stderr
    assert re.search(r"left held to worker \S+:\d+, which is working it", idle.stdout), idle.stdout


def test_a_model_call_still_retrying_says_so(tmp_path):
    with FakeMessagesApi() as api:
        api.enqueue(overloaded(retry_after_s=1), text_response("DONE: filed."))
        done = ratchet_in(
            tmp_path,
            *("run", "--goal", "g", "--model", PAID, "--run-id", "slow"),
            env=clean_env(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url),
        )

    assert done.returncode == 0, done.stderr
    [said] = [line for line in done.stdout.splitlines() if "still retrying" in line]
    assert said.startswith("model call failed ("), said
    assert "try 2 in 1 s" in said, said
    assert len(api.requests) == 2


def test_approve_and_reject_take_either_note_and_a_repeat_changes_nothing(tmp_path):
    project = a_project(tmp_path)
    for run_id in ("no", "yes"):
        parked = ratchet_in(
            tmp_path, "run", "--agent", "first_hour_agent:asker", "--run-id", run_id, cwd=project
        )
        assert parked.returncode == 0, parked.stderr

    rejected = ratchet_in(tmp_path, "reject", "no", "--comment", "too much", cwd=project)
    approved = ratchet_in(tmp_path, "approve", "yes", "--reason", "fine", cwd=project)
    again = ratchet_in(tmp_path, "approve", "yes", cwd=project)

    assert rejected.returncode == 0, rejected.stderr
    assert approved.returncode == 0, approved.stderr
    assert again.returncode == 2
    assert re.search(r"yes was already approved by \S+ at .*; nothing changed", again.stderr)
    notes = {
        run_id: [c.comment for c in history_of(tmp_path, run_id) if c.event == "decided"]
        for run_id in ("no", "yes")
    }
    assert notes == {"no": ["too much"], "yes": ["fine"]}


def history_of(root: Path, run_id: str) -> list[Any]:
    client = ratchet.connect(f"sqlite:///{root / 'ratchet.db'}", environ={})
    try:
        return list(client.history(run_id))
    finally:
        client.close()


def test_a_refused_input_field_names_the_flag_it_came_in(tmp_path):
    project = a_project(tmp_path)
    agent = "first_hour_agent:noted"

    in_input = ratchet_in(tmp_path, "start", "--agent", agent, "--input", "{}", cwd=project)
    in_param = ratchet_in(tmp_path, "start", "--agent", agent, "--param", "text=5", cwd=project)
    typed = ratchet_in(tmp_path, "start", "--agent", agent, "--input", '{"text": 5}', cwd=project)

    assert in_input.returncode == 2
    assert in_input.stderr.strip().endswith("(--input field text)"), in_input.stderr
    assert "--param" not in in_input.stderr
    assert typed.returncode == 2
    assert typed.stderr.strip().endswith("(--input field text)"), typed.stderr
    assert in_param.returncode == 2
    assert in_param.stderr.strip().endswith("(--param text)"), in_param.stderr


def test_an_idle_worker_says_it_waits_for_runs(tmp_path):
    log = tmp_path / "worker.log"
    with log.open("w") as output:
        worker = subprocess.Popen(
            [*RATCHET, "--store", f"sqlite:///{tmp_path / 'ratchet.db'}", "worker"],
            env=clean_env(PYTHONUNBUFFERED="1"),
            stdout=output,
            stderr=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 60
        while "no run to work; waiting for one" not in log.read_text():
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"the idle worker said nothing: {log.read_text()}"
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
