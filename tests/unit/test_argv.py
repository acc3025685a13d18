"""Global options anywhere (`ratchet.cli.argv.arrange`) and a store named by its file's path
(`ratchet.store_urls.store_url`)."""

from __future__ import annotations

import pytest

from ratchet.cli.argv import arrange
from ratchet.store_urls import store_url


@pytest.mark.parametrize(
    ("typed", "parsed"),
    [
        (["status", "r1"], ["status", "r1"]),
        (["status", "r1", "--store", "a.db"], ["--store", "a.db", "status", "r1"]),
        (["status", "--store=a.db", "r1"], ["--store=a.db", "status", "r1"]),
        (["--json", "status", "r1"], ["status", "r1", "--json"]),
        (["--store", "a.db", "--json", "list"], ["--store", "a.db", "list", "--json"]),
        (["schedule", "list", "--store", "a.db"], ["--store", "a.db", "schedule", "list"]),
        (
            ["run", "--scenario", "migration", "--log-json"],
            ["--log-json", "run", "--scenario", "migration"],
        ),
        (["--log-json", "worker"], ["--log-json", "worker"]),
        (
            ["approve", "r1", "--log-json", "--store", "a.db"],
            ["--log-json", "--store", "a.db", "approve", "r1"],
        ),
        (["status", "--", "--log-json"], ["status", "--", "--log-json"]),
        (["--help"], ["--help"]),
        (["--json"], ["--json"]),
        # After `--`, nothing is an option: the run id "--store" stays where it is.
        (["status", "--", "--store", "x"], ["status", "--", "--store", "x"]),
        (["--json", "status", "--", "--json"], ["status", "--json", "--", "--json"]),
        # A `--store` with no value is left for the parser to refuse.
        (["status", "r1", "--store"], ["status", "r1", "--store"]),
    ],
)
def test_global_options_move_before_the_command_and_json_after_it(typed, parsed):
    assert arrange(typed) == parsed


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("runs.db", "sqlite:///runs.db"),
        ("data/runs.db", "sqlite:///data/runs.db"),
        ("/srv/ratchet/runs.db", "sqlite:////srv/ratchet/runs.db"),
        ("sqlite:///runs.db", "sqlite:///runs.db"),
        ("dynamodb://t?ledger=l&app=a", "dynamodb://t?ledger=l&app=a"),
        ("postgres://db", "postgres://db"),  # not ours: the runtime refuses it by name
        ("", ""),
    ],
)
def test_a_store_without_a_scheme_is_a_sqlite_file(given, url):
    assert store_url(given) == url
