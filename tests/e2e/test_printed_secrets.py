"""What the commands print holds no credential, in real processes: a password in the store's
URL is shown as `***` in every line that names the store (`start`'s, `run`'s, and the commands
`run` suggests next), and a worker whose output may end in a service's log (on a store workers
on many hosts share, or with links served to others) prints no approval link, which decides in
its holder's name for days, but the command that prints one to whoever asks."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres_support import Cluster
from tests.processes import Cli, PostgresCli

PASSWORD = "Hunter2-Quokka-5513"
"""The store URL's password: the throwaway cluster trusts its socket and ignores it, as a
server would take it, so every command runs, and none may print it."""
LINK = re.compile(r"https?://\S+/approvals/\S+")


@pytest.fixture
def cli(
    postgres: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PostgresCli]:
    monkeypatch.chdir(tmp_path)
    name = postgres.fresh_database()
    url = postgres.url(name)
    assert url.startswith("postgresql://postgres@"), url
    with_password = url.replace("postgres@", f"postgres:{PASSWORD}@", 1)
    yield PostgresCli(tmp_path, url=with_password)
    postgres.drop_database(name)


def _said(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return f"{done.stdout}\n{done.stderr}"


def test_no_line_names_the_stores_password(cli: PostgresCli) -> None:
    # Given a store URL holding a password, when a run is started, run to its approval, worked
    # and linked
    started = _said(cli.run("start", "--scenario", "migration", "--run-id", "s1", "--batches", "2"))
    ran = _said(cli.run("run", "--scenario", "migration", "--run-id", "r1", "--batches", "2"))
    worked = _said(cli.run("worker", "--until-idle"))
    linked = _said(cli.run("link", "r1"))

    # Then no line holds the password, and the lines naming the store show `***` in its place
    for said in (started, ran, worked, linked):
        assert PASSWORD not in said, said
    assert f"started in store {cli.url.replace(PASSWORD, '***')}" in started, started
    assert "postgres:***@" in ran, ran
    print(f"\nstart: {started.strip().splitlines()[-1]}")


def test_a_worker_on_a_shared_store_prints_how_to_get_a_link_not_the_link(
    cli: PostgresCli,
) -> None:
    # Given a run waiting to be worked to its approval on a store many hosts share
    cli.ok("start", "--scenario", "migration", "--run-id", "m1", "--batches", "2")

    # When a worker parks it
    worked = _said(cli.run("worker", "--until-idle"))

    # Then it says the run waits and how to get a link, and prints none
    assert "m1 waits for a person: the request went to whom the run notifies" in worked, worked
    assert "ratchet link m1" in worked, worked
    assert not LINK.search(worked), worked
    # And whoever asks gets their link
    assert LINK.fullmatch(cli.ok("link", "m1").strip())


def test_ratchet_run_with_links_served_to_others_prints_no_link(tmp_path: Path) -> None:
    # Given a local store whose links point at a public address (RATCHET_PUBLIC_URL)
    public = Cli(tmp_path)
    env = public.env(RATCHET_PUBLIC_URL="https://ratchet.example.com")

    # When `ratchet run` parks a run for a person
    done = subprocess.run(
        public.argv("run", "--scenario", "migration", "--run-id", "p1", "--batches", "2"),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )

    # Then it prints how to get a link, not the link
    said = _said(done)
    assert "Approve or reject: ratchet link p1" in said, said
    assert not LINK.search(said), said


def test_ratchet_run_on_this_machine_alone_still_prints_the_link(tmp_path: Path) -> None:
    # Given a local store whose links point at this machine (the default): the one reading
    # the output is the one at the machine
    done = Cli(tmp_path).run("run", "--scenario", "migration", "--run-id", "l1", "--batches", "2")

    # Then `run` prints the operator's link, as the README's first run shows
    assert re.search(r"Approve or reject at: http://127\.0\.0\.1:\d+/approvals/", _said(done))


def test_a_refused_store_url_is_said_without_its_password(tmp_path: Path) -> None:
    # Given a store URL of a kind Ratchet does not take, holding a password
    cli = Cli(tmp_path)
    argv = [a if a != cli.store else f"mysql://ops:{PASSWORD}@db/runs" for a in cli.argv("list")]

    # When a command is given it
    done = subprocess.run(
        argv, capture_output=True, text=True, env=cli.env(), timeout=120, check=False
    )

    # Then it is refused in one line that names the URL without its password
    assert done.returncode == 2, done
    assert done.stderr.startswith("ratchet: unsupported store URL 'mysql://ops:***@db/runs'")
    assert PASSWORD not in done.stdout + done.stderr
