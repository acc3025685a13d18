"""The runs dashboard of a deployed stack in a real browser (issue 40).

Debian's Chromium, driven by Playwright, against `ratchet serve --store dynamodb://...` run as
a process of its own on a moto server's tables (`tests.deployed_stack`): the runs page lists a
run in every status and the damaged one under the banner naming the stack and account, and a
done run's page shows its timeline, its charts and the person who decided; the waiting run's
page names the stack's approval route. Nothing is written.

`RATCHET_SCREENSHOT_DIR=docs` (see `make screenshot`) also writes the runs page and the done
run's page to docs/dashboard-deployed-runs.png and docs/dashboard-deployed-run.png.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

pytest.importorskip("flask", reason="moto's server mode needs moto[server] (flask, flask-cors)")

from tests.deployed_stack import ACCOUNT, DAMAGED, STACK, Stack, deployed_stack, serve
from tests.e2e.test_approval_browser import chromium
from tests.e2e.test_dashboard_browser import _screenshot_if_asked

pytestmark = pytest.mark.slow

API_URL = "https://abc123.execute-api.us-east-1.amazonaws.com/prod"
EVERY_STATUS = {
    "done-1": "done",
    "running-1": "running",
    "failed-1": "failed",
    "stopped-1": "stopped",
    "cancelled-1": "cancelled",
    "wait-1": "waiting",
}


@pytest.fixture
def stack() -> Iterator[Stack]:
    with deployed_stack(many=False) as made:
        yield made


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[BrowserContext]:
    with chromium(tmp_path / "chromium-profile", width=1180, height=600) as context:
        yield context


def test_the_deployed_dashboard_lists_the_stacks_runs_and_shows_a_runs_timeline(
    stack, browser, tmp_path
):
    before = stack.everything()
    with serve(stack, tmp_path / "serve.log", RATCHET_PUBLIC_URL=API_URL) as served:
        page = browser.new_page()

        # When the operator opens the dashboard of the deployed stack
        response = page.goto(f"{served.base}/dashboard")
        assert response is not None
        assert response.status == 200

        # Then the banner says whose tables these are, and every run is listed
        expect(page).to_have_title("Runs · Ratchet")
        banner = page.locator("#stack")
        expect(banner).to_be_visible()
        expect(banner).to_contain_text(STACK)
        expect(banner).to_contain_text(ACCOUNT)
        expect(banner).to_contain_text("Read-only")
        for run_id, status in EVERY_STATUS.items():
            row = page.locator("tbody tr").filter(has=page.get_by_role("link", name=run_id))
            expect(row).to_have_count(1)
            expect(row.locator("td").nth(2)).to_have_text(status)
        damaged = page.locator("tbody tr").filter(has=page.get_by_role("link", name=DAMAGED))
        expect(damaged.locator("td").nth(2)).to_contain_text("damaged")
        expect(page.locator("tbody tr")).to_have_count(len(EVERY_STATUS) + 1)
        _screenshot_if_asked(page, "dashboard-deployed-runs.png")

        # When they open the done run
        page.get_by_role("link", name="done-1", exact=True).click()
        expect(page).to_have_title("Run done-1 · Ratchet")

        # Then its timeline, its charts and who decided are there, under the same banner
        expect(page.locator("#stack")).to_contain_text(STACK)
        steps = page.locator("#timeline tbody tr").filter(has_text="step committed")
        expect(steps).to_have_count(6)
        expect(page.locator("#timeline")).to_contain_text("ops@example.com")
        expect(page.locator("#timeline")).to_contain_text("copy_batch")
        expect(page.locator("svg.chart")).to_have_count(2)
        expect(page.locator("svg[aria-label='Step duration'] rect.bar")).to_have_count(6)
        _screenshot_if_asked(page, "dashboard-deployed-run.png")

        # And the waiting run names the stack's own approval route, no page of this server's
        page.goto(f"{served.base}/dashboard/runs/wait-1")
        pending = page.locator("#pending")
        expect(pending).to_contain_text(f"POST {API_URL}/runs/wait-1/approve")
        expect(pending.get_by_role("link")).to_have_count(0)

    assert stack.everything() == before
