"""A Postgres store's signing keys sealed under the payload key, in real processes, each "host"
a working directory of its own (as in tests/e2e/test_postgres_serve.py): a link a worker signs
on one host is verified by a `ratchet serve` on another with the same payload key; a process
with no payload key, or another one, is refused the key in one line and leaves it as it is; and
a key written in clear before the payload key was set still verifies its links, before and after
`ratchet migrate --reencrypt` seals it."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from ratchet.adapters.payload_keys import payload_codec
from ratchet.runtime import runtime_for
from ratchet.runtime.local import LocalSettings
from ratchet.sealing import header_of, is_sealed
from ratchet.state import RunStatus
from ratchet.stored import open_record_text
from tests.e2e.test_postgres_serve import PATIENCE, Host, _env, _request
from tests.postgres_support import Cluster, shared_keyring
from tests.processes import Served, serving

pytestmark = pytest.mark.slow

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def store(postgres: Cluster) -> Iterator[str]:
    name = postgres.fresh_database()
    yield postgres.url(name)
    postgres.drop_database(name)


def _host(tmp_path: Path, name: str, store: str) -> Host:
    folder = tmp_path / name
    folder.mkdir()
    return Host(folder, store)


def _run(host: Host, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        host.argv(*args),
        cwd=host.folder,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=PATIENCE * 2,
        check=False,
    )


def _serve(host: Host, **env: str) -> AbstractContextManager[Served]:
    return serving(
        host.argv("serve", "--port", "0", "--no-worker"),
        log=host.folder / f"serve-{time.monotonic_ns()}.log",
        env=_env(**env),
        cwd=host.folder,
    )


def _status(store: str, run_id: str, payload_key: str) -> RunStatus | None:
    runtime = runtime_for(LocalSettings(store=store, payload_key=payload_key), create=False)
    try:
        head = runtime.store.load_head(run_id)
    finally:
        runtime.close()
    return head.status if head is not None else None


def _keyring(folder: Path) -> str:
    folder.mkdir()
    return shared_keyring(folder)


def _rows(store: str) -> dict[str, bytes]:
    with psycopg.connect(store) as connection:
        rows = connection.execute("SELECT name, secret FROM signing_keys").fetchall()
    return {str(name): bytes(secret) for name, secret in rows}


def _outbox_link(host: Host, run_id: str, payload_key: str | None) -> str:
    """The approval link of the email `host`'s worker wrote for `run_id` (sealed under
    `payload_key`, if one is given)."""
    deadline = time.monotonic() + PATIENCE
    pattern = f".ratchet/postgres/*/ratchet.outbox/{run_id}-step-*.json"
    while not (found := sorted(host.folder.glob(pattern))):
        assert time.monotonic() < deadline, f"no approval email for {run_id}"
        time.sleep(0.1)
    codec = payload_codec(payload_key, beside=None)
    text = open_record_text(found[-1].read_text(encoding="utf-8"), codec, part="outbox")
    link = json.loads(text)["link"]
    assert isinstance(link, str)
    return link


def _on(base: str, link: str) -> str:
    """`link` sent to the serve listening at `base`."""
    parts = urlsplit(link)
    return f"{base}{parts.path}?{parts.query}"


def test_a_link_a_worker_signs_under_the_payload_key_is_verified_by_a_serve_on_another_host(
    store: str, tmp_path: Path
) -> None:
    # Given two hosts given the same payload key, and a serve on host B
    key = _keyring(tmp_path / "ring")
    host_a, host_b = _host(tmp_path, "a", store), _host(tmp_path, "b", store)
    with _serve(host_b, RATCHET_PAYLOAD_KEY=key) as served:
        # When a worker on host A parks a migration for a person, emailing a link to B
        host_a.ok(
            "start",
            "--scenario",
            "migration",
            "--batches",
            "2",
            "--run-id",
            "m1",
            RATCHET_PAYLOAD_KEY=key,
        )
        host_a.ok("worker", "--until-idle", RATCHET_PUBLIC_URL=served.base, RATCHET_PAYLOAD_KEY=key)
        link = _outbox_link(host_a, "m1", key)

        # Then the key it signed with is stored sealed under the payload key
        rows = _rows(store)
        assert "approval-links" in rows
        assert all(is_sealed(row) for row in rows.values()), rows
        print(f"\nstored: { {n: (len(r), header_of(r)[0]) for n, r in rows.items()} }")
        # And B verifies A's link and takes the decision
        status, page = _request(link)
        assert status == 200, page
        status, page = _request(link, body=b"decision=approve&comment=", headers=FORM)
        assert status == 200, page
        assert "Approved" in page, page
    host_a.ok("worker", "--until-idle", RATCHET_PAYLOAD_KEY=key)
    assert _status(store, "m1", key) is RunStatus.DONE


def test_a_process_without_the_payload_key_or_with_another_is_refused_the_key_and_leaves_it(
    store: str, tmp_path: Path
) -> None:
    # Given a run started before the payload key was set (in clear), and its hook made after
    key, other = _keyring(tmp_path / "ring"), _keyring(tmp_path / "other-ring")
    host = _host(tmp_path, "host", store)
    host.ok("start", "--agent", "tests.hooks_agent:agent", "--run-id", "r1")
    made = json.loads(host.ok("hook", "r1", "ci-finished", "--json", RATCHET_PAYLOAD_KEY=key))
    sealed = _rows(store)
    assert set(sealed) == {"hooks"}

    without: dict[str, str] = {}
    for name, env in (("no payload key", without), ("another", {"RATCHET_PAYLOAD_KEY": other})):
        # When a process with no payload key, or another one, asks for the hook
        refused = _run(host, "hook", "r1", "ci-finished", "--json", **env)
        print(f"\n{name}: exit {refused.returncode}: {refused.stderr.strip()}")

        # Then it is refused in one line naming the key, and the key is left as it was
        assert refused.returncode != 0, refused.stdout
        assert refused.stdout == ""
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "'hooks' signing key" in refused.stderr, refused.stderr
        assert _rows(store) == sealed

    # And with the payload key the hook is the same one, with the same secret
    again = json.loads(host.ok("hook", "r1", "ci-finished", "--json", RATCHET_PAYLOAD_KEY=key))
    assert (again["hook_id"], again["secret"]) == (made["hook_id"], made["secret"])


def test_a_clear_key_verifies_its_links_before_and_after_reencrypt_seals_it(
    store: str, tmp_path: Path
) -> None:
    # Given a link signed with a key written in clear, before the store had a payload key
    host_a, host_b = _host(tmp_path, "a", store), _host(tmp_path, "b", store)
    with _serve(host_b) as served:
        host_a.ok("start", "--scenario", "migration", "--batches", "2", "--run-id", "m1")
        host_a.ok("worker", "--until-idle", RATCHET_PUBLIC_URL=served.base)
    link = _outbox_link(host_a, "m1", None)
    clear = _rows(store)["approval-links"]
    assert not is_sealed(clear)

    # When the payload key is set: a serve with it still verifies the link
    key = _keyring(tmp_path / "ring")
    with _serve(host_b, RATCHET_PAYLOAD_KEY=key) as served:
        status, page = _request(_on(served.base, link))
        assert status == 200, page
    assert _rows(store)["approval-links"] == clear

    # And `migrate --reencrypt` seals the key, counting it
    report = json.loads(host_a.ok("migrate", "--reencrypt", "--json", RATCHET_PAYLOAD_KEY=key))
    print(f"\nreencrypt: {report}")
    assert report["sealed"].get("signing_keys") == 1, report
    resealed = _rows(store)["approval-links"]
    assert is_sealed(resealed)
    assert clear not in resealed
    assert clear.hex().encode() not in resealed.lower()

    # Then a serve with the payload key verifies the old link, and takes its decision
    with _serve(host_b, RATCHET_PAYLOAD_KEY=key) as served:
        target = _on(served.base, link)
        status, page = _request(target)
        assert status == 200, page
        status, page = _request(target, body=b"decision=approve&comment=", headers=FORM)
        assert status == 200, page
        assert "Approved" in page, page
    host_a.ok("worker", "--until-idle", RATCHET_PAYLOAD_KEY=key)
    assert _status(store, "m1", key) is RunStatus.DONE
