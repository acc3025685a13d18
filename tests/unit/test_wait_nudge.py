"""The nudge that wakes an execution parked on an event wait: what Step Functions answers, as
Ratchet reads it. The client is botocore's, stubbed; the tokens are kept in a dict."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from ratchet.adapters.dynamodb.waits import ParkedWait
from ratchet.adapters.stepfunctions import WAIT_SETTLED_OUTPUT, StepFunctionsNudge
from ratchet.errors import StoreBusy
from ratchet.state import RunState, RunStatus, WaitSettled

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAf-token"


@dataclass
class Tokens:
    kept: dict[tuple[str, int], str] = field(default_factory=dict)
    owed: dict[tuple[str, int], str] = field(default_factory=dict)
    """What settled each wait whose wake is owed."""

    def look(self, run_id: str, step: int) -> ParkedWait:
        return ParkedWait(self.kept.get((run_id, step)), (run_id, step) in self.owed)

    def forget(self, run_id: str, step: int, task_token: str) -> None:
        if self.kept.get((run_id, step)) == task_token:
            del self.kept[(run_id, step)]
            self.owed.pop((run_id, step), None)

    def owe(self, run_id: str, step: int, how: str, *, at: datetime) -> None:
        self.owed[(run_id, step)] = how

    def clear_owed(self, run_id: str, step: int) -> None:
        self.owed.pop((run_id, step), None)


def _nudge(
    tokens: Tokens, relaunched: list[str] | None = None
) -> tuple[StepFunctionsNudge, Stubber]:
    client = boto3.client(
        "stepfunctions",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    stub = Stubber(client)
    stub.activate()
    relaunch = relaunched.append if relaunched is not None else None
    return StepFunctionsNudge(tokens, client, relaunch=relaunch), stub


HEAD = RunState(run_id="run-1", agent="a", goal="g", status=RunStatus.RUNNING, step=3)


def _settled(how: str) -> WaitSettled:
    return WaitSettled(step=3, how=how, text="...")


def test_a_settled_event_wait_answers_the_kept_token_once_and_drops_it():
    tokens = Tokens({("run-1", 3): TOKEN})
    nudge, stub = _nudge(tokens)
    stub.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": WAIT_SETTLED_OUTPUT})

    nudge(HEAD, _settled("event"))

    stub.assert_no_pending_responses()
    assert tokens.kept == {}


@pytest.mark.parametrize("code", ["TaskTimedOut", "InvalidToken", "TaskDoesNotExist"])
def test_a_task_already_over_is_nothing_to_do_and_its_token_is_dropped(code: str):
    tokens = Tokens({("run-1", 3): TOKEN})
    nudge, stub = _nudge(tokens)
    stub.add_client_error("send_task_success", service_error_code=code)

    assert nudge.resume("run-1", 3) is True
    assert tokens.kept == {}


def test_a_busy_step_functions_is_store_busy_and_the_token_and_the_wake_owed_stay():
    tokens = Tokens({("run-1", 3): TOKEN})
    nudge, stub = _nudge(tokens)
    stub.add_client_error("send_task_success", service_error_code="ThrottlingException")

    nudge.owe("run-1", 3, "event")
    with pytest.raises(StoreBusy, match="ThrottlingException"):
        nudge(HEAD, _settled("event"))
    assert tokens.kept == {("run-1", 3): TOKEN}
    assert tokens.owed == {("run-1", 3): "event"}, "the sweep must still see it owed"


def test_the_answer_pays_the_wake_owed_with_the_token():
    tokens = Tokens({("run-1", 3): TOKEN})
    nudge, stub = _nudge(tokens)
    stub.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": WAIT_SETTLED_OUTPUT})

    nudge.owe("run-1", 3, "children")
    nudge(HEAD, _settled("children"))

    assert (tokens.kept, tokens.owed) == ({}, {})


def test_no_token_kept_pays_the_wake_owed_without_a_call():
    tokens = Tokens()
    nudge, stub = _nudge(tokens)

    nudge.owe("run-1", 3, "event")
    assert nudge.resume("run-1", 3) is False

    assert tokens.owed == {}
    stub.assert_no_pending_responses()


def test_an_unknown_failure_is_raised_as_it_is():
    tokens = Tokens({("run-1", 3): TOKEN})
    nudge, stub = _nudge(tokens)
    stub.add_client_error("send_task_success", service_error_code="AccessDeniedException")

    with pytest.raises(ClientError, match="AccessDenied"):
        nudge(HEAD, _settled("event"))


def test_no_token_kept_means_no_call():
    nudge, stub = _nudge(Tokens())

    assert nudge.resume("run-1", 3) is False
    nudge(HEAD, _settled("timeout"))
    stub.assert_no_pending_responses()


def test_a_woken_sleeper_is_relaunched_and_a_timer_come_due_needs_nothing():
    relaunched: list[str] = []
    tokens = Tokens({("run-1", 3): TOKEN})
    nudge, stub = _nudge(tokens, relaunched)

    nudge.owe("run-1", 3, "woken")
    nudge(HEAD, _settled("due"))
    nudge(HEAD, _settled("woken"))

    assert relaunched == ["run-1"]
    assert tokens.owed == {}
    stub.assert_no_pending_responses()
