"""Webhook senders on a Postgres store: two senders, each with a pool of its own (two workers
on two hosts), racing over the same owed changes, to a real HTTP receiver on loopback. Each
change reaches each URL once: one sender owes it (`enqueue`), one sends it (`claim`).

Each sender signs with a secret of its own, so that the receiver can tell which one sent what
(a deployment gives them one, RATCHET_WEBHOOK_SECRET)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet.pushes import verify
from ratchet.runtime.local import LocalSettings
from ratchet.runtime.postgres import PostgresRuntime
from ratchet.runtime.webhooks import WebhookSender
from tests.conformance.test_store_contract import new_run as created_run
from tests.e2e.test_outbound_webhooks import Receiver, serving
from tests.postgres_support import Cluster

RUNS = 40
PATIENCE = 60.0
ANSWER_SECONDS = 0.02
"""How long the receiver takes to answer: the other sender reads the same deliveries due while
one is being sent."""


@pytest.fixture
def store(postgres: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # What a Postgres store's processes keep on their host goes to the test's folder.
    monkeypatch.chdir(tmp_path)
    name = postgres.fresh_database(store=True)
    yield postgres.url(name)
    postgres.drop_database(name)


def _create(runtime: PostgresRuntime, run_id: str) -> None:
    assert runtime.store.create_run(*created_run(run_id))


def test_two_senders_on_separate_pools_deliver_each_change_once_per_url(store):
    kept = Receiver()
    with serving(kept, answer_after=ANSWER_SECONDS) as url:
        urls = (f"{url}/a", f"{url}/b")
        settings = LocalSettings(store=store, webhooks=urls)
        # Each sender opens its own runtimes, and so its own pools, on the one database.
        senders = {
            secret: WebhookSender(
                settings, secret=secret, poll_seconds=0.01, runtime=PostgresRuntime
            )
            for secret in ("sender-a", "sender-b")
        }
        for sender in senders.values():
            sender.start()
        runtime = PostgresRuntime.open(settings, create=False)
        try:
            # Given runs made while both senders read the store
            for i in range(RUNS):
                _create(runtime, f"p{i:02}")

            # When both have sent everything owed (each delivery recorded)
            deadline = time.monotonic() + PATIENCE
            while runtime.deliveries.owing() or len(runtime.deliveries.listed(limit=1000)) < (
                RUNS * len(urls)
            ):
                assert time.monotonic() < deadline, "never: every delivery recorded"
                time.sleep(0.05)
            listed = runtime.deliveries.listed(limit=1000)
        finally:
            # Stopped (their threads joined): a send under way has arrived by now.
            for sender in senders.values():
                sender.stop()
            runtime.close()
        received = list(kept.received)

    # Then each change reached each URL once, delivered at its first attempt
    sent = Counter((r.headers["Path"], r.headers["Ratchet-Delivery"]) for r in received)
    twice = {key: n for key, n in sent.items() if n > 1}
    by_sender = Counter(
        next(s for s in senders if verify(s, r.headers["Ratchet-Signature"], r.body))
        for r in received
    )
    print(
        f"two senders, {RUNS} runs x {len(urls)} URLs: {len(received)} received, "
        f"{len(sent)} distinct, {len(twice)} twice; sent by {dict(sorted(by_sender.items()))}"
    )
    assert not twice, f"delivered twice: {twice}"
    changes = {(json.loads(r.body)["run_id"], r.headers["Path"]) for r in received}
    assert changes == {(f"p{i:02}", f"/hook/{u}") for i in range(RUNS) for u in "ab"}
    assert len(listed) == RUNS * len(urls)
    assert {(d.state, d.attempts) for d in listed} == {("delivered", 1)}
