"""Bad input to a Postgres store, through the CLI in real processes (issue 39): a malformed URL,
a database of another application, a missing database and a role without rights are each one
line on stderr and exit 2, with no password in it, and nothing written to a database that is
not Ratchet's."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.postgres_support import Cluster
from tests.processes import RATCHET, clean_env

pytestmark = pytest.mark.slow

PASSWORD = "Hunter2-Quokka"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # What a Postgres store's processes keep on their host goes in the working directory.
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def database(postgres: Cluster) -> Iterator[str]:
    name = postgres.fresh_database()
    yield name
    postgres.drop_database(name)


def _refused(store: str, *args: str) -> str:
    """The one line `ratchet --store STORE ARGS` refuses with (exit 2)."""
    done = subprocess.run(
        [*RATCHET, "--store", store, *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert PASSWORD not in lines[0]
    return lines[0]


def _tables(url: str) -> list[str]:
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
            "ORDER BY table_name"
        )
        return [str(name) for (name,) in rows]


START = ("start", "--scenario", "migration", "--run-id", "m1")


def test_a_malformed_url_is_one_line(folder: Path) -> None:
    said = _refused(f"postgresql://ratchet:{PASSWORD}@db.internal:port/ratchet", *START)
    assert "postgresql://" in said, said


def test_a_database_of_another_application_is_one_line_and_left_as_it_was(
    postgres: Cluster, database: str, folder: Path
) -> None:
    url = postgres.url(database)
    with psycopg.connect(url) as connection:
        connection.execute("CREATE TABLE invoices (id integer PRIMARY KEY)")
        connection.execute("INSERT INTO invoices VALUES (7)")

    for args in (START, ("worker", "--until-idle"), ("list",), ("gc", "--older-than", "30")):
        said = _refused(url, *args)
        assert "is not a Ratchet store: it has tables of another application (invoices)" in said

    assert _tables(url) == ["invoices"]
    with psycopg.connect(url) as connection:
        assert connection.execute("SELECT id FROM invoices").fetchall() == [(7,)]


def test_a_missing_database_is_one_line_naming_it_without_its_password(
    postgres: Cluster, folder: Path
) -> None:
    url = postgres.url("no_such_db").replace("postgres@", f"postgres:{PASSWORD}@")

    for args in (START, ("status", "m1")):
        said = _refused(url, *args)
        assert "no_such_db" in said, said


def test_a_role_without_rights_is_one_line_and_nothing_is_made(
    postgres: Cluster, database: str, folder: Path
) -> None:
    url = postgres.url(database)
    postgres.admin("DROP ROLE IF EXISTS visitor")
    postgres.admin("CREATE ROLE visitor LOGIN")
    try:
        said = _refused(url.replace("postgres@", "visitor@"), *START)
        assert "cannot be used: permission denied for schema public" in said, said
        assert _tables(url) == []
    finally:
        postgres.admin("DROP ROLE visitor")
