"""What the `ratchet` command says, as a user audit read it: each line names what exists and how
to give what is missing, through the console script (its quick paths) and the full CLI alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import RATCHET, clean_env

QUICK_CLI = [sys.executable, "-c", "import sys; from ratchet.cli.quick import main; main()"]
"""The console script `ratchet` (the entry point), in a process of its own."""
ENTRY_POINTS = pytest.mark.parametrize("command", [QUICK_CLI, RATCHET], ids=["script", "full"])


def ratchet(command: list[str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a refusal: exit 2, nothing on stdout."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr.removesuffix("\n")


@ENTRY_POINTS
@pytest.mark.parametrize("args", [["list"], ["status", "r1"], ["history", "r1", "--json"]])
def test_an_unsupported_store_url_names_every_kind_of_store(tmp_path, command, args):
    said = one_line(ratchet(command, tmp_path, "--store", "mysql://x/y", *args))

    assert said.startswith("ratchet: unsupported store URL 'mysql://x/y': use ")
    for kind in ("sqlite:///", "postgresql://", "dynamodb://"):
        assert kind in said, said


@ENTRY_POINTS
@pytest.mark.parametrize(
    ("args", "example"),
    [
        (["status", "r1", "--store"], "ratchet --store URL status r1"),
        (["list", "--store"], "ratchet --store URL list"),
        (["history", "r1", "--json", "--store"], "ratchet --store URL history r1 --json"),
        (["approve", "r1", "--answer", '{"a": 1}', "--store"], "approve r1 --answer '{\"a\": 1}'"),
        (["--store"], "ratchet --store URL COMMAND"),
    ],
)
def test_a_store_option_without_its_value_is_said_to_need_one(tmp_path, command, args, example):
    said = one_line(ratchet(command, tmp_path, *args))

    assert said.startswith("ratchet: --store needs a value, and goes before the command: ")
    assert said.endswith(example)
    assert "No such option" not in said


def started(tmp_path: Path, run_id: str, agent: str = "migration") -> str:
    """A store in `tmp_path` with a run `run_id` started of a built-in scenario; its URL."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    done = ratchet(
        RATCHET, tmp_path, "--store", store, "start", "--scenario", agent, "--run-id", run_id
    )
    assert done.returncode == 0, done.stderr
    return store


@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_deliveries_of_a_run_that_is_not_there_are_refused_as_every_run_command_refuses_it(
    tmp_path, as_json
):
    store = started(tmp_path, "r1")

    said = one_line(ratchet(RATCHET, tmp_path, "--store", store, "deliveries", "nosuch", *as_json))
    status = one_line(ratchet(RATCHET, tmp_path, "--store", store, "status", "nosuch"))
    none = ratchet(RATCHET, tmp_path, "--store", store, "deliveries", "r1", *as_json)

    assert said == status == "ratchet: no run with id 'nosuch' in this store"
    assert none.returncode == 0, none.stderr  # a run that sent nothing: an empty list
