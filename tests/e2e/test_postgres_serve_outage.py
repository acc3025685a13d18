"""`ratchet serve` on a Postgres store whose server restarts, or stops for a while, under it.

A restart cuts every connection serve's pool holds, and the pool learns that of each only as
it is next used: so the first request after a restart meets a cut connection. A page (a GET)
reads again, once, on a fresh connection and answers 200; a POST (a decision, a hook delivery)
writes nothing twice on its own: it answers 503 with Retry-After, and the same POST sent again
is taken. While the server is down every page and endpoint answers 503 with Retry-After,
never a bare 500, and serve says each in one log line, never a traceback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet.waiting.hooks import github_signature
from tests.e2e.test_postgres_serve import _FORM, PATIENCE, _host
from tests.postgres_support import Cluster, private_cluster

pytestmark = pytest.mark.slow

OUTAGE_LINE = "store out of reach"


@pytest.fixture
def cluster_of_its_own() -> Iterator[Cluster]:
    # Its own: restarting the process's shared cluster would cut other tests' connections.
    with private_cluster() as own:
        yield own


def _ask(
    url: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    import urllib.error
    import urllib.request

    asked = urllib.request.Request(url, data=body, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(asked, timeout=PATIENCE) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read().decode()


def _delivery(made: dict[str, str], delivery_id: str) -> dict[str, str]:
    body = b'{"conclusion":"success"}'
    return {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": github_signature(made["secret"], body),
        "X-GitHub-Delivery": delivery_id,
    }


def test_after_a_restart_every_page_and_endpoint_answers_and_none_answers_500(
    cluster_of_its_own: Cluster, tmp_path: Path
) -> None:
    postgres = cluster_of_its_own
    store = postgres.url(postgres.fresh_database())
    host = _host(tmp_path, "host", store)
    with host.serve("--no-worker") as served:
        # Given a run waiting for a person (its emailed link pointing at serve) and one
        # waiting for a hook's event
        host.ok("start", "--scenario", "migration", "--batches", "2", "--run-id", "m1")
        host.ok("start", "--agent", "tests.hooks_agent:agent", "--run-id", "r1")
        host.ok("worker", "--until-idle", RATCHET_PUBLIC_URL=served.base)
        link = host.outbox_link("m1")
        made = json.loads(
            host.ok("hook", "r1", "ci-finished", "--json", RATCHET_PUBLIC_URL=served.base)
        )
        body = b'{"conclusion":"success"}'
        answered: dict[str, int] = {}

        # When the server restarts before each page is asked for, each answers 200: read
        # again on a fresh connection
        pages = {
            "approval page": link,
            "dashboard": f"{served.base}/dashboard",
            "run's page": f"{served.base}/dashboard/runs/m1",
            "step's page": f"{served.base}/dashboard/runs/m1/steps/1",
        }
        for name, url in pages.items():
            postgres.restart()
            status, _, page = _ask(url)
            answered[name] = status
            assert status == 200, (name, page)

        # And a hook's delivery right after a restart is answered 503 with Retry-After,
        # nothing written twice, and taken when the sender sends it again
        postgres.restart()
        status, headers, answer = _ask(made["url"], body=body, headers=_delivery(made, "d-1"))
        answered["hook delivery"] = status
        assert status == 503, answer
        assert headers.get("Retry-After"), headers
        assert json.loads(answer)["problems"][0]["field"] == "hook", answer
        status, _, answer = _ask(made["url"], body=body, headers=_delivery(made, "d-1"))
        assert status == 200, answer
        assert json.loads(answer)["status"] == "delivered", answer

        # And so is a decision, taken once when the person sends it again
        postgres.restart()
        form = b"decision=approve&comment="
        status, headers, page = _ask(link, body=form, headers=_FORM)
        answered["decision"] = status
        assert status == 503, page
        assert headers.get("Retry-After"), headers
        assert "try again" in page, page
        status, _, page = _ask(link, body=form, headers=_FORM)
        assert status == 200, page
        assert "Approved" in page, page
        print(f"answered after a restart: {answered}")

    printed = served.printed
    print(*(line for line in printed.splitlines() if OUTAGE_LINE in line), sep="\n")
    assert "Traceback" not in printed, printed
    # One line for each request the outage turned away (the two POSTs), none for a page
    # that read again and answered
    assert printed.count(OUTAGE_LINE) == 2, printed


def test_while_the_server_is_down_pages_and_hooks_answer_503_and_200_once_it_is_back(
    cluster_of_its_own: Cluster, tmp_path: Path
) -> None:
    postgres = cluster_of_its_own
    store = postgres.url(postgres.fresh_database())
    host = _host(tmp_path, "host", store)
    with host.serve("--no-worker") as served:
        host.ok("start", "--agent", "tests.hooks_agent:agent", "--run-id", "r1")
        host.ok("worker", "--until-idle")
        made = json.loads(
            host.ok("hook", "r1", "ci-finished", "--json", RATCHET_PUBLIC_URL=served.base)
        )
        body = b'{"conclusion":"success"}'

        # When the server is down, the dashboard and a delivery are answered 503 with
        # Retry-After, saying the store is unreachable
        postgres.stop_server()
        try:
            asked = time.monotonic()
            status, headers, page = _ask(f"{served.base}/dashboard")
            took = time.monotonic() - asked
            assert status == 503, page
            assert headers.get("Retry-After"), headers
            assert "unreachable" in page, page
            status, headers, answer = _ask(made["url"], body=body, headers=_delivery(made, "d-1"))
            assert status == 503, answer
            assert headers.get("Retry-After"), headers
            print(f"the dashboard answered 503 in {took:.1f} s with the server down")
        finally:
            postgres.start_server()

        # Then once it is back, both are answered (the delivery sent again)
        deadline = time.monotonic() + PATIENCE
        while (status := _ask(f"{served.base}/dashboard")[0]) != 200:
            assert status == 503, status
            assert time.monotonic() < deadline, "the dashboard never answered once back"
        status, _, answer = _ask(made["url"], body=body, headers=_delivery(made, "d-1"))
        assert status == 200, answer
        assert json.loads(answer)["status"] == "delivered", answer

    printed = served.printed
    print(*(line for line in printed.splitlines() if OUTAGE_LINE in line), sep="\n")
    assert "Traceback" not in printed, printed
    assert printed.count(OUTAGE_LINE) >= 2, printed
