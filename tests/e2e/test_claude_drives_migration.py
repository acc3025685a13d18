"""`--model <claude model>` wires the real Anthropic SDK into real worker processes: a local
Messages API server plays Claude, a worker is SIGKILLed after a tool call, and the resumed step
does not ask the model again."""

from __future__ import annotations

import signal
import subprocess

from ratchet.engine.prompt import step_prompt_template
from ratchet.state import RunStatus
from tests.integration.fake_messages_api import FakeMessagesApi, text_response, tool_use_response
from tests.processes import Cli, clean_env


def test_claude_drives_the_migration_through_a_crash_and_an_approval(tmp_path):
    cli = Cli(tmp_path)
    with FakeMessagesApi() as claude:
        env = clean_env(ANTHROPIC_API_KEY="sk-test-not-a-secret", ANTHROPIC_BASE_URL=claude.url)

        def ratchet(*args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
            extra = {"RATCHET_FAULT": fault} if fault else {}
            return subprocess.run(
                cli.argv(*args), capture_output=True, text=True, env={**env, **extra}, timeout=60
            )

        started = ratchet(
            "start", "--scenario", "migration", "--run-id", "m", "--batches", "2",
            "--model", "claude-test-model",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        claude.enqueue(
            tool_use_response("inspect_table", {"table": "legacy_orders"}),
            tool_use_response("copy_batch", {"batch": 1}, preamble="Copying batch 1."),
            tool_use_response("copy_batch", {"batch": 2}),
            tool_use_response(
                "request_approval", {"action": "Drop legacy_orders", "reason": "all copied"}
            ),
        )

        # Worker A dies right after step 3's tool call; worker B picks the step up.
        killed = ratchet(
            "worker", "--until-idle", "--lease-seconds", "0.3", fault="kill:after_tool@3"
        )
        assert killed.returncode == -signal.SIGKILL
        resumed = ratchet("worker", "--until-idle", "--lease-seconds", "0.3")
        assert resumed.returncode == 0, resumed.stderr
        assert cli.head("m").status is RunStatus.WAITING

        assert ratchet("approve", "m", "--by", "dana").returncode == 0
        claude.enqueue(
            tool_use_response("drop_table", {"table": "legacy_orders"}),
            tool_use_response(
                "send_email",
                {"to": "data-team@example.com", "subject": "Done", "body": "2,000 rows copied."},
            ),
            text_response("DONE: copied 2,000 rows, dropped legacy_orders, emailed the team."),
        )
        finished = ratchet("worker", "--until-idle", "--lease-seconds", "0.3")
        assert finished.returncode == 0, finished.stderr
        requests = claude.requests

    head = cli.head("m")
    assert head.status is RunStatus.DONE
    assert head.summary == "copied 2,000 rows, dropped legacy_orders, emailed the team."
    assert len(requests) == 7, "one model call per decision: the crashed step reused its own"
    report = cli.verify("m")
    assert report["ok"] is True
    assert (report["target_rows"], report["duplicate_rows"], report["emails_sent"]) == (2000, 0, 1)

    body = requests[3].body
    assert body is not None
    assert body["model"] == "claude-test-model"
    assert [t["name"] for t in body["tools"]] == [
        "inspect_table", "copy_batch", "request_approval", "drop_table", "send_email",
        "remember",  # the runtime's own: pins a fact into every later prompt
        "sleep",  # the runtime's own: parks the run for a while
    ]  # fmt: skip
    prompt = body["messages"][0]["content"]
    head_of_template = step_prompt_template().split("<goal>")[0]
    assert prompt.startswith(head_of_template)
    assert '3. copy_batch {"batch": 2} -> Copied 1,000 rows (ids 1,001-2,000) in batch 2.' in prompt
    assert "sk-test-not-a-secret" not in (tmp_path / "ratchet.db").read_bytes().decode("latin-1")
