"""With event logging on (`POWERTOOLS_LOGGER_LOG_EVENT=true`, which a user turns on to debug),
Powertools logs every event a handler is invoked with, the notify function's task token
included: the token is redacted from the line, and the run parks, is decided and finishes as
it does with logging off. (The `stack` fixture checks that no task token appears in anything
the test produced, its log lines included.)"""

from __future__ import annotations

import sys

import pytest

from ratchet.state import RunStatus
from tests.integration.aws.harness import APPROVER, Stack


def test_with_every_event_logged_no_task_token_reaches_the_log(
    events_logged: None, stack: Stack, capfd: pytest.CaptureFixture[str]
):
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": "logged"})
    assert status == 201, started
    stack.parked("logged")
    page = stack.open(stack.link("logged"))
    decided = stack.submit(page.form_action, "approve", "go ahead")
    assert (decided.status, decided.title) == (200, "Approved")
    assert stack.finished(started["execution_name"])["status"] == "SUCCEEDED"
    assert stack.head("logged").status is RunStatus.DONE
    assert stack.decisions("logged") == [(True, APPROVER, "go ahead")]

    logged = capfd.readouterr()
    # Hand the lines back for the `stack` fixture's own check.
    sys.stdout.write(logged.out)
    sys.stderr.write(logged.err)
    # The notify function's event was logged whole, its token redacted.
    assert '"task_token":"[redacted]"' in logged.out
    assert '"verdict":"approved"' in logged.out, "the decide function's event was not logged"
