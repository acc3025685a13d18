"""`ratchet serve` does what it says (issue 20): a worker in the same process works the runs
(`--no-worker` leaves them, and says what to run), the links it makes point where it listens,
the project's own agents start through its runs API, and bound beyond this machine its runs
API takes a bearer token while the signed approval links and webhooks stay open."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
from contextlib import AbstractContextManager
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus
from tests.processes import Cli, Served, clean_env, serving

pytestmark = pytest.mark.slow

PATIENCE = 60.0
"""How long a test waits for what takes a second or two when it works."""
OPERATOR = "ada"

GREETER = '''
from pydantic import BaseModel

from ratchet.tools import Agent, Done, StepView, ToolCall, ToolContext, tool


class Greeting(BaseModel):
    name: str


@tool(side_effect=True)
def greet(args: Greeting, ctx: ToolContext) -> str:
    """Greet someone, once per key."""
    return f"hello {args.name}"


def scripted(view: StepView) -> ToolCall | Done:
    if not view.messages:
        return ToolCall(name="greet", arguments={"name": "ada"})
    return Done(summary="greeted ada")


agent = Agent(name="greeter", goal="Greet ada.", tools=[greet], policy=scripted)
'''


def _env(**extra: str) -> dict[str, str]:
    env = clean_env(PYTHONUNBUFFERED="1", LOGNAME=OPERATOR, USER=OPERATOR, **extra)
    if "RATCHET_PUBLIC_URL" not in extra:
        env.pop("RATCHET_PUBLIC_URL", None)
    return env


def ratchet_serve(
    cli: Cli, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> AbstractContextManager[Served]:
    return serving(
        cli.argv("serve", *args),
        log=cli.root / f"serve-{time.monotonic_ns()}.log",
        env=env or _env(),
        cwd=cwd or cli.root,
    )


def request(
    url: str, *, data: Any = None, token: str | None = None, form: str | None = None
) -> tuple[int, Message, str]:
    headers = {}
    body = None
    if data is not None:
        body, headers["Content-Type"] = json.dumps(data).encode(), "application/json"
    if form is not None:
        body, headers["Content-Type"] = form.encode(), "application/x-www-form-urlencoded"
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    asked = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(asked, timeout=PATIENCE) as answer:
            return answer.status, answer.headers, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers, refused.read().decode()


def until_status(cli: Cli, run_id: str, wanted: RunStatus) -> None:
    deadline = time.monotonic() + PATIENCE
    while (status := _status(cli, run_id)) is not wanted:
        assert time.monotonic() < deadline, f"{run_id} is {status}, never {wanted.value}"
        time.sleep(0.1)


def _status(cli: Cli, run_id: str) -> RunStatus | None:
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        head = runtime.store.load_head(run_id)
    finally:
        runtime.close()
    return head.status if head is not None else None


def outbox_link(cli: Cli, run_id: str) -> str:
    deadline = time.monotonic() + PATIENCE
    outbox = cli.root / "ratchet.outbox"
    while not (found := sorted(outbox.glob(f"{run_id}-step-*.json"))):
        assert time.monotonic() < deadline, f"no approval email for {run_id}"
        time.sleep(0.1)
    link = json.loads(found[-1].read_text(encoding="utf-8"))["link"]
    assert isinstance(link, str)
    return link


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


# --- the worker beside the server ----------------------------------------------------------------


def test_a_run_started_through_serve_is_worked_to_done_with_no_other_command(tmp_path):
    cli = Cli(tmp_path)
    with ratchet_serve(cli, "--port", "0") as served:
        assert re.search(r"^A worker \(\S+\) works the runs in this process", served.printed, re.M)

        # When a program starts a run through the runs API, and nothing else runs
        status, _, body = request(
            f"{served.base}/runs", data={"goal": "file a note", "run_id": "n1"}
        )
        assert status == 201, body

        # Then serve's own worker takes it to its end
        until_status(cli, "n1", RunStatus.DONE)

        # And SIGTERM ends the server and its worker, at once and cleanly
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=PATIENCE) == 0
    assert "Traceback" not in served.printed


def test_sigterm_mid_step_ends_serve_within_its_bound_and_the_run_goes_on_elsewhere(tmp_path):
    cli = Cli(tmp_path)
    # Given a run whose one tool call takes 20 s, which serve's worker is in the middle of
    cli.ok("start", "--goal", "file a note", "--run-id", "slow", "--tool-latency-ms", "20000")
    with ratchet_serve(cli, "--port", "0") as served:
        deadline = time.monotonic() + PATIENCE
        while '"message":"run claimed"' not in served.printed:
            assert time.monotonic() < deadline, served.printed
            time.sleep(0.05)

        # When serve is told to stop
        stopping = time.monotonic()
        served.process.send_signal(signal.SIGTERM)

        # Then it stops within its bound (10 s for the step), saying the step was cut short,
        # and no process of it is left: the worker was a thread of it
        assert served.process.wait(timeout=PATIENCE) == 0
        assert time.monotonic() - stopping < 20
        assert "A step was still running: its lease lapses" in served.printed
    # And the next worker resumes the run once that lease lapses
    assert _status(cli, "slow") is RunStatus.RUNNING
    cli.work_until_idle()
    assert _status(cli, "slow") is RunStatus.DONE


def test_approving_on_the_page_is_worked_on_at_once(tmp_path):
    cli = Cli(tmp_path)
    with ratchet_serve(cli, "--port", "0") as served:
        # Given a migration started by the CLI, which serve's worker parks for a person
        cli.ok("start", "--scenario", "migration", "--param", "batches=2", "--run-id", "m1")
        link = outbox_link(cli, "m1")
        assert link.startswith(f"{served.base}/approvals/")
        until_status(cli, "m1", RunStatus.WAITING)
        assert "m1 waits for a person; approve or reject at: " in served.printed

        # When the person approves on the page
        status, _, page = request(link, form="decision=approve&comment=")
        assert status == 200, page
        assert "The run resumes with your answer." in page

        # Then the run is done, with nothing else run
        until_status(cli, "m1", RunStatus.DONE)
    assert cli.verify("m1")["legacy_dropped"] is True


def test_with_no_worker_the_page_and_the_banner_say_to_run_ratchet_worker(tmp_path):
    cli = Cli(tmp_path)
    cli.ok("run", "--scenario", "migration", "--param", "batches=2", "--run-id", "m2")
    assert _status(cli, "m2") is RunStatus.WAITING
    with ratchet_serve(cli, "--port", "0", "--no-worker") as served:
        worker = f"ratchet worker --store {cli.store}"
        assert f"No worker here (--no-worker): run `{worker}` for runs" in served.printed
        assert "A worker" not in served.printed
        link = outbox_link(cli, "m2")
        path = urlsplit(link)
        status, _, page = request(
            f"{served.base}{path.path}?{path.query}", form="decision=approve&comment="
        )
        assert status == 200, page
        assert "run `ratchet worker` and the run resumes with your answer" in page
        # Nothing in serve works it: the run waits for a worker, which finishes it
        assert _status(cli, "m2") is RunStatus.RUNNING
        cli.work_until_idle()
    assert _status(cli, "m2") is RunStatus.DONE


# --- where the links point ---------------------------------------------------------------------


def test_links_point_at_the_port_served_when_no_public_url_is_set(tmp_path):
    cli = Cli(tmp_path)
    port = free_port()
    with ratchet_serve(cli, "--port", str(port)) as served:
        assert served.base == f"http://127.0.0.1:{port}"
        assert f"Approval links point at http://127.0.0.1:{port} (set RATCHET_PUBLIC_URL" in (
            served.printed
        )
        assert "8765" not in served.printed
        cli.ok("start", "--scenario", "migration", "--param", "batches=2", "--run-id", "p1")
        link = outbox_link(cli, "p1")
        assert link.startswith(f"http://127.0.0.1:{port}/approvals/")
        status, _, page = request(link)
        assert status == 200, page


def test_a_public_url_set_is_where_the_links_point(tmp_path):
    cli = Cli(tmp_path)
    env = _env(RATCHET_PUBLIC_URL="https://tunnel.example.com/ratchet")
    with ratchet_serve(cli, "--port", "0", env=env) as served:
        assert (
            "Approval links point at https://tunnel.example.com/ratchet (RATCHET_PUBLIC_URL"
            in served.printed
        )
        cli.ok("start", "--scenario", "migration", "--param", "batches=2", "--run-id", "p2")
        assert outbox_link(cli, "p2").startswith("https://tunnel.example.com/ratchet/approvals/")


# --- the project's agents ----------------------------------------------------------------------


def _project(root: Path) -> Path:
    project = root / "acme"
    package = project / "src" / "acme_agents"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "greeter.py").write_text(textwrap.dedent(GREETER))
    (project / "hello.py").write_text(textwrap.dedent(GREETER))
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [project]
            name = "acme"
            version = "0.1.0"

            [tool.ratchet]
            agents = { greeter = "acme_agents.greeter:agent" }
            source = "src"
            """
        )
    )
    return project


def test_the_projects_agents_and_those_named_on_the_command_line_start(tmp_path):
    cli = Cli(tmp_path)
    project = _project(tmp_path)
    with ratchet_serve(cli, "--port", "0", "--agent", "hi=hello:agent", cwd=project) as served:
        assert "starts these agents: greeter, hi, migration, notebook" in served.printed
        # The project's agent by the name its [tool.ratchet] table gives it
        status, _, body = request(f"{served.base}/runs", data={"agent": "greeter", "run_id": "g1"})
        assert status == 201, body
        # One named with --agent
        status, _, body = request(f"{served.base}/runs", data={"agent": "hi", "run_id": "g2"})
        assert status == 201, body
        until_status(cli, "g1", RunStatus.DONE)
        until_status(cli, "g2", RunStatus.DONE)
        # And a name nobody registered is still refused, naming those that are
        status, _, body = request(f"{served.base}/runs", data={"agent": "nobody", "run_id": "g3"})
        assert status == 400, body
        assert "use one of greeter, hi, migration, notebook" in body
        # A request never imports a module nobody registered
        status, _, body = request(
            f"{served.base}/runs", data={"agent": "acme_agents.other:agent", "run_id": "g4"}
        )
        assert status == 400, body
    runtime = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        head = runtime.store.load_head("g1")
    finally:
        runtime.close()
    assert head is not None
    assert head.agent == "acme_agents.greeter:agent"


def test_a_bad_agent_flag_is_refused_before_anything_listens(tmp_path):
    cli = Cli(tmp_path)
    done = subprocess.run(
        cli.argv("serve", "--port", "0", "--agent", "migration=hello:agent"),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        check=False,
    )
    assert done.returncode == 2, done
    assert "--agent: 'migration' is a built-in scenario's name" in done.stderr
    assert "Serving" not in done.stdout


# --- off this machine: a bearer token ----------------------------------------------------------


def _can_bind(host: str) -> bool:
    try:
        with socket.socket() as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True


def test_off_loopback_the_runs_api_takes_a_token_and_signed_links_need_none(tmp_path):
    if not _can_bind("127.0.0.2"):
        pytest.skip("127.0.0.2 cannot be bound here")
    cli = Cli(tmp_path)
    # Given a run parked for a person before the server starts, and its signed link
    cli.ok("run", "--scenario", "migration", "--param", "batches=2", "--run-id", "t1")
    link = urlsplit(outbox_link(cli, "t1"))
    token_file = tmp_path / "ratchet.serve-token"

    with ratchet_serve(cli, "--host", "127.0.0.2", "--port", "0") as served:
        assert served.base.startswith("http://127.0.0.2:")
        assert "Warning: 127.0.0.2 is reachable from the network" in served.printed
        assert f"The token is in {token_file}" in served.printed
        token = token_file.read_text().strip()
        assert len(token) >= 40
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600

        # When a program starts a run with no token, or a wrong one
        run = {"goal": "file a note", "run_id": "t2"}
        for wrong in (None, "not-the-token", token[:-1]):
            status, headers, body = request(f"{served.base}/runs", data=run, token=wrong)
            # Then it is refused, saying how to authenticate, and nothing is created
            assert status == 401, body
            assert headers["WWW-Authenticate"].startswith("Bearer")
            assert "Authorization: Bearer" in json.loads(body)["error"]
        assert _status(cli, "t2") is None
        for path in ("/runs", "/runs/t1", "/schedules", "/dashboard"):
            assert request(f"{served.base}{path}")[0] == 401, path

        # And with the token it is started (and worked)
        status, _, body = request(f"{served.base}/runs", data=run, token=token)
        assert status == 201, body
        assert request(f"{served.base}/dashboard", token=token)[0] == 200

        # And the signed approval link works with no token, GET showing and POST deciding
        page = f"{served.base}{link.path}?{link.query}"
        status, _, body = request(page)
        assert status == 200, body
        assert _status(cli, "t1") is RunStatus.WAITING
        status, _, body = request(page, form="decision=approve&comment=")
        assert status == 200, body
        until_status(cli, "t1", RunStatus.DONE)
        until_status(cli, "t2", RunStatus.DONE)
    # Nothing it printed or logged, requests and all, holds the token
    assert token not in served.printed

    # And the next start takes the same token from the same file
    with ratchet_serve(cli, "--host", "127.0.0.2", "--port", "0") as again:
        assert token_file.read_text().strip() == token
        status, _, body = request(f"{again.base}/runs/t2", token=token)
        assert status == 200, body


def test_on_loopback_the_runs_api_takes_no_token(tmp_path):
    cli = Cli(tmp_path)
    with ratchet_serve(cli, "--port", "0") as served:
        assert "Warning" not in served.printed
        assert request(f"{served.base}/runs")[0] == 200
    assert not (tmp_path / "ratchet.serve-token").exists()


def test_a_token_file_others_can_read_is_refused(tmp_path):
    if not _can_bind("127.0.0.2"):
        pytest.skip("127.0.0.2 cannot be bound here")
    cli = Cli(tmp_path)
    cli.ok("start", "--goal", "file a note", "--run-id", "x")
    token_file = tmp_path / "ratchet.serve-token"
    token_file.write_text("shared-token-shared-token-shared-token-0000")
    os.chmod(token_file, 0o644)
    done = subprocess.run(
        cli.argv("serve", "--host", "127.0.0.2", "--port", "0"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        check=False,
    )
    assert done.returncode == 2, done
    assert f"{token_file} may be read by others: chmod 600 it" in done.stderr
