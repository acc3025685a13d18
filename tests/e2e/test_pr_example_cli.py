"""The pull-request example of docs/waits.md (once the README's), command by command, as a
reader types it: real `ratchet` processes, a real `ratchet serve` taking CI's signed webhook
delivery (the curl line `ratchet hook` prints), and a person's approval. It ends merged, once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus, WaitSettled
from tests.processes import clean_env

REPO = Path(__file__).resolve().parents[2]
WAITS = REPO / "docs" / "waits.md"
PATIENCE = 60.0


def example_commands() -> list[str]:
    """The lines of the doc's `sh` block that runs the example, comments cut off."""
    blocks = re.findall(r"```sh\n(.*?)```", WAITS.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if "pr_agent.agent:agent" in b]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_pull_request_example_runs_as_printed(tmp_path):
    store = f"sqlite:///{tmp_path / 'ratchet.db'}"
    env = clean_env(RATCHET_STORE=store, PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    serve: subprocess.Popen[str] | None = None
    printed = ""
    try:
        for command in example_commands():
            if command.startswith("export "):
                name, _, value = command.removeprefix("export ").partition("=")
                env[name] = str(REPO / value)
                continue
            if command == "ratchet serve --no-worker &":
                serve, base = _serve(env, tmp_path)
                env["RATCHET_PUBLIC_URL"] = base
                continue
            if command.startswith("# run the curl line"):
                line = printed.strip().splitlines()[-1].strip()
                assert line.startswith("body="), printed
                command = line
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=PATIENCE,
                check=False,
            )
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            printed = done.stdout
        assert "done" in printed
    finally:
        if serve is not None:
            serve.kill()
            serve.wait(timeout=PATIENCE)
    runtime = LocalRuntime.open(LocalSettings(store=store), create=False)
    try:
        head = runtime.store.load_head("pr-1")
        assert head is not None
        assert head.status is RunStatus.DONE
        assert head.summary == "Merged pull request #101."
        settled = [
            (c.event.how, c.event.event_id)
            for c in runtime.store.list_checkpoints("pr-1")
            if isinstance(c.event, WaitSettled)
        ]
        assert [how for how, _ in settled] == ["event", "woken", "event"]
        assert settled[0][1] == "ci-1"
        sources = {e.event_id: e.source for e in runtime.mailbox.of_run("pr-1")}
        assert sources.pop("ci-1") == "cli"
        assert list(sources.values()) == ["webhook"]
        keys = [k for (k,) in runtime.db.connection.execute("SELECT key FROM run_data")]
        assert len([k for k in keys if k.startswith("merges/")]) == 1
    finally:
        runtime.close()


def _serve(env: dict[str, str], root: Path) -> tuple[subprocess.Popen[str], str]:
    log = root / "serve.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            ["ratchet", "serve", "--port", "0", "--no-worker"],
            cwd=root,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    deadline = time.monotonic() + PATIENCE
    while not (found := re.search(r"Serving approvals on (http://\S+)", log.read_text())):
        assert process.poll() is None, f"ratchet serve exited:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"ratchet serve never listened:\n{log.read_text()}"
        time.sleep(0.05)
    return process, found.group(1)
