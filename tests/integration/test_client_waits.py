"""The Python client on a run that waits for an event or a time: `get` says what it waits
for, `send_event` answers what the desk did (an `EventSent`), `wake` wakes a sleeper, and each
refusal is the typed error, with nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import ratchet
from ratchet.errors import InvalidInput, NotSleeping, RunEnded, RunNotFound
from ratchet.waiting.desk import EventInvalid
from tests.waits_agent import AGENT

PASSED = {"conclusion": "success"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[ratchet.Client]:
    with ratchet.connect(f"sqlite:///{tmp_path}/runs.db", environ={}) as connected:
        yield connected


def _rows(client: ratchet.Client) -> dict[str, list[object]]:
    db = client.runtime.db.connection  # type: ignore[attr-defined]
    names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {n: db.execute(f'SELECT * FROM "{n}"').fetchall() for n in names}


def test_a_run_waits_for_an_event_the_client_sends_then_sleeps_until_woken(client):
    run = client.run(run_id="c1", agent=AGENT, input={"nap": True})
    assert run.wait is not None
    assert (run.wait.kind, run.wait.name, run.wait.step) == ("event", "ci-finished", 1)
    assert run.wait.until is not None
    assert run.wait.answer_schema is not None

    sent = client.send_event("c1", "ci-finished", PASSED, event_id="gh-1")
    again = client.send_event("c1", "ci-finished", PASSED, event_id="gh-1")

    assert isinstance(sent, ratchet.EventSent)
    assert (sent.status, sent.step, sent.duplicate) == ("delivered", 1, False)
    assert again == sent.model_copy(update={"duplicate": True})
    mailbox = client.runtime.mailbox.get("c1", "gh-1")
    assert mailbox.source == "client"

    sleeping = client.work("c1")
    assert sleeping.wait is not None
    assert (sleeping.wait.kind, sleeping.wait.name) == ("timer", None)
    woken = client.wake("c1", by="dana")
    assert (woken.status, woken.wait) == ("running", None)
    with pytest.raises(NotSleeping):
        client.wake("c1")
    assert client.work("c1").status == "done"


@pytest.mark.parametrize(
    ("run_id", "name", "data", "error"),
    [
        ("c1", "ci-finished", {"conclusion": "maybe"}, EventInvalid),
        ("c1", "bad name", PASSED, InvalidInput),
        ("gone", "ci-finished", PASSED, RunEnded),
        ("nope", "ci-finished", PASSED, RunNotFound),
        ("not an id!", "ci-finished", PASSED, InvalidInput),
    ],
)
def test_a_refused_event_raises_its_error_and_writes_nothing(client, run_id, name, data, error):
    client.run(run_id="c1", agent=AGENT)
    client.start(run_id="gone", agent=AGENT)
    client.cancel("gone")
    before = _rows(client)

    with pytest.raises(error):
        client.send_event(run_id, name, data)
    with pytest.raises((NotSleeping, RunNotFound, InvalidInput)):
        client.wake(run_id)

    assert _rows(client) == before
