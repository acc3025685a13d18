"""Webhooks end to end: `ratchet hook` prints a URL and a secret, and the shell line of
docs/webhooks.md (openssl signs, curl posts) delivers the event to a run parked by a real
worker, through a real `ratchet serve`."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet.state import RunStatus
from ratchet.waiting.hooks import github_signature, verify_delivery
from tests.processes import Cli, clean_env, serving

PATIENCE = 30.0
SECRET = "a6e6f3de496e0f640f80c2b978ad1c545be081f559d2ca9401f56fbe0dd55537"
NOW = 1_767_225_600
DOCS = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"


def docs_line() -> str:
    """The copy-paste line of docs/webhooks.md: the one `sh` block that runs curl."""
    blocks = re.findall(r"```sh\n(.*?)```", DOCS.read_text(), re.DOTALL)
    lines = [b.strip() for b in blocks if "curl" in b]
    assert len(lines) == 1, lines
    return str(lines[0])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Cli, str]]:
    cli = Cli(tmp_path)
    cli.ok("start", "--agent", "tests.hooks_agent:agent", "--run-id", "r1")
    cli.work_until_idle()
    assert cli.head("r1").status is RunStatus.WAITING
    argv = cli.argv("serve", "--port", "0")
    with serving(argv, log=tmp_path / "serve.log", env=clean_env(PYTHONUNBUFFERED="1")) as served:
        yield cli, served.base


def hook(cli: Cli, base: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli.argv("hook", "r1", "ci-finished", *args),
        capture_output=True,
        text=True,
        env=clean_env(RATCHET_PUBLIC_URL=base),
        timeout=PATIENCE,
        check=False,
    )


def test_the_docs_line_delivers_a_signed_event_through_ratchet_serve(served):
    cli, base = served
    made = hook(cli, base, "--json")
    assert made.returncode == 0, made.stderr
    printed = json.loads(made.stdout)
    assert printed["url"].startswith(f"{base}/hooks/")
    sent = subprocess.run(
        ["bash", "-c", docs_line()],
        capture_output=True,
        text=True,
        env=clean_env(URL=printed["url"], SECRET=printed["secret"]),
        timeout=PATIENCE,
        check=False,
    )
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout)
    assert (answer["status"], answer["duplicate"], answer["step"]) == ("delivered", False, 1)
    assert cli.head("r1").status is RunStatus.RUNNING
    cli.work_until_idle()
    done = cli.head("r1")
    assert done.status is RunStatus.DONE
    assert '"conclusion": "success"' in (done.summary or "")


def test_the_line_ratchet_hook_prints_sends_a_signed_delivery(served):
    cli, base = served
    made = hook(cli, base)
    assert made.returncode == 0, made.stderr
    url = re.search(r"URL\s+(\S+)", made.stdout)
    assert url is not None
    assert url.group(1) == json.loads(hook(cli, base, "--json").stdout)["url"]
    line = made.stdout.strip().splitlines()[-1].strip()
    sent = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, timeout=PATIENCE, check=False
    )
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["status"] == "delivered"


def test_ratchet_hook_refuses_an_unknown_run_and_a_deployed_store(tmp_path):
    cli = Cli(tmp_path)
    cli.ok("start", "--agent", "tests.hooks_agent:agent", "--run-id", "r1")
    unknown = cli.run("hook", "nope", "ci-finished")
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr == "ratchet: no run with id 'nope' in this store\n"
    undeclared = cli.run("hook", "r1", "deploy-done")
    assert undeclared.returncode == 2
    assert "waits for no event named 'deploy-done'" in undeclared.stderr
    deployed = subprocess.run(
        [*cli.argv()[:-2], "--store", "dynamodb://t?ledger=l&app=a", "hook", "r1", "x"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=PATIENCE,
        check=False,
    )
    assert deployed.returncode == 2
    assert "needs a local sqlite:// store" in deployed.stderr
    assert not (tmp_path / "ratchet.hook-key").exists()  # a refused hook makes no key


def test_the_docs_recipe_signs_the_bytes_it_sends_as_github_does():
    """docs/webhooks.md's line: `printf '%s' "$body" | openssl dgst -sha256 -hmac "$SECRET"`
    is the HMAC of the body's exact bytes under the secret's text, and `--data-binary "$body"`
    sends those bytes (the first test runs the whole line against `ratchet serve`)."""
    line = docs_line()
    body = re.search(r"body='([^']*)'", line)
    signing = re.search(r"sig=\$\((.*?)\);", line)
    assert body is not None
    assert signing is not None
    assert '--data-binary "$body"' in line
    assert '-H "X-Hub-Signature-256: sha256=$sig"' in line
    sent = body.group(1).encode()
    sig = subprocess.run(
        ["bash", "-c", f"body='{body.group(1)}'; {signing.group(1)}"],
        capture_output=True,
        text=True,
        env=clean_env(SECRET=SECRET),
        check=True,
    ).stdout.strip()
    assert f"sha256={sig}" == github_signature(SECRET, sent)
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Delivery": "d-1",
        "X-Hub-Signature-256": f"sha256={sig}",
    }
    assert verify_delivery(headers, sent, SECRET, now=NOW).payload == json.loads(sent)
