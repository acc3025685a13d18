"""Webhooks on a Postgres store, in real processes: `ratchet worker --until-idle` with
`RATCHET_WEBHOOKS` POSTs each change of a run's status, signed, to a receiver on loopback in
this process, before it exits; and `ratchet deliveries RUN` lists each one as delivered."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_outbound_webhooks import (
    SECRET,
    Receiver,
    _hooked,
    documented_verify,
    serving,
)
from tests.e2e.test_serve_local import PATIENCE
from tests.postgres_support import Cluster
from tests.processes import PostgresCli

pytestmark = pytest.mark.slow


@pytest.fixture
def cli(
    postgres: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PostgresCli]:
    # Every process works in the test's folder, where a Postgres store's processes keep what
    # stays on their host.
    monkeypatch.chdir(tmp_path)
    name = postgres.fresh_database(store=True)
    yield PostgresCli(tmp_path, url=postgres.url(name))
    postgres.drop_database(name)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    kept = Receiver()
    with serving(kept) as url:
        yield kept, url


def _idle_worker(cli: PostgresCli, name: str, url: str) -> str:
    worked = subprocess.run(
        cli.argv("worker", "--until-idle", "--worker-id", name),
        capture_output=True,
        text=True,
        env=_hooked(url),
        timeout=PATIENCE,
        check=False,
    )
    assert worked.returncode == 0, worked.stderr
    assert "still owed" not in worked.stderr, worked.stderr
    return worked.stderr


def test_an_idle_worker_on_postgres_delivers_each_change_signed_and_lists_them(cli, receiver):
    kept, url = receiver
    verify = documented_verify()
    # Given a store on which a worker with webhooks has run (its first sender starts there)
    said = _idle_worker(cli, "first", url)
    assert f"Webhooks: each change of a run's status is POSTed to {url}" in said

    # When a run is started, worked until it parks, approved, and worked to its end, each
    # time by a worker that exits once idle
    cli.ok("start", "--scenario", "migration", "--batches", "1", "--run-id", "pw")
    _idle_worker(cli, "parks", url)
    parked = [b["status"] for b in kept.bodies()]
    cli.ok("approve", "pw", "--comment", "ok", "--by", "tester")
    _idle_worker(cli, "ends", url)
    listed = json.loads(cli.ok("deliveries", "pw", "--json"))["deliveries"]
    printed = cli.ok("deliveries", "pw")

    # Then each change was sent before its worker exited, signed under the secret
    bodies = sorted(kept.bodies(), key=lambda b: b["version"])
    print(f"postgres worker webhooks: {len(kept.received)} received, {len(listed)} listed")
    assert parked == ["running", "waiting"]
    assert [b["status"] for b in bodies] == ["running", "waiting", "running", "done"]
    assert {b["run_id"] for b in bodies} == {"pw"}
    for delivery in kept.received:
        assert verify(SECRET, delivery.headers["Ratchet-Signature"], delivery.body)
        assert not verify("not-the-secret", delivery.headers["Ratchet-Signature"], delivery.body)
        assert delivery.headers["Ratchet-Delivery"].startswith(
            f"{json.loads(delivery.body)['id']}@"
        )
    # And `ratchet deliveries` lists each, delivered at its first attempt
    sent = sorted(r.headers["Ratchet-Delivery"] for r in kept.received)
    assert sorted(d["id"] for d in listed) == sent
    assert sorted((d["change"], d["status"]) for d in listed) == sorted(
        (b["id"], b["status"]) for b in bodies
    )
    assert {(d["state"], d["attempts"], d["url"]) for d in listed} == {("delivered", 1, url)}
    assert printed.count(" delivered ") == 4, printed


def test_a_worker_without_the_shared_webhook_secret_says_so_in_one_line(cli, receiver):
    # Given webhooks on a Postgres store and no RATCHET_WEBHOOK_SECRET: a secret made on this
    # host would sign this host's deliveries only
    _, url = receiver
    env = _hooked(url)
    del env["RATCHET_WEBHOOK_SECRET"]

    refused = subprocess.run(
        cli.argv("worker", "--until-idle"),
        capture_output=True,
        text=True,
        env=env,
        timeout=PATIENCE,
        check=False,
    )

    # Then the worker refuses before it starts, in one line, and makes no secret file
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.strip().splitlines() == [
        "ratchet: webhooks on a postgresql:// store need RATCHET_WEBHOOK_SECRET, the same on "
        "every host that sends: a secret made here would sign this host's deliveries only"
    ]
    assert list(cli.root.rglob("*webhook-secret*")) == []
