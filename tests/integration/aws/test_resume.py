"""`resume` on the stack: a run left `running` by an execution that ended on a bundle without
its agent (docs/deploy.md) goes on in its next execution, started by `Client.resume` or
`ratchet resume`, not by hand."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from ratchet.adapters.stepfunctions import execution_name
from ratchet.agents import AgentRegistry
from ratchet.cli.app import main
from ratchet.client import Client, Resumed
from ratchet.errors import AgentNotFound, NotResumable
from ratchet.handlers import _wiring
from ratchet.state import RunStatus
from tests.integration.aws import agents
from tests.integration.aws.harness import APP_TABLE, REGION, TABLES, Stack

ROWS = 3


def _stalled(stack: Stack, run_id: str) -> None:
    """A run whose execution ended `AgentUnloadable` at its first step, as a deployment whose
    bundle lacks the agent's module leaves it (the setup of test_state_machine.py's
    test_a_bundle_that_cannot_load_the_agent_leaves_its_run_untouched)."""
    held = stack.hold("ratchet-step")
    _, started = stack.post_run(
        {"agent": "tests.integration.aws.agents:rows", "run_id": run_id, "input": {"batches": ROWS}}
    )
    held.wait_entered()

    def unloadable(self: Any, reference: str) -> Any:
        raise AgentNotFound(f"cannot import {reference}: No module named 'my_agents'")

    with pytest.MonkeyPatch.context() as bundle_without_the_agent:
        bundle_without_the_agent.setattr(AgentRegistry, "load", unloadable)
        held.release()
        ended = stack.finished(started["execution_name"], timeout=30)
    assert (ended["status"], ended["error"]) == ("FAILED", "AgentUnloadable")
    assert stack.head(run_id).status is RunStatus.RUNNING


def _store(stack: Stack, *, machine: bool = True) -> str:
    url = (
        f"dynamodb://{TABLES['checkpoints']}?ledger={TABLES['idempotency']}&app={APP_TABLE}"
        f"&region={REGION}"
    )
    return f"{url}&machine={stack.state_machine_arn}" if machine else url


@dataclass(frozen=True)
class Said:
    code: int
    line: str
    """The last line the command printed (on stdout, or on stderr when it refused)."""


def _ratchet(
    capfd: pytest.CaptureFixture[str], stack: Stack, *args: str, machine: bool = True
) -> Said:
    capfd.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(["--store", _store(stack, machine=machine), *args])
    printed = capfd.readouterr()
    code = ended.value.code if isinstance(ended.value.code, int) else 0
    # The stack's functions log to stdout in this process; the command's answer is its last line.
    lines = (printed.out if code == 0 else printed.err).splitlines()
    return Said(code, lines[-1] if lines else "")


def test_resume_starts_the_next_execution_and_the_run_goes_on_to_its_end(stack: Stack):
    # Given a run left running by an execution that could not load its agent
    _stalled(stack, "stalled-1")

    # When a bundle with the agent is deployed and the run resumed from Python
    client = Client(_wiring.runtime(), agents=_wiring.agents())
    resumed = client.resume("stalled-1")

    # Then its next generation works it, from where it was left, to its end
    assert resumed == Resumed(
        run_id="stalled-1", execution=execution_name("stalled-1", 1), started=True
    )
    assert stack.finished(execution_name("stalled-1", 1))["status"] == "SUCCEEDED"
    assert stack.head("stalled-1").status is RunStatus.DONE
    # each step committed once, by the records and by the world
    steps = Counter(c.step for c in client.history("stalled-1") if c.event == "step")
    print(f"steps committed: {dict(steps)}")
    assert steps == Counter(range(1, ROWS + 1))
    assert set(agents.WORLD.deliveries_of("stalled-1").values()) == {1}
    assert len(agents.WORLD.deliveries_of("stalled-1")) == ROWS


def test_a_second_resume_while_the_next_execution_runs_is_refused_naming_it(
    stack: Stack, capfd: pytest.CaptureFixture[str]
):
    _stalled(stack, "stalled-2")
    held = stack.hold("ratchet-step")

    # When it is resumed from the command line, and again while its new execution runs
    first = _ratchet(capfd, stack, "resume", "stalled-2")
    held.wait_entered()
    second = _ratchet(capfd, stack, "resume", "stalled-2")
    held.release()

    # Then the first starts the next generation and the second is refused, naming it
    assert first == Said(0, f"stalled-2: started execution {execution_name('stalled-2', 1)}")
    assert second == Said(
        2,
        f"ratchet: run 'stalled-2' is worked by its running execution "
        f"{execution_name('stalled-2', 1)}: there is nothing to resume",
    )
    assert stack.finished(execution_name("stalled-2", 1))["status"] == "SUCCEEDED"
    assert [e["name"] for e in stack.executions()] == [
        execution_name("stalled-2", 0),
        execution_name("stalled-2", 1),
    ]

    # And a run that is done is refused too
    done = _ratchet(capfd, stack, "resume", "stalled-2")
    assert done == Said(2, "ratchet: run 'stalled-2' is done: there is nothing to resume")


def test_resume_refuses_a_store_url_without_the_state_machine_and_a_missing_run(
    stack: Stack, capfd: pytest.CaptureFixture[str]
):
    _stalled(stack, "stalled-3")

    unnamed = _ratchet(capfd, stack, "resume", "stalled-3", machine=False)
    missing = _ratchet(capfd, stack, "resume", "nobody")

    assert unnamed.code == 2
    assert "this store URL does not name: add &machine= with the stack's" in unnamed.line
    assert missing.code == 2
    assert "nobody" in missing.line, missing
    assert stack.head("stalled-3").status is RunStatus.RUNNING
    assert len(stack.executions()) == 1


def test_resume_refuses_a_failed_run_pointing_to_retry(stack: Stack):
    client = Client(_wiring.runtime(), agents=_wiring.agents())
    _, started = stack.post_run(
        {"agent": "tests.integration.aws.agents:failing", "run_id": "resume-failed"}
    )
    stack.finished(started["execution_name"])
    assert stack.head("resume-failed").status is RunStatus.FAILED

    with pytest.raises(NotResumable, match=r"run 'resume-failed' has failed: retry it instead"):
        client.resume("resume-failed")
