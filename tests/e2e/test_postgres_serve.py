"""`ratchet serve` on a Postgres store, in real processes (issue 39, point 3): a run started
through its runs API is parked by its worker, approved in a real browser and finished; the
dashboard lists it and its feed reads it; a hook delivers an event to a run waiting on it; and
a link a worker on one "host" sends is decided on a serve on another.

Each "host" is a working directory of its own: a Postgres store's processes keep their own
files (the outbox, each run's folder, serve's address) under the working directory's
`.ratchet/postgres/...`, and share the rest, the keys links and hooks are signed with among
it, through the database."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, expect

from ratchet.runtime import runtime_for
from ratchet.runtime.local import LocalSettings
from ratchet.state import RunStatus
from ratchet.waiting.hooks import github_signature
from tests.e2e.test_approval_browser import OPERATOR, chromium
from tests.postgres_support import Cluster
from tests.processes import RATCHET, Served, checkout_env, serving

pytestmark = pytest.mark.slow

PATIENCE = 60.0
"""How long a test waits for what takes a second or two when it works."""


@dataclass
class Host:
    """A process's view of the store from a working directory of its own."""

    folder: Path
    url: str

    def argv(self, *args: str) -> list[str]:
        return [*RATCHET, "--store", self.url, *args]

    def ok(self, *args: str, **env: str) -> str:
        done = subprocess.run(
            self.argv(*args),
            cwd=self.folder,
            env=_env(**env),
            capture_output=True,
            text=True,
            timeout=PATIENCE * 2,
            check=False,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def serve(self, *flags: str) -> AbstractContextManager[Served]:
        return serving(
            self.argv("serve", "--port", "0", *flags),
            log=self.folder / f"serve-{time.monotonic_ns()}.log",
            env=_env(),
            cwd=self.folder,
        )

    def outbox_link(self, run_id: str) -> str:
        """The approval link of the email this host's worker wrote for `run_id`."""
        deadline = time.monotonic() + PATIENCE
        pattern = f".ratchet/postgres/*/ratchet.outbox/{run_id}-step-*.json"
        while not (found := sorted(self.folder.glob(pattern))):
            assert time.monotonic() < deadline, f"no approval email for {run_id}"
            time.sleep(0.1)
        link = json.loads(found[-1].read_text(encoding="utf-8"))["link"]
        assert isinstance(link, str)
        return link


def _env(**extra: str) -> dict[str, str]:
    env = checkout_env(PYTHONUNBUFFERED="1", LOGNAME=OPERATOR, USER=OPERATOR, **extra)
    if "RATCHET_PUBLIC_URL" not in extra:
        env.pop("RATCHET_PUBLIC_URL", None)
    return env


@pytest.fixture
def store(postgres: Cluster) -> Iterator[str]:
    name = postgres.fresh_database()
    yield postgres.url(name)
    postgres.drop_database(name)


def _host(tmp_path: Path, name: str, store: str) -> Host:
    folder = tmp_path / name
    folder.mkdir()
    return Host(folder, store)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[BrowserContext]:
    with chromium(tmp_path / "chromium-profile", width=820, height=600) as context:
        yield context


def _status(store: str, run_id: str) -> RunStatus | None:
    runtime = runtime_for(LocalSettings(store=store), create=False)
    try:
        head = runtime.store.load_head(run_id)
    finally:
        runtime.close()
    return head.status if head is not None else None


def _version(store: str, run_id: str) -> int:
    runtime = runtime_for(LocalSettings(store=store), create=False)
    try:
        head = runtime.store.load_head(run_id)
    finally:
        runtime.close()
    assert head is not None
    return head.version


def _until_status(store: str, run_id: str, wanted: RunStatus) -> None:
    deadline = time.monotonic() + PATIENCE
    while (status := _status(store, run_id)) is not wanted:
        assert time.monotonic() < deadline, f"{run_id} is {status}, never {wanted.value}"
        time.sleep(0.1)


def _request(
    url: str, *, data: Any = None, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    headers = dict(headers or {})
    if data is not None:
        body, headers["Content-Type"] = json.dumps(data).encode(), "application/json"
    asked = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(asked, timeout=PATIENCE) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_a_run_started_through_serve_is_approved_in_chromium_finished_and_listed(
    store: str, tmp_path: Path, browser: BrowserContext
) -> None:
    host = _host(tmp_path, "host", store)
    with host.serve() as served:
        # Given a migration started through the runs API, which serve's worker parks
        status, body = _request(
            f"{served.base}/runs", data={"scenario": "migration", "batches": 2, "run_id": "m1"}
        )
        assert status == 201, body
        link = host.outbox_link("m1")
        assert link.startswith(f"{served.base}/approvals/"), link
        _until_status(store, "m1", RunStatus.WAITING)

        # When the person opens the emailed link in a browser and approves, while a program
        # long-polls the run's history for what comes after its last record
        page = browser.new_page()
        opened = page.goto(link)
        assert opened is not None
        assert opened.status == 200
        expect(page).to_have_title("Approval needed · Ratchet")
        parked = _version(store, "m1")
        polled: list[tuple[int, str, float]] = []
        poll = threading.Thread(
            target=lambda: polled.append(
                (
                    *_request(f"{served.base}/runs/m1/history?after={parked}&wait=20"),
                    time.monotonic(),
                )
            )
        )
        poll.start()
        clicked = time.monotonic()
        page.get_by_role("button", name="Approve").click()
        expect(page).to_have_title("Approved · Ratchet")

        # Then the long poll is answered with the records the decision wrote
        poll.join(PATIENCE)
        ((status, history, answered),) = polled
        assert status == 200, history
        versions = [record["version"] for record in json.loads(history)["checkpoints"]]
        assert versions, history
        assert min(versions) > parked, (parked, versions)
        print(f"long poll answered {(answered - clicked) * 1000:.0f} ms after the click")

        # And serve's worker finishes the run, with no other command
        _until_status(store, "m1", RunStatus.DONE)

        # And the dashboard lists it, done, and its feed reads it to its end
        listed = page.goto(f"{served.base}/dashboard")
        assert listed is not None
        assert listed.status == 200
        row = page.locator("tbody tr").filter(has=page.get_by_role("link", name="m1"))
        expect(row.locator("td").nth(2)).to_have_text("done")
        status, feed = _request(f"{served.base}/runs/m1/feed")
        assert status == 200, feed
        assert "event: end" in feed, feed
    assert "Traceback" not in served.printed, served.printed


def test_the_dashboard_shows_a_runs_page_with_its_deliveries(store: str, tmp_path: Path) -> None:
    host = _host(tmp_path, "host", store)
    host.ok("start", "--scenario", "notebook", "--run-id", "n1")
    with host.serve("--no-worker") as served:
        status, page = _request(f"{served.base}/dashboard/runs/n1")
    assert status == 200, page
    assert "Webhook deliveries" in page, page


def test_a_hook_delivers_an_event_through_serve_to_the_run_waiting_on_it(
    store: str, tmp_path: Path
) -> None:
    # Given a run that waits for a `ci-finished` event from a webhook
    host = _host(tmp_path, "host", store)
    host.ok("start", "--agent", "tests.hooks_agent:agent", "--run-id", "r1")
    host.ok("worker", "--until-idle")
    assert _status(store, "r1") is RunStatus.WAITING
    with host.serve() as served:
        made = json.loads(
            host.ok("hook", "r1", "ci-finished", "--json", RATCHET_PUBLIC_URL=served.base)
        )
        assert made["url"].startswith(f"{served.base}/hooks/"), made

        # When the sender POSTs a signed delivery to the hook's URL
        body = b'{"conclusion":"success"}'
        status, answer = _request(
            made["url"],
            body=body,
            headers={
                "Content-Type": "application/json",
                "X-Hub-Signature-256": github_signature(made["secret"], body),
                "X-GitHub-Delivery": "d-1",
            },
        )

        # Then the event is delivered, and serve's worker finishes the run with it
        assert status == 200, answer
        assert json.loads(answer)["status"] == "delivered", answer
        _until_status(store, "r1", RunStatus.DONE)
    runtime = runtime_for(LocalSettings(store=store), create=False)
    try:
        head = runtime.store.load_head("r1")
    finally:
        runtime.close()
    assert head is not None
    assert '"conclusion": "success"' in (head.summary or ""), head.summary


def test_a_link_a_worker_on_one_host_sends_is_decided_on_a_serve_on_another(
    store: str, tmp_path: Path
) -> None:
    # Given a serve on host B, and people reached through it
    host_a, host_b = _host(tmp_path, "a", store), _host(tmp_path, "b", store)
    with host_b.serve("--no-worker") as served:
        # When a worker on host A parks a migration for a person, emailing a link to B
        host_a.ok("start", "--scenario", "migration", "--batches", "2", "--run-id", "m1")
        host_a.ok("worker", "--until-idle", RATCHET_PUBLIC_URL=served.base)
        assert _status(store, "m1") is RunStatus.WAITING
        link = host_a.outbox_link("m1")
        assert link.startswith(f"{served.base}/approvals/"), link

        # Then B verifies A's link and takes the decision
        status, page = _request(link)
        assert status == 200, page
        status, page = _request(link, body=b"decision=approve&comment=", headers=_FORM)
        assert status == 200, page
        assert "Approved" in page, page

    # And a worker on host A finishes the run with it
    host_a.ok("worker", "--until-idle")
    assert _status(store, "m1") is RunStatus.DONE
    # No host keeps a key of its own: both signed with the store's
    assert not list(tmp_path.rglob("*.approval-key")), list(tmp_path.rglob("*.approval-key"))


_FORM = {"Content-Type": "application/x-www-form-urlencoded"}
