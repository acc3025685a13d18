"""`ratchet migrate --reencrypt` (issue 37): every sealed record and blob of a local store
rewritten under the newest payload key, and those written in clear before the codec sealed, so
that the old key can be removed with every run still readable; stopped part-way, a second run
finishes the job; without a codec, one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from werkzeug.test import Client as HttpClient

from ratchet.adapters.payload_keys import new_keyring_line
from ratchet.adapters.sqlite import reencrypt as reencryption
from ratchet.adapters.sqlite.reencrypt import SEALED_COLUMNS, reencrypt
from ratchet.client import Client
from ratchet.errors import PayloadKeyMissing
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.services import local_runs_services
from ratchet.sealing import header_of
from ratchet.stored import sealed_key_id
from ratchet.web.dashboard import local_app
from ratchet.web.serve import wsgi_app
from tests.integration.test_sealed_payloads import (
    AGENT,
    SECRET,
    _cli,
    _keyring_ids,
    _state,
    _stored_bytes,
    _work,
)
from tests.support import LOG


def _ring(store: Path) -> Path:
    return Path(f"{store.parent / store.stem}.payload-keys")


def _texts_by_key(runtime: LocalRuntime) -> dict[str | None, int]:
    """How many of the store's texts each key seals (None: in clear), over every sealed column."""
    found: dict[str | None, int] = {}
    connection = runtime.db.connection
    for column in SEALED_COLUMNS:
        if not runtime.db.has_table(column.table):
            continue
        where = f" WHERE {column.where}" if column.where else ""
        for (text,) in connection.execute(
            f"SELECT {column.column} FROM {column.table}{where}"
        ).fetchall():
            if text is not None:
                key_id = sealed_key_id(text)
                found[key_id] = found.get(key_id, 0) + 1
    return found


def _blob_keys(store: Path) -> list[str | None]:
    keys: list[str | None] = []
    for path in sorted(Path(f"{store.parent / store.stem}.blobs").glob("*/*")):
        data = path.read_bytes()
        keys.append(header_of(data)[0] if data.startswith(b"RTS\x01") else None)
    return keys


def test_after_reencrypt_the_old_key_can_go_and_every_run_still_reads(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    url = f"sqlite:///{store}"

    # Given a run and a schedule written in clear before the codec was turned on,
    plain = LocalRuntime.open(LocalSettings(store=url))
    try:
        assert plain.engine(worker_id="w1", logger=LOG).start(_state("c1"))
        _work(plain, "c1")
    finally:
        plain.close()
    scheduled = _cli(
        store, *("schedule", "add", "nightly", "--agent", AGENT, "--every", "1h"),
        *("--input", json.dumps({"customer": SECRET})), key=None,
    )  # fmt: skip
    assert scheduled.returncode == 0, scheduled.stderr
    # a run started under key A, rotated to key B and worked to its end, and a fork of it
    sealed = LocalSettings(store=url, payload_key="local")
    first = LocalRuntime.open(sealed)
    try:
        assert first.engine(worker_id="w1", logger=LOG).start(_state("r1"))
        _work(first, "r1", steps=2)  # its blob too
    finally:
        first.close()
    (key_a,) = _keyring_ids(store)
    ring = _ring(store)
    ring.write_text(f"{new_keyring_line()}\n{ring.read_text()}")
    key_b = _keyring_ids(store)[0]
    second = LocalRuntime.open(sealed)
    try:
        _work(second, "r1")
        Client(second).fork("r1", from_step=1, run_id="r1-fork")
        before = _texts_by_key(second)
    finally:
        second.close()
    print(f"\ntexts before: {before}; blobs before: {_blob_keys(store)}")
    assert min(before[None], before[key_a], before[key_b]) > 0
    assert sorted(_blob_keys(store), key=str) == sorted([None, key_a], key=str)

    # ...while key A is still needed: without it, one error naming it
    both = ring.read_text()
    ring.write_text(f"{both.split()[0]}\n")
    refused = _cli(store, "history", "r1")
    assert refused.returncode != 0
    assert refused.stderr.count("\n") == 1
    assert key_a in refused.stderr
    ring.write_text(both)

    # When the store is reencrypted (after a dry run; twice: the second finds nothing to do)
    dry = _cli(store, "migrate", "--reencrypt", "--dry-run")
    done = _cli(store, "migrate", "--reencrypt")
    again = _cli(store, "migrate", "--reencrypt", "--json")

    # Then it says how many records and blobs it rewrote, under B,
    print(done.stdout)
    assert done.returncode == 0, done.stderr
    rewritten = sum(before.values()) - before[key_b]
    assert done.stdout.splitlines()[0] == (
        f"rewrote {rewritten} records and {len(_blob_keys(store))} blobs under key {key_b}"
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[0] == (
        f"would rewrite {rewritten} records and {len(_blob_keys(store))} blobs under key "
        f"{key_b} (dry run: nothing changed)"
    )
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert (report["records"], report["blobs"], report["key_id"]) == (0, 0, key_b)
    assert report["current"] == sum(before.values())
    # every text and blob is sealed under B, and the run written in clear is in no stored byte,
    assert set(_blob_keys(store)) == {key_b}
    for name, data in _stored_bytes(store).items():
        assert SECRET.encode() not in data, name

    # and with A removed, every run reads: status, history, the client, replay, fork, dashboard
    ring.write_text(f"{both.split()[0]}\n")
    for command in (
        ["schedule", "list", "--json"],
        *(["status", run_id, "--json"] for run_id in ("c1", "r1", "r1-fork")),
        *(["history", run_id, "--json"] for run_id in ("c1", "r1")),
    ):
        shown = _cli(store, *command)
        assert shown.returncode == 0, shown.stderr
        assert SECRET in shown.stdout, command
    runtime = LocalRuntime.open(sealed)
    try:
        assert _texts_by_key(runtime) == {key_b: sum(before.values())}
        client = Client(runtime)
        for run_id in ("c1", "r1"):
            assert client.head(run_id).summary == f"exported the orders of {SECRET}"
            assert SECRET in client.replay(run_id, step=1)
            (blob,) = [r.blob for r in client.head(run_id).tool_results if r.blob is not None]
            assert f"order 199 for {SECRET}".encode() in runtime.blobs.get(blob)
        client.fork("c1", from_step=2, run_id="c1-fork")
        _work(runtime, "c1-fork")
        assert client.head("c1-fork").summary == f"exported the orders of {SECRET}"
        runs = local_runs_services(runtime, worker_id="serve:test", logger=LOG)
        desk = runtime.approval_desk(worker_id="serve:test", logger=LOG)
        http = HttpClient(wsgi_app([("/dashboard", local_app(runs.client, desk, operator="d"))]))
        for run_id in ("c1", "r1"):
            page = http.get(f"/dashboard/runs/{run_id}")
            assert page.status_code == 200
            assert SECRET in page.get_data(as_text=True)
    finally:
        runtime.close()


def test_reencrypt_stopped_part_way_is_finished_by_a_second_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = tmp_path / "ratchet.db"
    sealed = LocalSettings(store=f"sqlite:///{store}", payload_key="local")
    ring = _ring(store)
    # Given three runs under key A (sharing one blob), and a fourth (last in the order they are
    # read) under key C
    runtime = LocalRuntime.open(sealed)
    try:
        for run_id in ("r1", "r2", "r3"):
            assert runtime.engine(worker_id="w1", logger=LOG).start(_state(run_id))
            _work(runtime, run_id)
    finally:
        runtime.close()
    key_a_line = ring.read_text().split()[0]
    key_c_line = new_keyring_line()
    ring.write_text(f"{key_c_line}\n")
    runtime = LocalRuntime.open(sealed)
    try:
        assert runtime.engine(worker_id="w1", logger=LOG).start(_state("z1"))
        _work(runtime, "z1")
    finally:
        runtime.close()
    (key_c,) = _keyring_ids(store)

    # When it is reencrypted under a new key B, two heads a transaction, without C:
    ring.write_text(f"{new_keyring_line()}\n{key_a_line}\n")
    key_b = _keyring_ids(store)[0]
    monkeypatch.setattr(reencryption, "PAGE_ROWS", 2)
    runtime = LocalRuntime.open(sealed)
    try:
        assert runtime.codec is not None
        with pytest.raises(PayloadKeyMissing) as stopped:
            reencrypt(runtime.db, Path(f"{runtime.root}.blobs"), runtime.codec)
        assert stopped.value.key_id == key_c
        # Then it stopped at z1's head, the second page: the first page's heads are under B
        heads = dict(runtime.db.connection.execute("SELECT run_id, state FROM runs").fetchall())
        assert {run: sealed_key_id(text) for run, text in heads.items()} == {
            "r1": key_b,
            "r2": key_b,
            "r3": _keyring_ids(store)[1],
            "z1": key_c,
        }
    finally:
        runtime.close()

    # And a second run, with C back, rewrites the rest and leaves the first page as it is
    ring.write_text(f"{ring.read_text()}{key_c_line}\n")
    runtime = LocalRuntime.open(sealed)
    try:
        assert runtime.codec is not None
        total = sum(_texts_by_key(runtime).values())
        report = reencrypt(runtime.db, Path(f"{runtime.root}.blobs"), runtime.codec)
        print(f"\nsecond run: {report.to_json()}")
        assert report.key_id == key_b
        assert report.current == 2
        assert report.records == total - 2
        assert (report.blobs, report.moved, report.unreadable) == (2, 0, [])
        assert _texts_by_key(runtime) == {key_b: total}
    finally:
        runtime.close()
    ring.write_text(f"{ring.read_text().split()[0]}\n")  # B alone
    for run_id in ("r1", "r2", "r3", "z1"):
        shown = _cli(store, "history", run_id, "--json")
        assert shown.returncode == 0, shown.stderr
        assert SECRET in shown.stdout


def test_reencrypt_without_a_payload_key_is_one_line(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    ran = _cli(store, "run", "--agent", "tests.fixtures.sealed_agent:agent", "--run-id", "p1")
    assert ran.returncode == 0, ran.stderr

    refused = _cli(store, "migrate", "--reencrypt", key=None)

    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.count("\n") == 1
    assert "RATCHET_PAYLOAD_KEY" in refused.stderr
