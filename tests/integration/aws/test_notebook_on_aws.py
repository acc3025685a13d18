"""The default agent of a goal-only run on AWS keeps its notes in the app table, so a step
retried in a new container writes its note once.

DynamoDB is moto in server mode on loopback; each invocation of the step Lambda is a fresh
Python process (a new container: nothing in memory or on /tmp carries over) running the real
handler against it. The first is killed by `RATCHET_FAULT` after the tool wrote the note and
before the commit, as a container that dies there would be; the next ones retry the step and
go on to done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flask", reason="moto's server mode needs moto[server] (flask, flask-cors)")


from ratchet.adapters.dynamodb.data import DynamoDbRunData
from ratchet.runs import RunRequest, new_run
from ratchet.runtime.aws import AwsRuntime
from ratchet.runtime.aws_settings import ENVIRONMENT
from ratchet.scenarios.notebook import NOTES, note_key
from ratchet.state import RunStatus, StepCompleted
from tests.dynamodb_support import REGION, SETTINGS, make_tables, moto_server, server_client
from tests.support import LOG

RATCHET = Path(sys.executable).with_name("ratchet")
TIMEOUT = 120
GOAL = "Summarise the quarter's incidents for the team."
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
SCRUBBED_PREFIXES = ("AWS_", "RATCHET_", "ANTHROPIC_", "POWERTOOLS_")
RESULT = "STEP-RESULT "

# A new container: import the handler, invoke it once with a Lambda-shaped context, print the
# payload it returns (the handlers log to stdout too, so the payload is marked).
INVOKE_STEP = f"""
import json, sys, uuid
from dataclasses import dataclass, field
from ratchet.handlers import step

@dataclass(frozen=True)
class Context:
    function_name: str = "ratchet-step"
    invoked_function_arn: str = "arn:aws:lambda:{REGION}:123456789012:function:ratchet-step"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 1024

    def get_remaining_time_in_millis(self) -> int:
        return 900_000

print({RESULT!r} + json.dumps(step.handler({{"run_id": sys.argv[1]}}, Context())), flush=True)
"""


@dataclass
class Deployed:
    endpoint: str
    client: Any
    runtime: AwsRuntime

    def environment(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
        return env | FAKE_CREDENTIALS | {"AWS_ENDPOINT_URL": self.endpoint} | extra

    def invoke_step(
        self, run_id: str, *, fault: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The step Lambda, invoked once in a container of its own."""
        settings = {
            ENVIRONMENT["checkpoints_table"]: SETTINGS.checkpoints_table,
            ENVIRONMENT["idempotency_table"]: SETTINGS.idempotency_table,
            ENVIRONMENT["app_table"]: SETTINGS.app_table,
            "POWERTOOLS_TRACE_DISABLED": "true",
        }
        if fault:
            settings["RATCHET_FAULT"] = fault
        return subprocess.run(
            [sys.executable, "-c", INVOKE_STEP, run_id],
            env=self.environment(**settings),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def url(self) -> str:
        return (
            f"dynamodb://{SETTINGS.checkpoints_table}?ledger={SETTINGS.idempotency_table}"
            f"&app={SETTINGS.app_table}&region={REGION}&endpoint={self.endpoint}"
        )

    def ratchet(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(RATCHET), "--store", self.url(), *args],
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployed]:
    with moto_server() as endpoint:
        client = server_client(endpoint)
        make_tables(client)
        yield Deployed(endpoint, client, AwsRuntime(SETTINGS, client))


def start_goal_only_run(deployed: Deployed, run_id: str) -> None:
    """As the API starts a run given a goal only: no scenario, no agent."""
    state = new_run(RunRequest(goal=GOAL, run_id=run_id), has_anthropic_key=False)
    assert state.agent == "notebook"  # which has no `prepare` hook to run first
    assert deployed.runtime.engine(worker_id="api", logger=LOG).start(state)


def result_of(invoked: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert invoked.returncode == 0, (invoked.returncode, invoked.stdout, invoked.stderr)
    (line,) = [line for line in invoked.stdout.splitlines() if line.startswith(RESULT)]
    payload: dict[str, Any] = json.loads(line.removeprefix(RESULT))
    return payload


@pytest.mark.parametrize("point", ["after_tool", "before_commit"])
def test_a_step_retried_in_a_new_container_writes_its_note_once(deployed, point):
    run_id = f"goal-{point.replace('_', '-')}"
    start_goal_only_run(deployed, run_id)
    data = DynamoDbRunData(deployed.client, SETTINGS.app_table, run_id)

    # Given a container killed after the note was written, before the step was committed
    killed = deployed.invoke_step(run_id, fault=f"kill:{point}@1")
    assert killed.returncode == -9, (killed.returncode, killed.stdout, killed.stderr)
    head = deployed.runtime.store.load_head(run_id)
    assert head is not None
    assert (head.step, head.attempts) == (0, 1), "the killed attempt committed its step"
    assert [key for key, _ in data.items(NOTES)] == [note_key(1)]

    # When fresh containers take the steps until the run is done
    outcomes = []
    for _ in range(5):
        outcomes.append(result_of(deployed.invoke_step(run_id))["outcome"])
        if outcomes[-1] != "continue":
            break

    # Then the retried step found its note and wrote nothing: one note, the goal (the step
    # and the one reporting done in one invocation)
    assert outcomes == ["done"]
    head = deployed.runtime.store.load_head(run_id)
    assert head is not None
    assert head.status is RunStatus.DONE
    (note,) = data.items(NOTES)
    assert note == (note_key(1), json.dumps({"title": "Goal", "body": GOAL}))
    steps = [
        c.event
        for c in deployed.runtime.store.list_checkpoints(run_id)
        if isinstance(c.event, StepCompleted)
    ]
    assert [(s.step, s.attempt, s.output.text) for s in steps] == [
        (1, 2, "Note 'Goal' was already written.")
    ]

    verified = deployed.ratchet("verify", run_id, "--json")
    assert verified.returncode == 0, (verified.stdout, verified.stderr)
    assert json.loads(verified.stdout) == {
        "run_id": run_id,
        "ok": True,
        "status": "done",
        "notes": 1,
    }


def test_a_goal_only_run_without_crashes_writes_one_note(deployed):
    run_id = "goal-clean"
    start_goal_only_run(deployed, run_id)

    # Its two steps (the note, then done) in one invocation; another finds it done.
    outcomes = [result_of(deployed.invoke_step(run_id))["outcome"] for _ in range(2)]

    assert outcomes == ["done", "done"]
    data = DynamoDbRunData(deployed.client, SETTINGS.app_table, run_id)
    assert [key for key, _ in data.items()] == [note_key(1)]
    (step,) = [
        c.event
        for c in deployed.runtime.store.list_checkpoints(run_id)
        if isinstance(c.event, StepCompleted)
    ]
    assert (step.attempt, step.output.text) == (1, "Note 'Goal' written.")
