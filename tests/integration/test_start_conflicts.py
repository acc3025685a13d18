"""A start under a taken run id: the same request again changes nothing; another agent, goal or
input under it is refused, naming what differs, with nothing written (exit 2 from the CLI, 409
from the runs API)."""

from __future__ import annotations

import logging

import pytest

from ratchet.client import Client
from ratchet.runs import RunConflict
from ratchet.runtime.local import LocalRuntime, LocalSettings
from tests.processes import Cli

LOG = logging.getLogger("ratchet.tests.start_conflicts")


@pytest.fixture
def client(tmp_path):
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db"))
    client = Client(runtime, worker_id="test", logger=LOG)
    yield client
    client.close()


def test_the_same_start_again_changes_nothing(client):
    first = client.start(run_id="r1", scenario="migration", input={"batches": 2})
    again = client.start(run_id="r1", scenario="migration", input={"batches": 2})

    assert (first.version, again.version) == (1, 1)


@pytest.mark.parametrize(
    ("changed", "differs"),
    [
        ({"scenario": "notebook", "goal": "Write notes"}, "agent, goal, input"),
        ({"scenario": "migration", "input": {"batches": 3}}, "goal, input"),
    ],
)
def test_another_request_under_a_taken_id_is_refused_naming_what_differs(client, changed, differs):
    client.start(run_id="r1", scenario="migration", input={"batches": 2})
    before = client.runtime.store.list_checkpoints("r1")

    with pytest.raises(RunConflict) as refused:
        client.start(run_id="r1", **changed)

    assert f"run 'r1' exists with another {differs}" in str(refused.value)
    assert client.runtime.store.list_checkpoints("r1") == before


def test_the_cli_says_it_in_one_line_and_exits_2(tmp_path):
    cli = Cli(tmp_path)
    cli.ok("start", "--scenario", "migration", "--run-id", "refund-1")

    done = cli.run("start", "--scenario", "notebook", "--goal", "Notes", "--run-id", "refund-1")

    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "ratchet: run 'refund-1' exists with another agent, goal, input: starting it again "
        "changes nothing only with the same request; choose another run id (--agent, --goal, "
        "--input/--param)"
    ]
