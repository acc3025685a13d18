"""`ratchet watch` reads a run's head again only when the run has moved: on a SQLite store a
poll of a run nobody wrote to is one row read (`ratchet.cli.store_file.RunMarks`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ratchet
from ratchet.cli.inspection import WatchPoll
from ratchet.cli.store_file import RunMarks

RATCHET = Path(sys.executable).with_name("ratchet")


class _CountingHeads:
    """A client whose head reads are counted."""

    def __init__(self, client: ratchet.Client) -> None:
        self.client, self.heads = client, 0

    def head(self, run_id: str) -> ratchet.RunState:
        self.heads += 1
        return self.client.head(run_id)


@pytest.fixture
def url(tmp_path: Path) -> str:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "ANTHROPIC_"))}
    run = ["run", "--scenario=migration", "--param=batches=2", "--run-id=w1"]
    subprocess.run(
        [str(RATCHET), "--store", store, *run],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return store


def test_a_poll_reads_the_head_again_only_after_a_write(url):
    client = ratchet.connect(url)
    counting = _CountingHeads(client)
    poll = WatchPoll(counting, "w1", url)  # type: ignore[arg-type]
    try:
        first = poll.head()
        again = [poll.head() for _ in range(5)]

        assert counting.heads == 1
        assert all(head is first for head in again)

        client.cancel("w1", reason="seen enough")
        moved = poll.head()

        assert counting.heads == 2
        assert moved.version > first.version
        assert moved.status.value == "cancelled"
    finally:
        poll.close()
        client.close()


def test_on_a_store_the_marks_cannot_read_every_poll_reads_the_head(url, tmp_path):
    client = ratchet.connect(url)
    counting = _CountingHeads(client)
    poll = WatchPoll(counting, "w1", "dynamodb://elsewhere")  # type: ignore[arg-type]
    try:
        for _ in range(3):
            poll.head()

        assert counting.heads == 3
    finally:
        poll.close()
        client.close()


def test_the_marks_say_a_runs_version_and_status_and_none_for_another_run(url):
    marks = RunMarks.open(url)
    assert marks is not None
    try:
        version, status = marks.of("w1") or (0, "")

        assert status == "waiting"
        assert version == ratchet.connect(url).head("w1").version
        assert marks.of("nobody") is None
    finally:
        marks.close()
