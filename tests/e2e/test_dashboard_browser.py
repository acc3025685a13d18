"""The runs dashboard in a real browser (issue 10, "A runs dashboard").

Debian's Chromium, driven by Playwright, against a real `ratchet serve` process and runs made
by real `ratchet` processes: one done, one failed, one cancelled, and one whose worker was
SIGKILLed mid-step and which another worker resumed until it waits for a person. The run list
shows and filters them; the resumed run's timeline shows the failed attempt and the step
committed on the retry, its charts, and the link to its pending approval, which opens the
approval page; reading the dashboard writes nothing.

`RATCHET_SCREENSHOT_DIR=docs` (see `make screenshot`) also writes the run list and the resumed
run's page to docs/dashboard-runs.png and docs/dashboard-run.png.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.e2e.test_approval_browser import (
    COMMAND_TIMEOUT,
    OPERATOR,
    PROMPT,
    RATCHET,
    WAITING_STEP,
    Local,
    breaks_between_words,
    chromium,
    rendered_lines,
    serving,
)

pytestmark = pytest.mark.slow

RESUMED = "copy-resumed"
CRASH_STEP = 2  # 1 inspect, 2 copy batch 1 (the doomed worker dies here), 3 copy, 4 ask
RUNS = {
    "notes-done": "done",
    "copy-failed": "failed",
    "copy-cancelled": "cancelled",
    RESUMED: "waiting",
}


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    with serving(tmp_path) as served:
        yield served


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[BrowserContext]:
    # The timeline is a wide table; the screenshots are as tall as the page.
    with chromium(tmp_path / "chromium-profile", width=1180, height=600) as context:
        yield context


def _ratchet(local: Local, *args: str, fault: str | None = None) -> int:
    """A `ratchet` command with a fault of its own: only this process crashes."""
    done = subprocess.run(
        [str(RATCHET), *args],
        env=local.env | ({"RATCHET_FAULT": fault} if fault else {}),
        cwd=local.db.parent,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    return done.returncode


def _worker(local: Local, name: str, *, fault: str | None = None) -> int:
    flags = ["--until-idle", "--worker-id", name, "--lease-seconds", "0.3"]
    return _ratchet(local, "worker", *flags, fault=fault)


def _make_runs(local: Local) -> None:
    local.ok("run", "--scenario", "notebook", "--run-id", "notes-done")
    migrate = ["run", "--scenario", "migration", "--batches", "2", "--run-id", "copy-failed"]
    assert _ratchet(local, *migrate, fault="raise:after_tool@2") == 1
    # A worker dies in the middle of step 2 (after its tool ran, before the commit); the
    # next worker takes the run over, does step 2 again and goes on until it asks a person.
    local.ok("start", "--scenario", "migration", "--batches", "2", "--run-id", RESUMED)
    assert _worker(local, "doomed", fault=f"kill:after_tool@{CRASH_STEP}") == -signal.SIGKILL
    assert local.status(RESUMED)["step"] == CRASH_STEP - 1
    assert _worker(local, "finisher") == 0
    local.ok("start", "--scenario", "migration", "--batches", "2", "--run-id", "copy-cancelled")
    local.ok("cancel", "copy-cancelled", "--reason", "wrong table")
    for run_id, status in RUNS.items():
        assert local.status(run_id)["status"] == status, run_id


def _screenshot_if_asked(page: Page, name: str) -> None:
    shot = page.screenshot(full_page=True, animations="disabled")
    assert shot.startswith(b"\x89PNG")
    folder = os.environ.get("RATCHET_SCREENSHOT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_bytes(shot)


ROOT = Path(__file__).resolve().parents[2]

# Every element and every piece of text in the timeline (its table, and what scrolls it), and
# the card's content box: where one lies past the other, and what it says.
_PAST_THE_CARD = """() => {
    const card = document.querySelector('main');
    const box = card.getBoundingClientRect();
    const style = getComputedStyle(card);
    const left = box.left + parseFloat(style.paddingLeft);
    const right = box.right - parseFloat(style.paddingRight);
    const past = [];
    const check = (rect, what) => {
        if (rect.width === 0 && rect.height === 0) return;
        if (rect.left < left - 0.5 || rect.right > right + 0.5)
            past.push(`${what} spans ${Math.round(rect.left)}..${Math.round(rect.right)}`);
    };
    const wrapper = document.querySelector('#timeline').parentElement;
    for (const element of [wrapper, ...wrapper.querySelectorAll('*')])
        check(element.getBoundingClientRect(), element.tagName);
    const walker = document.createTreeWalker(wrapper, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const range = document.createRange();
        range.selectNodeContents(node);
        check(range.getBoundingClientRect(), JSON.stringify(node.data.slice(0, 40)));
    }
    return {card: [Math.round(left), Math.round(right)], past: past};
}"""


def test_the_timeline_stays_inside_its_card_at_1280_px(local, tmp_path):
    # Given a run whose calls and results hold what no line can break where a word ends: the
    # path of each export and its SHA-512
    done = subprocess.run(
        [str(RATCHET), "run", "--agent", "tests.digest_agent:agent", "--run-id", "digests"],
        env=local.env | {"PYTHONPATH": str(ROOT)},
        cwd=local.db.parent,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert local.status("digests")["status"] == "done"

    # When its page is opened at 1280 px, a laptop's width
    with chromium(tmp_path / "laptop-profile", width=1280, height=800) as context:
        page = context.new_page()
        page.goto(f"{local.public_url}/dashboard/runs/digests")
        expect(page.locator("#timeline tbody tr").filter(has_text="sha512:")).to_have_count(3)
        measured = page.evaluate(_PAST_THE_CARD)

    # Then nothing of the timeline lies past the card: its long words wrap inside their cells
    print(f"card content box {measured['card']}, past it: {len(measured['past'])}")
    assert measured["past"] == [], measured


def test_the_dashboard_lists_runs_and_shows_a_resumed_runs_timeline(local, browser):
    # Given runs of several statuses, one of them resumed after its worker was killed
    _make_runs(local)
    before = {run_id: local.status(run_id)["version"] for run_id in RUNS}
    page = browser.new_page()

    # When the operator opens the dashboard
    response = page.goto(f"{local.public_url}/dashboard")
    assert response is not None
    assert response.status == 200

    # Then every run is listed with its agent and status
    expect(page).to_have_title("Runs · Ratchet")
    for run_id, status in RUNS.items():
        row = page.locator("tbody tr").filter(has=page.get_by_role("link", name=run_id))
        expect(row).to_have_count(1)
        expect(row.locator("td").nth(2)).to_have_text(status)
    expect(page.locator("tbody tr").filter(has_text="notes-done")).to_contain_text("notebook")
    expect(page.locator("tbody tr")).to_have_count(len(RUNS))
    _screenshot_if_asked(page, "dashboard-runs.png")

    # And a status filters the list
    page.get_by_role("link", name="failed", exact=True).click()
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator("tbody tr")).to_contain_text("copy-failed")
    page.get_by_role("link", name="all", exact=True).click()
    expect(page.locator("tbody tr")).to_have_count(len(RUNS))

    # When they open the resumed run
    page.get_by_role("link", name=RESUMED, exact=True).click()
    expect(page).to_have_title(f"Run {RESUMED} · Ratchet")

    # Then its timeline shows step 2's failed attempt and the step committed on the retry
    expect(page.locator("#retried")).to_have_text(f"Retried steps: {CRASH_STEP}.")
    steps = page.locator("#timeline tbody tr").filter(has_text="step committed")
    expect(steps).to_have_count(WAITING_STEP)
    retried = page.locator(f"#timeline tbody tr.retried[data-step='{CRASH_STEP}']")
    expect(retried).to_have_count(1)
    expect(retried).to_contain_text("2 (retried: the worker died during attempt 1)")
    expect(retried).to_contain_text("copy_batch")
    expect(retried).to_contain_text("finisher")
    first = page.locator("#timeline tbody tr[data-step='1']").filter(has_text="step committed")
    expect(first).to_contain_text("doomed")
    # And the doomed worker's attempt is said to have died, just before the retry's record
    died = page.locator("#timeline tbody tr.gap").filter(has_text="the worker died")
    expect(died).to_have_text(
        re.compile(
            rf"^\d+\.\.\d+\s*Attempt 1 at step {CRASH_STEP}: the worker died during this "
            r"attempt \(the attempt was counted, but no record was written\); attempt 2 "
            r"counted as its work started$"
        )
    )
    # And it is the one attempt row: the attempt each other step counted, then committed, is
    # bookkeeping, not news
    expect(page.locator("#timeline tbody tr.gap")).to_have_count(1)

    # And the charts of step duration and bytes written are drawn, one mark per step/write
    charts = page.locator("svg.chart")
    expect(charts).to_have_count(2)
    expect(page.locator("svg[aria-label='Step duration'] rect.bar")).to_have_count(WAITING_STEP)
    checkpoints = page.locator("#timeline tbody tr[data-version]").count()
    expect(page.locator("svg[aria-label='Bytes written'] circle.dot")).to_have_count(checkpoints)
    expect(page.locator("svg[aria-label='Step duration']")).to_contain_text("ms")
    # Each chart says what its x axis counts, in its title and under the axis
    for name, axis in (("Step duration", "step"), ("Bytes written", "checkpoint version")):
        svg = page.locator(f"svg[aria-label='{name}']")
        expect(svg.locator("text.title")).to_have_text(f"{name} by {axis}")
        expect(svg.locator("text.x-axis")).to_have_text(axis)
        expect(svg.locator("text.x-axis")).to_be_visible()
    _screenshot_if_asked(page, "dashboard-run.png")

    # And on a narrow screen a tool call wraps between words, never inside a name
    page.set_viewport_size({"width": 420, "height": 800})
    asking = page.locator(f"#timeline tbody tr[data-step='{WAITING_STEP}']").filter(
        has_text="asked a person"
    )
    lines = rendered_lines(asking.locator("td").nth(3))
    assert len(lines) > 2, lines
    assert breaks_between_words(lines), lines
    assert lines[0].startswith("request_approval("), lines
    page.set_viewport_size({"width": 1180, "height": 600})

    # And the state at a step is one click away, with the prompt its model saw
    page.locator(f"#timeline tbody tr[data-step='{CRASH_STEP}'] td").nth(1).get_by_role(
        "link"
    ).first.click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"{RESUMED} as of step {CRASH_STEP}")
    expect(page.locator("pre")).to_contain_text('"run_id": "copy-resumed"')
    page.get_by_role("link", name=f"The prompt step {CRASH_STEP}'s model saw").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"The prompt of step {CRASH_STEP}")
    expect(page.locator("pre")).not_to_be_empty()

    # And the pending approval's link, signed for the operator, opens the approval page
    page.goto(f"{local.public_url}/dashboard/runs/{RESUMED}")
    approval = page.get_by_role("link", name="Open the approval page")
    href = approval.get_attribute("href")
    assert href is not None
    assert href.startswith(f"{local.public_url}/approvals/")
    assert f"to={OPERATOR}" in href
    approval.click()
    expect(page).to_have_title("Approval needed · Ratchet")
    expect(page.get_by_role("heading", level=1)).to_have_text(PROMPT)
    expect(page.get_by_role("button", name="Approve")).to_be_visible()

    # And nothing the dashboard showed changed any run
    assert {run_id: local.status(run_id)["version"] for run_id in RUNS} == before
