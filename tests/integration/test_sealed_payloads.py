"""Payloads sealed before they are stored (issue 37, items 2 and 3): with `RATCHET_PAYLOAD_KEY`
set, a secret a run is given and its tools return is in no stored byte (the SQLite file and its
WAL, the blobs, the DynamoDB items, the S3 objects), while the commands, the client and the
dashboard show it; a run goes on across a key rotation; a reader without the key, or a value
changed by one bit, is refused in one line."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from werkzeug.test import Client as HttpClient

from ratchet.adapters.payload_keys import KmsCodec, new_keyring_line
from ratchet.adapters.sqlite.deliveries import Moved, Owed
from ratchet.client import Client
from ratchet.engine import Outcome
from ratchet.errors import BlobCorrupt, InvalidInput, PayloadKeyMissing, PayloadTampered
from ratchet.ports import RunData
from ratchet.runtime import connect
from ratchet.runtime.aws import AwsRuntime
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.services import local_runs_services
from ratchet.sealing import header_of
from ratchet.state import BlobRef, RunOptions, RunState, RunStatus
from ratchet.web.approvals import ApprovalServices
from ratchet.web.approvals import build_app as build_approvals_app
from ratchet.web.dashboard import local_app
from ratchet.web.serve import wsgi_app
from tests.dynamodb_support import REGION, SETTINGS, moto_tables, scan
from tests.fixtures import sealed_agent, sealed_errands
from tests.processes import RATCHET, clean_env
from tests.support import LOG

SECRET = "Zanzibar-Quokka-7731"
"""Given as the run's input; the agent's tools return it, inline and in a blob."""
CARD = "4111 1111 1111 1111"
AGENT = f"{sealed_agent.__name__}:agent"
ERRANDS = f"{sealed_errands.__name__}:agent"
BUCKET = "ratchet-sealed-blobs"


def _cli(store: Path, *args: str, key: str | None = "local") -> subprocess.CompletedProcess[str]:
    env = clean_env(**({"RATCHET_PAYLOAD_KEY": key} if key else {}))
    return subprocess.run(
        [*RATCHET, "--store", f"sqlite:///{store}", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=120,
    )


def _stored_bytes(store: Path) -> dict[str, bytes]:
    """Every file of the store: the database, its WAL, the blobs."""
    files = [
        store,
        Path(f"{store}-wal"),
        *sorted(Path(f"{store.parent / store.stem}.blobs").rglob("*")),
    ]
    return {str(f.relative_to(store.parent)): f.read_bytes() for f in files if f.is_file()}


def _every_byte(store: Path) -> dict[str, bytes]:
    """`_stored_bytes` and the folders beside the store: the outbox and the runs' data."""
    files = [
        *sorted(Path(f"{store.parent / store.stem}.outbox").rglob("*")),
        *sorted(Path(f"{store.parent / store.stem}.data").rglob("*")),
    ]
    beside = {str(f.relative_to(store.parent)): f.read_bytes() for f in files if f.is_file()}
    return {**_stored_bytes(store), **beside}


def _work(runtime: Any, run_id: str, *, steps: int = 10) -> None:
    engine = runtime.engine(worker_id="w1", logger=LOG)
    for _ in range(steps):
        if engine.advance(run_id).outcome is not Outcome.CONTINUE:
            return


def _state(run_id: str) -> RunState:
    options = RunOptions(model="scripted", params={"customer": SECRET})
    goal = sealed_agent.agent.goal_for({"customer": SECRET})
    return RunState(run_id=run_id, agent=AGENT, goal=goal, options=options)


# --- a local store ------------------------------------------------------------------------------


def test_a_local_secret_is_in_no_stored_byte_and_every_read_shows_it(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    settings = LocalSettings(store=f"sqlite:///{store}", payload_key="local")
    # Held open while the command runs: its writes stay in the WAL, which is read too.
    held = LocalRuntime.open(settings)
    try:
        ran = _cli(
            store, "run", "--agent", AGENT, "--param", f"customer={SECRET}", "--run-id", "s1"
        )
        assert ran.returncode == 0, ran.stderr
        stored = _stored_bytes(store)

        # Then the secret and the card are in no byte of the store, its WAL or a blob...
        assert "ratchet.db-wal" in stored
        assert len(stored["ratchet.db-wal"]) > 0
        blobs = [name for name in stored if name.startswith("ratchet.blobs/")]
        assert len(blobs) == 1
        print(f"\nbytes read: {sum(len(b) for b in stored.values()):,} in {len(stored)} files")
        for name, data in stored.items():
            assert SECRET.encode() not in data, name
            assert CARD.encode() not in data, name

        # ...while the commands show them,
        status = _cli(store, "status", "s1", "--json")
        history = _cli(store, "history", "s1", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["summary"] == f"exported the orders of {SECRET}"
        assert SECRET in json.loads(status.stdout)["goal"]
        assert CARD in history.stdout
        assert SECRET in history.stdout

        # the client,
        client = connect(f"sqlite:///{store}", environ={"RATCHET_PAYLOAD_KEY": "local"})
        try:
            assert client.get("s1").status is RunStatus.DONE
            assert client.head("s1").options.params == {"customer": SECRET}
            assert any(CARD in (c.result or "") for c in client.history("s1"))
            assert any(c.arguments == {"customer": SECRET} for c in client.history("s1"))
        finally:
            client.close()

        # the dashboard,
        runs = local_runs_services(held, worker_id="serve:test", logger=LOG)
        desk = held.approval_desk(worker_id="serve:test", logger=LOG)
        http = HttpClient(wsgi_app([("/dashboard", local_app(runs.client, desk, operator="d"))]))
        page = http.get("/dashboard/runs/s1")
        assert page.status_code == 200
        assert SECRET in page.get_data(as_text=True)

        # and the blob reads back whole.
        data = held.blobs.get(BlobRef(sha256=Path(blobs[0]).name, size=1))
        assert f"order 199 for {SECRET}".encode() in data
    finally:
        held.close()


def test_without_the_key_every_read_is_one_line_naming_it(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    ran = _cli(store, "run", "--agent", AGENT, "--param", f"customer={SECRET}", "--run-id", "s1")
    assert ran.returncode == 0, ran.stderr
    key_id = _keyring_ids(store)[0]

    for command in (["status", "s1"], ["history", "s1"], ["status", "s1", "--json"]):
        refused = _cli(store, *command, key=None)
        assert refused.returncode != 0, command
        assert refused.stdout == ""
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert key_id in refused.stderr
        assert SECRET not in refused.stderr
    listed = _cli(store, "list", key=None)  # ids, status, steps and times stay readable
    assert listed.returncode == 0, listed.stderr
    assert "s1" in listed.stdout


def test_migrate_and_gc_read_a_sealed_store_and_keep_its_blobs(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    ran = _cli(store, "run", "--agent", AGENT, "--param", f"customer={SECRET}", "--run-id", "s1")
    assert ran.returncode == 0, ran.stderr
    blobs = sorted(Path(f"{tmp_path / 'ratchet'}.blobs").rglob("*/*"))
    assert len(blobs) == 1

    migrated = _cli(store, "migrate", "--json")
    collected = _cli(store, "gc", "--older-than", "0", "--json")

    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["runs"] == [
        {"run_id": "s1", "from_version": 4, "outcome": "current", "reason": None}
    ]
    assert collected.returncode == 0, collected.stderr
    # The only reference to the blob is in sealed records: their envelopes name it in clear.
    assert sorted(Path(f"{tmp_path / 'ratchet'}.blobs").rglob("*/*")) == blobs
    assert _cli(store, "status", "s1").returncode == 0


def test_a_comment_typed_by_a_person_is_in_no_stored_byte_and_history_shows_it(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    comment = f"approved for {SECRET}"
    held = LocalRuntime.open(LocalSettings(store=f"sqlite:///{store}", payload_key="local"))
    try:
        # A run that parks for a person's approval, approved with a comment
        parked = _cli(store, "run", "--scenario", "migration", "--batches", "1", "--run-id", "m1")
        assert parked.returncode == 0, parked.stderr
        approved = _cli(store, "approve", "m1", "--by", "dana", "--comment", comment)
        assert approved.returncode == 0, approved.stderr

        for name, data in _stored_bytes(store).items():
            assert SECRET.encode() not in data, name
        history = _cli(store, "history", "m1", "--json")
        assert history.returncode == 0, history.stderr
        assert comment in history.stdout
        (request,) = held.approvals.of_run("m1")
        assert request.comment == comment
    finally:
        held.close()


def test_an_event_sent_to_a_run_is_in_no_stored_byte_and_the_run_takes_it(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    payload = json.dumps({"conclusion": "success", "url": f"https://ci.example/{SECRET}"})
    held = LocalRuntime.open(LocalSettings(store=f"sqlite:///{store}", payload_key="local"))
    try:
        # An event sent before the run waits for it: kept in the run's mailbox
        started = _cli(store, "start", "--agent", "tests.waits_agent:agent", "--run-id", "e1")
        assert started.returncode == 0, started.stderr
        sent = _cli(store, "send", "e1", "ci-finished", "--data", payload)
        assert sent.returncode == 0, sent.stderr
        (kept,) = held.mailbox.of_run("e1")
        assert kept.payload == json.loads(payload)
        for name, data in _stored_bytes(store).items():
            assert SECRET.encode() not in data, name

        # Then the run takes it when it waits, and its history shows it
        worked = _cli(store, "worker", "--until-idle")
        assert worked.returncode == 0, worked.stderr
        history = _cli(store, "history", "e1", "--json")
        assert history.returncode == 0, history.stderr
        assert SECRET in history.stdout
        for name, data in _stored_bytes(store).items():
            assert SECRET.encode() not in data, name
    finally:
        held.close()


def test_a_secret_through_every_record_a_store_keeps_is_in_no_byte_and_every_read_shows_it(
    tmp_path: Path,
):
    store = tmp_path / "ratchet.db"
    held = LocalRuntime.open(LocalSettings(store=f"sqlite:///{store}", payload_key="local"))
    try:
        # Given the secret in a schedule's input,
        scheduled = _cli(
            store, *("schedule", "add", "nightly", "--agent", AGENT, "--every", "1h"),
            *("--input", json.dumps({"customer": SECRET})),
        )  # fmt: skip
        assert scheduled.returncode == 0, scheduled.stderr
        # an event sent to a run,
        started = _cli(store, "start", "--agent", "tests.waits_agent:agent", "--run-id", "e1")
        assert started.returncode == 0, started.stderr
        event = {"conclusion": "success", "url": f"https://ci.example/{SECRET}"}
        sent = _cli(store, "send", "e1", "ci-finished", "--data", json.dumps(event))
        assert sent.returncode == 0, sent.stderr
        # a question to a person, emailed, and answered with a comment,
        parked = _cli(
            store, *("run", "--agent", ERRANDS, "--param", f"customer={SECRET}"),
            *("--notify", "dana@example.com", "--run-id", "a1"),
        )  # fmt: skip
        assert parked.returncode == 0, parked.stderr
        (email,) = [m for m in held.outbox.messages() if m["to"] == "dana@example.com"]
        link = urlsplit(email["link"])
        page = _approval_page(held, f"{link.path}?{link.query}")
        comment = f"refund {SECRET} in full"
        approved = _cli(store, "approve", "a1", "--by", "dana", "--comment", comment)
        assert approved.returncode == 0, approved.stderr
        worked = _cli(store, "worker", "--until-idle")
        assert worked.returncode == 0, worked.stderr
        # and a value of the run's data
        data = held.context("a1", RunOptions()).data
        assert data is not None
        data.put("card", SECRET)

        # Then the secret is in no byte of the store, its WAL, the blobs, the outbox or the
        # runs' data folders,
        stored = _every_byte(store)
        assert any(name.startswith("ratchet.outbox/") for name in stored)
        print(f"\nbytes read: {sum(len(b) for b in stored.values()):,} in {len(stored)} files")
        for name, data_bytes in stored.items():
            assert SECRET.encode() not in data_bytes, name

        # while every read shows it: the commands,
        listed = _cli(store, "schedule", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout)["schedules"][0]["input"] == {"customer": SECRET}
        history = _cli(store, "history", "a1", "--json")
        assert history.returncode == 0, history.stderr
        assert comment in history.stdout
        status = _cli(store, "status", "a1", "--json")
        assert SECRET in json.loads(status.stdout)["summary"]
        taken = _cli(store, "history", "e1", "--json")
        assert SECRET in taken.stdout
        # the client,
        client = connect(f"sqlite:///{store}", environ={"RATCHET_PAYLOAD_KEY": "local"})
        try:
            (schedule,) = client.schedules()
            assert schedule.spec.input == {"customer": SECRET}
            assert any(c.comment == comment for c in client.history("a1"))
        finally:
            client.close()
        (request,) = held.approvals.of_run("a1")
        assert request.comment == comment
        assert data.get("card") == SECRET
        # the outbox's email and the approval page its link opens,
        assert SECRET in email["text"]
        assert page.status_code == 200
        assert SECRET in page.get_data(as_text=True)
        # and the dashboard
        runs = local_runs_services(held, worker_id="serve:test", logger=LOG)
        desk = held.approval_desk(worker_id="serve:test", logger=LOG)
        http = HttpClient(wsgi_app([("/dashboard", local_app(runs.client, desk, operator="d"))]))
        shown = http.get("/dashboard/runs/a1")
        assert shown.status_code == 200
        assert SECRET in shown.get_data(as_text=True)
    finally:
        held.close()


def test_a_webhook_deliverys_body_is_in_no_stored_byte_and_the_sender_reads_it(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    held = LocalRuntime.open(LocalSettings(store=f"sqlite:///{store}", payload_key="local"))
    try:
        # Given a status change owed to a URL, its body saying the run's summary
        body = json.dumps({"run_id": "w1", "status": "done", "summary": f"paid {SECRET}"})
        deliveries = held.deliveries
        deliveries.prepare()
        owed = Owed("d1", "w1:3", "w1", "https://hooks.example/ratchet", body)
        assert deliveries.enqueue(
            Moved("w1", 3, None, None), version=3, status=RunStatus.DONE, owed=[owed]
        )

        # Then its body is in no stored byte, and the sender and the listing read it whole
        for name, data in _stored_bytes(store).items():
            assert SECRET.encode() not in data, name
        (due,) = deliveries.due()
        assert due.body == body
        assert [d.body for d in deliveries.listed("w1")] == [body]
    finally:
        held.close()


def _approval_page(runtime: LocalRuntime, path: str) -> Any:
    desk = runtime.approval_desk(worker_id="serve:test", logger=LOG)
    app = build_approvals_app(lambda: ApprovalServices(desk=desk))
    return HttpClient(wsgi_app([("/approvals/", app)])).get(path)


def _keyring_ids(store: Path) -> list[str]:
    from ratchet.adapters.payload_keys import local_key_id

    ring = Path(f"{store.parent / store.stem}.payload-keys")
    return [local_key_id(bytes.fromhex(line)) for line in ring.read_text().split()]


def test_a_run_goes_on_across_a_rotation_and_without_the_old_key_is_one_error(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    settings = LocalSettings(store=f"sqlite:///{store}", payload_key="local")
    ring = Path(f"{tmp_path / 'ratchet'}.payload-keys")

    # Given a run started and stepped once under key A
    first = LocalRuntime.open(settings)
    assert first.engine(worker_id="w1", logger=LOG).start(_state("r1"))
    assert first.engine(worker_id="w1", logger=LOG).advance("r1").outcome is Outcome.CONTINUE
    first.close()
    (key_a,) = _keyring_ids(store)

    # When key B is put first and the run is worked to its end, forked and replayed
    ring.write_text(f"{new_keyring_line()}\n{ring.read_text()}")
    key_b = _keyring_ids(store)[0]
    second = LocalRuntime.open(settings)
    try:
        _work(second, "r1")
        client = Client(second)
        # Then every record reads, the old ones under A and the new ones under B
        assert client.get("r1").status is RunStatus.DONE
        assert client.head("r1").summary == f"exported the orders of {SECRET}"
        keys = _record_keys(second, "r1")
        assert keys[0] == key_a
        assert keys[-1] == key_b
        fork = client.fork("r1", from_step=1, run_id="r1-fork")
        assert fork.run_id == "r1-fork"
        _work(second, "r1-fork")
        assert client.get("r1-fork").status is RunStatus.DONE
        assert SECRET in client.replay("r1", step=1)
    finally:
        second.close()

    # And with key A removed, reading the run is one error naming A
    ring.write_text(f"{ring.read_text().split()[0]}\n")
    third = LocalRuntime.open(settings)
    try:
        with pytest.raises(PayloadKeyMissing) as refused:
            Client(third).head("r1")
        assert refused.value.key_id == key_a
    finally:
        third.close()
    said = _cli(store, "history", "r1")
    assert said.returncode != 0
    assert said.stderr.count("\n") == 1
    assert key_a in said.stderr


def _record_keys(runtime: LocalRuntime, run_id: str) -> list[str]:
    """The key id of each of the run's records, oldest first, read from their envelopes."""
    rows = runtime.db.connection.execute(
        "SELECT event FROM checkpoints WHERE run_id = ? ORDER BY version", (run_id,)
    ).fetchall()
    return [header_of(base64.b64decode(json.loads(e)["sealed"]))[0] for (e,) in rows]


def test_a_tampered_record_or_blob_is_refused(tmp_path: Path):
    store = tmp_path / "ratchet.db"
    settings = LocalSettings(store=f"sqlite:///{store}", payload_key="local")
    runtime = LocalRuntime.open(settings)
    try:
        assert runtime.engine(worker_id="w1", logger=LOG).start(_state("t1"))
        _work(runtime, "t1")
        # Given one bit changed in the sealed value of the run's last record
        (version, text) = runtime.db.connection.execute(
            "SELECT version, event FROM checkpoints WHERE run_id = 't1' ORDER BY version DESC"
        ).fetchone()
        envelope = json.loads(text)
        sealed = bytearray(base64.b64decode(envelope["sealed"]))
        sealed[-1] ^= 0x01
        envelope["sealed"] = base64.b64encode(bytes(sealed)).decode()
        with runtime.db.write() as tx:
            tx.execute(
                "UPDATE checkpoints SET event = ? WHERE run_id = 't1' AND version = ?",
                (json.dumps(envelope, separators=(",", ":")), version),
            )

        # Then reading the records is refused: authentication fails
        with pytest.raises(PayloadTampered, match="fails its authentication"):
            Client(runtime).history("t1")

        # And a blob changed by one bit is a corrupt blob
        blob = runtime.blobs.put(b"what a tool saw, " + SECRET.encode())
        path = Path(f"{runtime.root}.blobs") / blob.sha256[:2] / blob.sha256
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.raises(BlobCorrupt, match="fails its authentication"):
            runtime.blobs.get(blob)
    finally:
        runtime.close()


# --- DynamoDB and S3 (moto) -------------------------------------------------------------------


@pytest.fixture
def dynamodb() -> Iterator[Any]:
    with moto_tables() as client:
        yield client


def test_on_aws_a_secret_is_in_no_item_and_no_object_and_the_client_shows_it(dynamodb):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    kms = boto3.client("kms", region_name=REGION)
    key = kms.create_key()["KeyMetadata"]["Arn"]
    settings = SETTINGS.model_copy(update={"blob_bucket": BUCKET})
    runtime = AwsRuntime(settings, dynamodb, s3=s3, codec=KmsCodec(kms, key))
    assert runtime.engine(worker_id="api", logger=LOG).start(_state("a1"))

    _work(runtime, "a1")

    items = [
        scan(dynamodb, table)
        for table in (settings.checkpoints_table, settings.idempotency_table, settings.app_table)
    ]
    objects = [
        s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
        for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]
    ]
    assert len(objects) == 1
    stored = json.dumps(items, default=str).encode()
    for data in (stored, *objects):
        assert SECRET.encode() not in data
        assert CARD.encode() not in data
    client = Client(runtime)
    head = client.head("a1")
    assert head.status is RunStatus.DONE
    assert head.summary == f"exported the orders of {SECRET}"
    assert any(CARD in (c.result or "") for c in client.history("a1"))
    (blob,) = [r.blob for r in head.tool_results if r.blob is not None]
    assert f"order 199 for {SECRET}".encode() in runtime.blobs.get(blob)


def test_a_dynamodb_store_url_reads_and_seals_with_the_kms_key_its_setting_names(dynamodb):
    kms = boto3.client("kms", region_name=REGION)
    key = kms.create_key()["KeyMetadata"]["Arn"]
    url = (
        f"dynamodb://{SETTINGS.checkpoints_table}?ledger={SETTINGS.idempotency_table}"
        f"&app={SETTINGS.app_table}&region={REGION}"
    )
    # A run written through the store's URL with the setting, as `ratchet start` would
    writer = connect(url, environ={"RATCHET_PAYLOAD_KEY": f"kms:{key}"})
    assert writer.start(agent=AGENT, run_id="k1", input={"customer": SECRET}).run_id == "k1"
    assert writer.head("k1").options.params == {"customer": SECRET}
    assert SECRET not in json.dumps(scan(dynamodb, SETTINGS.checkpoints_table))

    # Read without the setting: one error naming the KMS key
    reader = connect(url, environ={})
    with pytest.raises(PayloadKeyMissing) as refused:
        reader.head("k1")
    assert refused.value.key_id == key
    with pytest.raises(InvalidInput, match="RATCHET_PAYLOAD_KEY is not valid"):
        connect(url, environ={"RATCHET_PAYLOAD_KEY": "vault:main"})


def test_a_runs_data_is_sealed_and_a_value_that_only_looks_sealed_reads_as_it_is(tmp_path):
    store = tmp_path / "ratchet.db"
    looks_sealed = '{"sealed":"not base64 at all"}'
    plain = LocalRuntime.open(LocalSettings(store=f"sqlite:///{store}"))
    try:
        # A value written without the codec, shaped like an envelope
        before = _data(plain)
        before.put("odd", looks_sealed)
        assert before.get("odd") == looks_sealed
    finally:
        plain.close()

    sealed = LocalRuntime.open(LocalSettings(store=f"sqlite:///{store}", payload_key="local"))
    try:
        data = _data(sealed)
        data.put("card", SECRET)
        data.put("also-odd", looks_sealed)

        assert data.get("card") == SECRET
        assert data.items() == [("also-odd", looks_sealed), ("card", SECRET), ("odd", looks_sealed)]
        for name, stored in _stored_bytes(store).items():
            assert SECRET.encode() not in stored, name
    finally:
        sealed.close()


def _data(runtime: LocalRuntime) -> RunData:
    data = runtime.context("d1", RunOptions()).data
    assert data is not None
    return data
