"""A person decides in a real browser (issue 6, "A real browser").

Debian's Chromium, driven by Playwright, against a real `ratchet serve` process: the link
comes from the outbox as it would from an email, a plain GET of it (what a mail scanner or a
link unfurler does) changes nothing, the page shows the request, the buttons decide once,
and the next worker finishes the run with the answer.

`RATCHET_SCREENSHOT=docs/approval-page.png` (see `make screenshot`) also writes the pending
page to that file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Locator, Page, expect, sync_playwright

from ratchet.runtime.local import LocalRuntime, LocalSettings
from tests.fixtures import refund_agent

pytestmark = pytest.mark.slow

RATCHET = Path(sys.executable).with_name("ratchet")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium calls Google's hosts at start, which CI cannot reach.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OPERATOR = "ada"  # local links are addressed to the user who runs `ratchet`: the tests say who
PROMPT = "Drop legacy_orders. All 2 batches (2,000 rows) are copied into orders"
WAITING_STEP = 4  # 1 inspect, 2-3 copy, 4 ask; then 5 drop (if approved), 6 email, done
SCRUBBED = {"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "RATCHET_FAULT", "RATCHET_STORE"}
COMMAND_TIMEOUT = 60
SERVER_START_SECONDS = 20
UI_TIMEOUT_MS = 15_000
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"  # when a person decided, as the page says it


@dataclass
class Local:
    """A store of its own and a `ratchet serve` for it; the links point at that server."""

    db: Path
    public_url: str
    env: dict[str, str]

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(RATCHET), *args],
            env=self.env,
            cwd=self.db.parent,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )

    def ok(self, *args: str) -> str:
        done = self(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def json(self, *args: str) -> dict[str, Any]:
        payload = json.loads(self.ok(*args, "--json"))
        assert isinstance(payload, dict)
        return payload

    def park_migration(self, run_id: str) -> str:
        """Run the migration until it waits for a person; return the link the email carries."""
        out = self.ok("run", "--scenario", "migration", "--batches", "2", "--run-id", run_id)
        assert f"{run_id}: waiting at step {WAITING_STEP}" in out
        assert f"Approve or reject at: {self.public_url}/approvals/" in out
        emails = [
            json.loads(path.read_text(encoding="utf-8"))
            for path in sorted(self.db.with_suffix(".outbox").glob(f"{run_id}-step-*.json"))
        ]
        assert [(m["channel"], m["to"]) for m in emails] == [("email", OPERATOR)]
        link = emails[0]["link"]
        assert isinstance(link, str)
        assert link.startswith(f"{self.public_url}/approvals/")
        return link

    def status(self, run_id: str) -> dict[str, Any]:
        return self.json("status", run_id)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _serve(
    env: dict[str, str], log: Path, *, worker: bool
) -> tuple[subprocess.Popen[str], str] | None:
    """Start `ratchet serve` on a free port and wait until it listens; None if it could not
    have the port (another process took it between the probe and the bind)."""
    port = _free_port()
    public_url = f"http://127.0.0.1:{port}"
    with log.open("w") as output:
        server = subprocess.Popen(
            [str(RATCHET), "serve", "--port", str(port), *([] if worker else ["--no-worker"])],
            env=env | {"RATCHET_PUBLIC_URL": public_url, "PYTHONUNBUFFERED": "1"},
            cwd=log.parent,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    # Its banner is printed once it holds the port, so the connection is to this server.
    banner = f"Serving approvals on {public_url}"
    deadline = time.monotonic() + SERVER_START_SECONDS
    while server.poll() is None:
        if banner in log.read_text() and _accepts_connections(port):
            return server, public_url
        assert time.monotonic() < deadline, f"ratchet serve did not listen: {log.read_text()}"
        time.sleep(0.05)
    return None


@contextmanager
def serving(tmp_path: Path, *, worker: bool = False) -> Iterator[Local]:
    """`ratchet serve` on a fresh store in `tmp_path`, run as the operator; with no worker of
    its own unless `worker` (the tests work the runs with workers they start and stop)."""
    db = tmp_path / "ratchet.db"
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env |= {"RATCHET_STORE": f"sqlite:///{db}", "LOGNAME": OPERATOR, "USER": OPERATOR}
    log = tmp_path / "serve.log"
    started = (
        _serve(env, log, worker=worker)
        or _serve(env, log, worker=worker)
        or _serve(env, log, worker=worker)
    )
    assert started is not None, log.read_text()
    server, public_url = started
    try:
        yield Local(db, public_url, env | {"RATCHET_PUBLIC_URL": public_url})
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    with serving(tmp_path) as served:
        yield served


@contextmanager
def chromium(profile: Path, *, width: int, height: int) -> Iterator[BrowserContext]:
    """Debian's Chromium, driven by Playwright, with a fresh profile at `profile`."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: `make unit` installs Debian's chromium")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            viewport={"width": width, "height": height},
        )
        context.set_default_timeout(UI_TIMEOUT_MS)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[BrowserContext]:
    # A fresh profile for every test; narrow and short: the screenshot is as tall as the
    # page, and no taller.
    with chromium(tmp_path / "chromium-profile", width=820, height=480) as context:
        yield context


def _scan(link: str) -> str:
    """What a mail scanner does with every link: fetch it, follow nothing, submit nothing."""
    with urllib.request.urlopen(link, timeout=COMMAND_TIMEOUT) as response:
        assert response.status == 200
        body: str = response.read().decode("utf-8")
        return body


def _detail(page: Page, name: str) -> Locator:
    return page.locator("tr").filter(has=page.locator("th", has_text=name)).locator("td")


def _open_pending_request(page: Page, link: str, run_id: str) -> None:
    response = page.goto(link)
    assert response is not None
    assert response.status == 200
    expect(page).to_have_title("Approval needed · Ratchet")
    _shows_what_was_asked(page, run_id, verb="asks")
    expect(page.locator("#before li")).to_have_text(
        [
            "Step 1, inspect_table: legacy_orders has 2,000 rows (2 batches of 1,000).",
            "Step 2, copy_batch: Copied 1,000 rows (ids 1-1,000) in batch 1.",
            "Step 3, copy_batch: Copied 1,000 rows (ids 1,001-2,000) in batch 2.",
        ]
    )
    expect(page.get_by_text(f"You decide as {OPERATOR}.")).to_be_visible()
    expect(page.get_by_role("button", name="Approve")).to_be_visible()
    expect(page.get_by_role("button", name="Reject")).to_be_visible()


def _shows_what_was_asked(page: Page, run_id: str, *, verb: str) -> None:
    """The request as it was asked: which step asks, the question, the call and its
    details; the same before and after the decision."""
    expect(page.locator("#asker")).to_have_text(
        f"Step {WAITING_STEP} of run {run_id}, agent migration, {verb}:"
    )
    expect(page.get_by_role("heading", level=1)).to_have_text(PROMPT)
    expect(_detail(page, "tool call")).to_have_text(
        f'request_approval(action="Drop legacy_orders", reason="{PROMPT.split(". ")[1]}")'
    )
    expect(_detail(page, "action")).to_have_text("Drop legacy_orders")
    expect(_detail(page, "reason")).to_have_text(
        "All 2 batches (2,000 rows) are copied into orders"
    )


_LINES_SCRIPT = """element => {
    const lines = [];
    let top = null;
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (let i = 0; i < node.length; i++) {
            const range = document.createRange();
            range.setStart(node, i);
            range.setEnd(node, i + 1);
            const box = range.getBoundingClientRect();
            if (box.width === 0 && box.height === 0) continue;
            if (top === null || box.top > top + box.height / 2) {
                lines.push("");
                top = box.top;
            }
            lines[lines.length - 1] += node.data[i];
        }
    }
    return lines;
}"""


def rendered_lines(element: Locator) -> list[str]:
    """The element's text as the browser laid it out, a string per line."""
    lines = element.evaluate(_LINES_SCRIPT)
    assert isinstance(lines, list)
    return [str(line) for line in lines]


def breaks_between_words(lines: list[str]) -> bool:
    """Whether text laid out on `lines` wraps only at a space or after a comma, never inside
    a name or a word."""
    return all(line.endswith((" ", ",")) for line in lines[:-1])


def _screenshot_if_asked(page: Page) -> None:
    target = os.environ.get("RATCHET_SCREENSHOT")
    shot = page.screenshot(full_page=True, animations="disabled")
    assert shot.startswith(b"\x89PNG")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_bytes(shot)


def _scanner_changes_nothing(local: Local, run_id: str, link: str) -> None:
    before = local.status(run_id)
    body = _scan(link)
    assert PROMPT in body
    after = local.status(run_id)
    assert after["status"] == "waiting"
    assert after["step"] == WAITING_STEP
    assert after["version"] == before["version"], "a GET wrote a checkpoint"


def _step_result(local: Local, run_id: str, step: int) -> str:
    results = local.json("show", run_id)["tool_results"]
    (text,) = [r["text"] for r in results if r["step"] == step]
    assert isinstance(text, str)
    return text


def _already_decided(page: Page, link: str, run_id: str, verb: str) -> None:
    response = page.goto(link)
    assert response is not None
    assert response.status == 409
    expect(page).to_have_title("Already decided · Ratchet")
    expect(page.locator("#decided")).to_have_text(
        re.compile(rf"Already decided\. This request was {verb} by {OPERATOR} at {WHEN}\.")
    )
    _shows_what_was_asked(page, run_id, verb="asked")
    expect(page.get_by_role("button")).to_have_count(0)


def test_approving_from_the_link_resumes_the_run_and_drops_the_table(local, browser):
    # Given a migration run waiting for a person, and the link its email carries
    run_id = "migrate-orders"
    link = local.park_migration(run_id)
    _scanner_changes_nothing(local, run_id, link)
    page = browser.new_page()

    # When the person opens the link, reads the request and approves with a comment
    _open_pending_request(page, link, run_id)
    _screenshot_if_asked(page)
    page.get_by_label("Comment (optional)").fill("Copy checked against the nightly export.")
    page.get_by_role("button", name="Approve").click()

    # Then the page confirms, the next worker finishes the run, and legacy_orders is gone
    expect(page).to_have_title("Approved · Ratchet")
    expect(page.locator("#decided")).to_have_text(
        re.compile(rf"Approved by {OPERATOR} at {WHEN}\. No worker runs beside")
    )
    # (This server has no worker of its own: the page says what to run.)
    expect(page.get_by_text("run `ratchet worker` and the run resumes")).to_be_visible()
    _shows_what_was_asked(page, run_id, verb="asked")
    expect(page.get_by_text("Comment: Copy checked against the nightly export.")).to_be_visible()
    assert local.status(run_id)["status"] != "waiting"
    local.ok("worker", "--until-idle")
    assert local.status(run_id)["status"] == "done"
    report = local.json("verify", run_id)
    assert report["ok"], report
    assert report["legacy_dropped"] is True
    assert report["emails_sent"] == 1
    approval = _step_result(local, run_id, WAITING_STEP)
    assert re.match(rf"Approved by {OPERATOR}\b", approval)
    assert "Copy checked against the nightly export." in approval
    _already_decided(page, link, run_id, "approved")


def test_serves_own_worker_finishes_the_run_once_approved_with_no_other_command(tmp_path, browser):
    # Given `ratchet serve` with its worker, and a migration started: the worker parks it
    with serving(tmp_path, worker=True) as local:
        run_id = "migrate-served"
        local.ok("start", "--scenario", "migration", "--batches", "2", "--run-id", run_id)
        link = _outbox_link(local, run_id)
        assert link.startswith(f"{local.public_url}/approvals/")
        _until(local, run_id, "waiting")
        page = browser.new_page()

        # When the person opens the link and approves
        _open_pending_request(page, link, run_id)
        page.get_by_role("button", name="Approve").click()

        # Then the page says the run resumes, and it does: done, with no other command run
        expect(page).to_have_title("Approved · Ratchet")
        expect(page.locator("#decided")).to_have_text(
            re.compile(rf"Approved by {OPERATOR} at {WHEN}\. The run resumes")
        )
        _until(local, run_id, "done")
        report = local.json("verify", run_id)
        assert report["ok"], report
        assert report["legacy_dropped"] is True


def _outbox_link(local: Local, run_id: str) -> str:
    deadline = time.monotonic() + COMMAND_TIMEOUT
    outbox = local.db.with_suffix(".outbox")
    while not (found := sorted(outbox.glob(f"{run_id}-step-*.json"))):
        assert time.monotonic() < deadline, f"{run_id} never asked for approval"
        time.sleep(0.1)
    link = json.loads(found[0].read_text(encoding="utf-8"))["link"]
    assert isinstance(link, str)
    return link


def _until(local: Local, run_id: str, status: str) -> None:
    """Poll the store (no CLI start-up per poll) until the run has `status`."""
    deadline = time.monotonic() + COMMAND_TIMEOUT
    while True:
        runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{local.db}"), create=False)
        try:
            head = runtime.store.load_head(run_id)
        finally:
            runtime.close()
        if head is not None and head.status.value == status:
            return
        now = head.status.value if head else "missing"
        assert time.monotonic() < deadline, f"{run_id} is {now}, never {status}"
        time.sleep(0.1)


def test_rejecting_with_a_reason_resumes_the_run_and_keeps_the_table(local, browser):
    # Given a migration run waiting for a person, and the link its email carries
    run_id = "migrate-orders-kept"
    link = local.park_migration(run_id)
    _scanner_changes_nothing(local, run_id, link)
    page = browser.new_page()

    # When the person opens the link and rejects, giving a reason
    _open_pending_request(page, link, run_id)
    page.get_by_label("Comment (optional)").fill("Finance still reads legacy_orders.")
    page.get_by_role("button", name="Reject").click()

    # Then the page confirms, and the run records the rejection and goes on without the drop
    expect(page).to_have_title("Rejected · Ratchet")
    expect(page.locator("#decided")).to_have_text(
        re.compile(rf"Rejected by {OPERATOR} at {WHEN}\. No worker runs beside")
    )
    _shows_what_was_asked(page, run_id, verb="asked")
    local.ok("worker", "--until-idle")
    status = local.status(run_id)
    assert status["status"] == "done"
    assert "legacy_orders was kept" in status["summary"]
    report = local.json("verify", run_id)
    assert report["ok"], report
    assert report["legacy_dropped"] is False
    assert report["source_rows"] == 2_000
    rejection = _step_result(local, run_id, WAITING_STEP)
    assert rejection.startswith("Rejected")
    assert "Finance still reads legacy_orders." in rejection
    _already_decided(page, link, run_id, "rejected")


def test_answering_a_structured_question_through_the_form(local, browser):
    # Given an agent whose tool asks how much to refund, with an answer model
    shutil.copy(refund_agent.__file__, local.db.parent / "refunds.py")
    run_id = "refund-a1042"
    out = local.ok("run", "--agent", "refunds:agent", "--run-id", run_id)
    assert f"{run_id}: waiting at step 1" in out
    (outbox,) = sorted(local.db.with_suffix(".outbox").glob(f"{run_id}-step-*.json"))
    link = json.loads(outbox.read_text(encoding="utf-8"))["link"]
    page = browser.new_page()

    # When the person opens the link, the page shows the question, its details and a form
    response = page.goto(link)
    assert response is not None
    assert response.status == 200
    expect(page.get_by_role("heading", level=1)).to_have_text(refund_agent.QUESTION)
    expect(_detail(page, "order")).to_have_text("A-1042")
    amount = page.get_by_label("Amount")
    expect(amount).to_have_attribute("type", "number")
    expect(page.get_by_label("Reason")).to_have_value('"damaged"')
    version = local.status(run_id)["version"]

    # And asks for too much: the server refuses, naming the field, and nothing changes
    amount.fill("600")
    page.get_by_label("Reason").select_option(label="late")
    page.get_by_role("button", name="Approve").click()
    expect(page).to_have_title("Approval needed · Ratchet")
    expect(page.get_by_role("alert")).to_contain_text("amount: must be at most 500, not 600")
    expect(page.get_by_label("Reason")).to_have_value('"late"')
    assert local.status(run_id)["status"] == "waiting"
    assert local.status(run_id)["version"] == version

    # When they give a good amount
    page.get_by_label("Amount").fill("120")
    page.get_by_role("button", name="Approve").click()

    # Then the run resumes, and its next step reads the answer as the result
    expect(page).to_have_title("Approved · Ratchet")
    expect(page.locator("table.answer")).to_contain_text("120")
    local.ok("worker", "--until-idle")
    status = local.status(run_id)
    assert status["status"] == "done"
    answer = f'Approved by {OPERATOR}: {{"amount": 120, "reason": "late"}}'
    assert status["summary"] == f"refund decided: {answer}"
    assert _step_result(local, run_id, 1) == answer


def test_a_narrow_page_wraps_the_tool_call_between_words(local, tmp_path):
    # Given a request whose call is wider than a phone's screen
    run_id = "migrate-orders-narrow"
    link = local.park_migration(run_id)

    # When it is opened 360 pixels wide
    with chromium(tmp_path / "narrow-profile", width=360, height=640) as narrow:
        page = narrow.new_page()
        page.goto(link)
        call = _detail(page, "tool call")
        lines = rendered_lines(call)

    # Then the call wraps, at spaces and after commas only: each name is whole on its line
    assert len(lines) > 1, lines
    assert breaks_between_words(lines), lines
    assert lines[0].startswith('request_approval(action="'), lines
