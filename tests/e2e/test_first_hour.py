"""The first hour of a new user (issue 36): what the README's commands do with the environment
a user has (a key set, a typo, Ctrl-C), each held by the real `ratchet` command or client."""

from __future__ import annotations

import subprocess
from pathlib import Path

import ratchet
from ratchet.state import RunStatus
from tests.integration.fake_messages_api import FakeMessagesApi, text_response
from tests.processes import RATCHET, clean_env

PAID = "claude-sonnet-4-6"


def ratchet_in(
    root: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The `ratchet` command on the store in `root`, to its end."""
    return subprocess.run(
        [*RATCHET, "--store", f"sqlite:///{root / 'ratchet.db'}", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        timeout=120,
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
