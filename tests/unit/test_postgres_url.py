"""`--store postgresql://...`: the URL's parser, and what a user is told before any connection
is made: a malformed URL, a missing `postgres` extra, a store that runs no agents yet (no I/O)."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from ratchet.adapters.postgres.database import DEFAULT_POOL_SIZE, PostgresUrl
from ratchet.cli.app import app
from ratchet.errors import InvalidInput, StoreUnavailable
from ratchet.runtime import open_runtime


def test_a_url_keeps_libpqs_parameters_and_takes_out_the_pool_size():
    url = PostgresUrl.parse(
        "postgresql://ratchet:s3cret@db.internal:5433/runs?sslmode=require&pool_size=12"
        "&options=-c%20search_path%3Dagents"
    )

    assert url.pool_size == 12
    assert url.conninfo == (
        "postgresql://ratchet:s3cret@db.internal:5433/runs?sslmode=require"
        "&options=-c%20search_path%3Dagents"
    )
    assert url.where == "db.internal:5433/runs"
    assert "s3cret" not in repr(url)


def test_both_spellings_and_a_socket_folder_name_a_store():
    assert PostgresUrl.parse("postgres://u@h/runs").pool_size == DEFAULT_POOL_SIZE
    socket = PostgresUrl.parse("postgresql://u@/runs?host=/var/run/postgresql")
    assert socket.where == "/var/run/postgresql/runs"


@pytest.mark.parametrize(
    ("url", "mention"),
    [
        ("postgresql://u@h", "must name one database"),
        ("postgresql://u@h/", "must name one database"),
        ("postgresql://u@h/a/b", "must name one database"),
        ("postgresql://u@h/runs?pool_size=0", "pool_size must be a number of connections"),
        ("postgresql://u@h/runs?pool_size=many", "pool_size must be a number of connections"),
        ("postgresql://u@h/runs?pool_size=2&pool_size=3", "given twice"),
        ("postgresql://u@h/runs?sslmod=require", 'invalid URI query parameter: "sslmod"'),
        ("postgresql://u:pw@h:99999/runs", "malformed store URL"),
    ],
)
def test_a_malformed_url_is_one_line_saying_what_is_wrong(url, mention):
    with pytest.raises(InvalidInput, match=mention) as refused:
        PostgresUrl.parse(url)

    assert "\n" not in str(refused.value)
    assert "pw@" not in str(refused.value)


def test_without_the_extra_a_postgres_store_says_which_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if never installed

    with pytest.raises(StoreUnavailable) as refused:
        open_runtime("postgresql://u@h/runs")

    assert str(refused.value) == (
        "a postgresql:// store needs psycopg: pip install 'ratchet-agents[postgres]'"
    )


def test_a_postgres_store_the_commands_cannot_reach_is_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("RATCHET_STORE", raising=False)
    url = f"postgresql://u@/runs?host={tmp_path / 'no-server-here'}"

    result = CliRunner().invoke(app, ["--store", url, "list"])

    # The command's entry point says a StoreUnavailable in one line, exit 2.
    assert isinstance(result.exception, StoreUnavailable)
    assert str(result.exception).startswith("cannot reach the Postgres store")
    assert "\n" not in str(result.exception)
