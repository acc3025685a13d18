"""Webhooks on the local runtime, through the WSGI app `ratchet serve` runs: a real SQLite store,
a run parked by a real worker, deliveries signed as GitHub (or any sender) signs them, and
every way a delivery can be refused. Each refusal changes nothing in any table."""

from __future__ import annotations

import io
import json
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client, EnvironBuilder, TestResponse, run_wsgi_app

from ratchet.agents import AgentRegistry
from ratchet.client import Client as RatchetClient
from ratchet.errors import EventNotAwaited, InvalidInput, RunEnded, RunNotFound
from ratchet.observability import json_logger
from ratchet.ports import OpenedHook
from ratchet.runtime.hooks import Hooks, hook_url, local_hooks
from ratchet.runtime.local import LocalRuntime
from ratchet.runtime.services import local_runs_services
from ratchet.state import MAX_EVENT_BYTES, RunStatus
from ratchet.waiting.desk import EventDesk
from ratchet.waiting.hooks import (
    REPLAY_WINDOW_SECONDS,
    WebhooksNotTaken,
    generic_signature,
    github_signature,
)
from ratchet.web import runs
from ratchet.web.hooks import BODY_LIMIT, Throttle, build_app
from ratchet.web.serve import wsgi_app
from tests.hooks_agent import AGENT, agent
from tests.integration.test_waits_local import Local as WaitsLocal

LOG = logging.getLogger("ratchet.tests.hooks")
PASSED = {"conclusion": "success", "url": "https://ci.example/runs/1"}
DELIVERY = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
"""A delivery id as GitHub sends them (a GUID)."""


@dataclass
class Ticks:
    """The throttle's monotonic clock, moved by hand."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


class Local(WaitsLocal):
    """The waits harness, with the hooks agent, the hook route as `ratchet serve` mounts it,
    and the log lines it writes."""

    agent = agent
    agent_ref = AGENT

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.root = root
        self.ticks = Ticks()
        self.log_stream = io.StringIO()
        # The logger `ratchet serve` uses (Powertools, JSON lines), on a stream of the test's.
        self.logger = json_logger(self.log_stream, level="DEBUG")
        self.hooks: Hooks = local_hooks(self.runtime)
        desk = self.desk()
        self.services = self.hooks.services(
            desk, logger=self.logger, throttle=Throttle(clock=self.ticks)
        )
        app = build_app(lambda: self.services)
        self.client = Client(wsgi_app([("/hooks/", app)], body_limits=[BODY_LIMIT]))
        # The runs API as `ratchet serve` mounts it, logging to the same stream; it knows the
        # hooks agent (as a project's registered agents), so it checks the events it declares.
        api = local_runs_services(
            self.runtime, worker_id="serve", logger=self.logger, agents=AgentRegistry.local()
        )
        self.api = Client(wsgi_app([("/runs", runs.build_app(lambda: api))]))

    def open_through_api(self, run_id: str, name: str) -> tuple[int, dict[str, Any]]:
        answer = self.api.post(f"/runs/{run_id}/hooks/{name}", content_type="application/json")
        return answer.status_code, answer.get_json()

    def desk(self, runtime: LocalRuntime | None = None) -> EventDesk:
        runtime = runtime or self.runtime
        desk = runtime.event_desk(runtime.engine(worker_id="serve", logger=self.logger))
        desk.clock = self.clock
        return desk

    def park(self, run_id: str = "run-1", **params: object) -> OpenedHook:
        """Start a run, work it until it waits for `ci-finished`, and make its hook."""
        self.start(run_id, **params)
        opened = self.hooks.open(run_id, "ci-finished")
        self.work(run_id)
        assert self.head(run_id).status is RunStatus.WAITING
        return opened

    def post(self, hook: OpenedHook | str, body: bytes, headers: dict[str, str]) -> TestResponse:
        path = f"/hooks/{hook.hook.hook_id if isinstance(hook, OpenedHook) else hook}"
        return self.client.post(path, data=body, headers=headers)

    def github(
        self, hook: OpenedHook, payload: Any = PASSED, *, delivery: str = DELIVERY
    ) -> TestResponse:
        body = github_body(payload)
        return self.post(hook, body, github_headers(hook.secret, body, delivery))

    def generic(
        self, hook: OpenedHook, payload: Any = PASSED, *, delivery: str = "d-1", skew: int = 0
    ) -> TestResponse:
        body = json.dumps(payload).encode()
        stamp = int(self.clock.now.timestamp()) + skew
        return self.post(hook, body, generic_headers(hook.secret, body, stamp, delivery))


def github_body(payload: Any) -> bytes:
    # GitHub's bodies are JSON as its serializer writes it (spaces and key order its own): the
    # signature is over these exact bytes, whatever they are.
    return json.dumps(payload, indent=2).encode("utf-8")


def github_headers(secret: str, body: bytes, delivery: str = DELIVERY) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/044aadd",
        "X-GitHub-Event": "workflow_run",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Hook-ID": "292430182",
        "X-Hub-Signature-256": github_signature(secret, body),
    }


def generic_headers(secret: str, body: bytes, stamp: int, delivery: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-Signature-256": generic_signature(secret, stamp, body),
        "X-Signature-Timestamp": str(stamp),
        "X-Delivery-Id": delivery,
    }


def answered(response: TestResponse) -> Any:
    """The JSON a route answered with."""
    return json.loads(response.get_data(as_text=True))


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    served = Local(tmp_path)
    yield served
    served.runtime.close()


def assert_done_with_delivery_once(local: Local, run_id: str, delivery: str) -> None:
    head = local.head(run_id)
    assert head.status is RunStatus.DONE, head
    settled = local.results_of(run_id)
    assert [(s.how, s.event_id) for s in settled] == [("event", delivery)]
    assert settled[0].payload == PASSED
    event = local.runtime.mailbox.get(run_id, delivery)
    assert event is not None
    assert event.source == "webhook"
    assert event.consumed_step == 1


# --- deliveries that are taken ------------------------------------------------------------------


def test_a_github_delivery_resumes_the_waiting_run(local):
    hook = local.park()
    answer = local.github(hook)
    assert answer.status_code == 200, answer.json
    assert answer.json == {
        "run_id": "run-1",
        "name": "ci-finished",
        "event_id": DELIVERY,
        "status": "delivered",
        "step": 1,
        "duplicate": False,
        "refused": None,
    }
    assert local.head("run-1").status is RunStatus.RUNNING  # runnable: the next worker goes on
    local.work("run-1")
    assert_done_with_delivery_once(local, "run-1", DELIVERY)


def test_a_redelivery_is_a_duplicate_and_changes_nothing(local):
    hook = local.park()
    first = local.github(hook)
    before = local.tables()
    again = local.github(hook)  # GitHub's "Redeliver": the same body, id and signature
    assert again.status_code == 200
    assert again.json == {**first.json, "duplicate": True}
    assert local.tables() == before
    local.work("run-1")
    assert local.github(hook).json == {**first.json, "duplicate": True}  # after the run ended too
    assert_done_with_delivery_once(local, "run-1", DELIVERY)


def test_a_generic_delivery_signed_with_its_timestamp_resumes_the_run(local):
    hook = local.park()
    answer = local.generic(hook, delivery="evt_1", skew=-(REPLAY_WINDOW_SECONDS - 5))
    assert (answer.status_code, answered(answer)["status"]) == (200, "delivered")
    local.work("run-1")
    assert_done_with_delivery_once(local, "run-1", "evt_1")


def test_a_delivery_before_the_run_waits_is_kept_for_its_wait(local):
    local.start()
    hook = local.hooks.open("run-1", "ci-finished")
    answer = local.github(hook)
    assert (answer.status_code, answered(answer)["status"]) == (200, "queued")
    local.work("run-1")  # the step that waits takes it from the mailbox
    local.work("run-1")
    assert_done_with_delivery_once(local, "run-1", DELIVERY)


def test_githubs_ping_is_answered_and_kept_nowhere(local):
    hook = local.park()
    before = local.tables()
    body = github_body({"zen": "Keep it logically awesome.", "hook_id": 292430182})
    headers = {**github_headers(hook.secret, body, "ping-1"), "X-GitHub-Event": "ping"}
    answer = local.post(hook, body, headers)
    assert (answer.status_code, answer.json) == (200, {"status": "pong", "name": "ci-finished"})
    assert local.tables() == before


# --- refusals: a clear 4xx JSON naming the field, and nothing changed ---------------------------


def _unknown(local: Local, hook: OpenedHook) -> TestResponse:
    body = github_body(PASSED)
    forged = "0" * 32
    return local.post(forged, body, github_headers(local.hooks.keys.secret(forged), body))


def _malformed_id(local: Local, hook: OpenedHook) -> TestResponse:
    body = github_body(PASSED)
    return local.post("run-1", body, github_headers(hook.secret, body))


def _unsigned(local: Local, hook: OpenedHook) -> TestResponse:
    body = github_body(PASSED)
    headers = github_headers(hook.secret, body)
    del headers["X-Hub-Signature-256"]
    return local.post(hook, body, headers)


def _other_secret(local: Local, hook: OpenedHook) -> TestResponse:
    body = github_body(PASSED)
    # Another secret for sure: the last digit changed (the key, and so the secret, is random).
    other = hook.secret[:-1] + ("1" if hook.secret.endswith("0") else "0")
    return local.post(hook, body, github_headers(other, body))


def _changed_body(local: Local, hook: OpenedHook) -> TestResponse:
    body = github_body(PASSED)
    headers = github_headers(hook.secret, body)
    return local.post(hook, body.replace(b"success", b"failure"), headers)


def _malformed_signature(local: Local, hook: OpenedHook) -> TestResponse:
    body = github_body(PASSED)
    headers = {**github_headers(hook.secret, body), "X-Hub-Signature-256": "sha1=abc"}
    return local.post(hook, body, headers)


def _stale(local: Local, hook: OpenedHook) -> TestResponse:
    return local.generic(hook, skew=-(REPLAY_WINDOW_SECONDS + 1))


def _future(local: Local, hook: OpenedHook) -> TestResponse:
    return local.generic(hook, skew=REPLAY_WINDOW_SECONDS + 1)


def _no_timestamp(local: Local, hook: OpenedHook) -> TestResponse:
    body = json.dumps(PASSED).encode()
    stamp = int(local.clock.now.timestamp())
    headers = generic_headers(hook.secret, body, stamp, "d-1")
    del headers["X-Signature-Timestamp"]
    return local.post(hook, body, headers)


def _no_delivery_id(local: Local, hook: OpenedHook) -> TestResponse:
    body = github_body(PASSED)
    headers = github_headers(hook.secret, body)
    del headers["X-GitHub-Delivery"]
    return local.post(hook, body, headers)


def _bad_delivery_id(local: Local, hook: OpenedHook) -> TestResponse:
    return local.github(hook, delivery="../../etc")


def _form_encoded(local: Local, hook: OpenedHook) -> TestResponse:
    body = b"payload=" + json.dumps(PASSED).encode()
    headers = {
        **github_headers(hook.secret, body),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    return local.post(hook, body, headers)


def _oversized(local: Local, hook: OpenedHook) -> TestResponse:
    body = github_body({"log": "x" * MAX_EVENT_BYTES})
    return local.post(hook, body, github_headers(hook.secret, body))


def _not_json(local: Local, hook: OpenedHook) -> TestResponse:
    body = b'{"conclusion": "success",'
    return local.post(hook, body, github_headers(hook.secret, body))


def _not_a_number(local: Local, hook: OpenedHook) -> TestResponse:
    body = b'{"conclusion": "success", "ratio": NaN}'
    return local.post(hook, body, github_headers(hook.secret, body))


def _schema_refuses(local: Local, hook: OpenedHook) -> TestResponse:
    return local.github(hook, {"conclusion": "maybe"})


REFUSALS = {
    "unknown hook": (_unknown, 404, "hook_id", "no such hook"),
    "malformed hook id": (_malformed_id, 404, "hook_id", "no such hook"),
    "no signature": (_unsigned, 401, "X-Hub-Signature-256", "must be signed"),
    "another secret": (_other_secret, 401, "X-Hub-Signature-256", "does not match"),
    "changed body": (_changed_body, 401, "X-Hub-Signature-256", "does not match"),
    "malformed signature": (_malformed_signature, 401, "X-Hub-Signature-256", "sha256=<64 hex"),
    "stale timestamp": (_stale, 401, "X-Signature-Timestamp", "more than the 5 minutes"),
    "future timestamp": (_future, 401, "X-Signature-Timestamp", "more than the 5 minutes"),
    "no timestamp": (_no_timestamp, 401, "X-Signature-Timestamp", "missing"),
    "no delivery id": (_no_delivery_id, 400, "X-GitHub-Delivery", "delivery id is missing"),
    "bad delivery id": (_bad_delivery_id, 400, "X-GitHub-Delivery", "a delivery id is"),
    "form-encoded": (_form_encoded, 415, "Content-Type", "set the webhook's Content type"),
    "oversized": (_oversized, 413, "body", "262,144-byte limit"),
    "not JSON": (_not_json, 400, "body", "not JSON"),
    "NaN": (_not_a_number, 400, "body", "NaN is not a JSON number"),
    "schema refuses": (_schema_refuses, 422, "body.conclusion", "'maybe' is not one of"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refused_delivery_is_a_clear_4xx_and_changes_nothing(local, case):
    send, status, field, words = REFUSALS[case]
    hook = local.park()
    before = local.tables()
    answer = send(local, hook)
    assert answer.status_code == status, answer.data
    assert answer.content_type == "application/json"
    assert answered(answer)["problems"][0]["field"] == field
    assert words in answered(answer)["error"]
    assert local.tables() == before
    assert local.head("run-1").status is RunStatus.WAITING


def test_an_unknown_hook_and_a_malformed_id_get_the_same_answer(local):
    hook = local.park()
    assert _unknown(local, hook).data == _malformed_id(local, hook).data


def test_a_run_that_ended_takes_no_delivery(local):
    hook = local.park()
    local.github(hook)
    local.work("run-1")
    before = local.tables()
    answer = local.github(hook, delivery="a-new-one")
    assert answer.status_code == 409
    assert "done: it takes no more events" in answered(answer)["error"]
    assert local.tables() == before


def test_a_wait_that_takes_no_webhook_refuses_the_delivery(local):
    local.start(trusted=True)
    hook = local.hooks.open("run-1", "ci-finished")  # made before the run waits: allowed
    local.work("run-1")
    before = local.tables()
    answer = local.github(hook)
    assert answer.status_code == 403
    assert "not from a webhook" in answered(answer)["error"]
    assert local.tables() == before
    with pytest.raises(WebhooksNotTaken):
        local.hooks.open("run-1", "ci-finished")


def test_refusals_are_throttled_per_address_and_signed_deliveries_never(local):
    hook = local.park()
    local.github(hook)
    before = local.tables()

    # Junk from one address: its first ten refusals are answered, then it is told to slow down
    junk = [_unsigned(local, hook).status_code for _ in range(12)]
    assert junk == [401] * 10 + [429] * 2
    # The hook's signed deliveries, from that same address, are never counted nor refused
    assert [local.github(hook).status_code for _ in range(12)] == [200] * 12
    # Another address has a bucket of its own
    body = github_body(PASSED)
    elsewhere = local.client.post(
        f"/hooks/{hook.hook.hook_id}",
        data=body,
        headers={**github_headers(hook.secret, body), "X-Hub-Signature-256": "sha256=" + "0" * 64},
        environ_base={"REMOTE_ADDR": "203.0.113.7"},
    )
    assert elsewhere.status_code == 401
    assert local.tables() == before
    local.ticks.now += 1.0  # five tokens a second
    assert _unsigned(local, hook).status_code == 401


def test_a_body_over_the_limit_is_refused_with_or_without_serve_in_front(local):
    hook = local.park()
    before = local.tables()
    # The route itself checks it too, where `ratchet serve` is not in front (on AWS).
    bare = Client(wsgi_app([("/hooks/", build_app(lambda: local.services))]))
    body = github_body({"log": "x" * MAX_EVENT_BYTES})
    for client in (local.client, bare):
        answer = client.post(
            f"/hooks/{hook.hook.hook_id}", data=body, headers=github_headers(hook.secret, body)
        )
        assert answer.status_code == 413
        assert answered(answer)["problems"][0]["field"] == "body"
    assert local.tables() == before


class _Unread(io.RawIOBase):
    """A request body that must not be read: `ratchet serve` refuses it on its length."""

    def readinto(self, buffer: Any) -> int:
        raise AssertionError("the body was read")


def test_ratchet_serve_refuses_a_body_over_the_limit_without_reading_it(local):
    hook = local.park()
    environ = EnvironBuilder(
        path=f"/hooks/{hook.hook.hook_id}", method="POST", content_type="application/json"
    ).get_environ()
    environ["wsgi.input"] = _Unread()
    environ["CONTENT_LENGTH"] = str(MAX_EVENT_BYTES + 1)
    app = wsgi_app([("/hooks/", build_app(lambda: local.services))], body_limits=[BODY_LIMIT])
    body, status, _ = run_wsgi_app(app, environ, buffered=True)
    assert status == "413 REQUEST ENTITY TOO LARGE"
    assert json.loads(b"".join(body))["problems"] == [
        {"field": "body", "message": "body: over the 262,144-byte limit"}
    ]


# --- making a hook ------------------------------------------------------------------------------


def test_a_hook_is_the_same_each_time_and_its_key_is_the_owners_alone(local):
    local.start()
    first = local.hooks.open("run-1", "ci-finished")
    again = local.hooks.open("run-1", "ci-finished")
    assert again == first
    assert hook_url(local.runtime, "run-1", "ci-finished") == first.url
    assert first.url == f"http://127.0.0.1:8765/hooks/{first.hook.hook_id}"
    other = local.start("run-2")
    assert local.hooks.open(other, "ci-finished").hook.hook_id != first.hook.hook_id
    key = local.root / "s.hook-key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    # The secret is nowhere in the store: it is derived from the id and the key.
    assert first.secret not in repr(local.tables())


@pytest.mark.parametrize(
    ("run_id", "name", "error"),
    [
        ("nope", "ci-finished", RunNotFound),
        ("run-1", "bad name!", InvalidInput),
        ("run-1", "deploy-done", EventNotAwaited),
    ],
)
def test_a_hook_refused_at_making_writes_nothing(local, run_id, name, error):
    local.start()
    before = local.tables()
    with pytest.raises(error):
        local.hooks.open(run_id, name)
    assert local.tables() == before


def test_a_run_that_ended_gets_no_hook(local):
    hook = local.park()
    local.github(hook)
    local.work("run-1")
    before = local.tables()
    with pytest.raises(RunEnded):
        local.hooks.open("run-1", "deploy")
    assert local.tables() == before


def test_the_runs_api_opens_the_same_hook_and_its_secret_signs_a_delivery(local):
    local.start()
    status, opened = local.open_through_api("run-1", "ci-finished")
    made = local.hooks.open("run-1", "ci-finished")
    assert (status, opened) == (
        200,
        {
            "run_id": "run-1",
            "name": "ci-finished",
            "hook_id": made.hook.hook_id,
            "url": made.url,
            "secret": made.secret,
        },
    )
    # The Python API answers the same, and shows no secret in its repr.
    hooked = RatchetClient(local.runtime).hook("run-1", "ci-finished")
    assert hooked.model_dump() == opened
    assert made.secret not in repr(hooked)

    local.work("run-1")
    assert local.github(made).status_code == 200
    local.work("run-1")
    assert local.head("run-1").status is RunStatus.DONE


@pytest.mark.parametrize(
    ("run_id", "name", "status", "field"),
    [
        ("nope", "ci-finished", 404, "run_id"),
        ("run-1", "deploy-done", 404, "name"),
        ("run-1", "bad name!", 400, "name"),
    ],
)
def test_the_runs_api_refuses_a_hook_naming_the_field_and_writes_nothing(
    local, run_id, name, status, field
):
    local.start()
    before = local.tables()
    code, refused = local.open_through_api(run_id, name)
    assert (code, [p["field"] for p in refused["problems"]]) == (status, [field])
    assert local.tables() == before


def test_the_runs_api_refuses_a_hook_for_an_ended_run_or_a_wait_without_webhooks(local):
    local.start("trusted", trusted=True)
    local.work("trusted")
    before = local.tables()
    code, refused = local.open_through_api("trusted", "ci-finished")
    assert (code, refused["problems"][0]["field"]) == (403, "name")
    assert local.tables() == before
    hook = local.park()
    local.github(hook)
    local.work("run-1")
    assert local.head("run-1").status is RunStatus.DONE
    before = local.tables()
    code, refused = local.open_through_api("run-1", "ci-finished")
    assert (code, refused["problems"][0]["field"]) == (409, "run_id")
    assert local.tables() == before


def test_the_runs_api_takes_only_json_for_a_hook(local):
    local.start()
    answer = local.api.post("/runs/run-1/hooks/ci-finished", data="x", content_type="text/plain")
    assert answer.status_code == 415
    assert local.hooks.book.get(local.hooks.keys.hook_id("run-1", "ci-finished")) is None


# --- what is logged -----------------------------------------------------------------------------


def test_no_log_line_holds_the_secret_a_signature_or_the_payload(local, caplog):
    caplog.set_level(logging.DEBUG)
    marker = "payload-marker-5f3a9c"
    payload = {"conclusion": "success", "url": f"https://ci.example/{marker}"}
    hook = local.park()
    body = github_body(payload)
    signature = github_signature(hook.secret, body)
    forged = {
        **github_headers(hook.secret, body, "bad"),
        "X-Hub-Signature-256": "sha256=" + "0" * 64,
    }
    sent = [
        local.github(hook, {"conclusion": marker}, delivery="refused"),
        local.github(hook, payload, delivery="good-1"),
        local.github(hook, payload, delivery="good-1"),
        local.post(hook, body, forged),
        local.generic(hook, payload, delivery="late", skew=-3600),
    ]
    assert [a.status_code for a in sent] == [422, 200, 200, 401, 401]
    lines = [local.log_stream.getvalue()]
    lines += [f"{r.getMessage()} {r.__dict__!r}" for r in caplog.records]
    logged = "\n".join(lines)
    assert "webhook delivery taken" in logged
    assert "webhook delivery refused" in logged
    for secret in (hook.secret, signature.removeprefix("sha256="), marker):
        assert secret not in logged


def test_opening_a_hook_through_the_api_logs_its_id_and_not_its_secret(local, caplog):
    caplog.set_level(logging.DEBUG)
    local.start()
    status, opened = local.open_through_api("run-1", "ci-finished")
    assert status == 200
    lines = [local.log_stream.getvalue()]
    lines += [f"{r.getMessage()} {r.__dict__!r}" for r in caplog.records]
    logged = "\n".join(lines)
    assert opened["hook_id"] in logged
    assert opened["secret"] not in logged
