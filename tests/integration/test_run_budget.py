"""A run's budget, held: a run of the budget agent on a SQLite store, driven by Claude through
the real SDK against a stand-in for the Messages API that bills every request. It stops calling
the model at the bound, parks for a person, is raised through the approval page (the WSGI app
`ratchet serve` runs) and goes on, and what the stand-in billed never passes the budget; every
call was reserved on the run before it was made, and the run's spending is what was billed."""

from __future__ import annotations

import html
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from pydantic import SecretStr
from werkzeug.test import Client

from ratchet.approvals.desk import ApprovalDesk
from ratchet.cli.readout import status_payload, status_text
from ratchet.runs import RunRequest, new_run
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.services import local_runs_services
from ratchet.state import ApprovalRequest, Budget, RunState, RunStatus
from ratchet.web.approvals import ApprovalServices, build_app
from ratchet.web.dashboard import local_app
from ratchet.web.runs import build_app as build_runs_app
from ratchet.web.serve import wsgi_app
from ratchet.worker import Worker
from tests.budget_support import MODEL, BillingMessagesApi
from tests.integration.fake_messages_api import RecordedRequest

LOG = logging.getLogger("ratchet.tests.budget")
AGENT = "tests.budget_agent:agent"
RUN = "budgeted-1"
OPERATOR = "alice"
ASKED = re.compile(
    r"^Spent \$0\.0\d{3} of \$0\.0[57]00 in \d+ steps; the next step may cost up to "
    r"\$0\.0\d{3}\. Raise the budget\?$"
)


@dataclass
class Budgeted:
    root: Path
    api: BillingMessagesApi = field(init=False)
    runtime: LocalRuntime = field(init=False)
    reserved_at_call: list[float] = field(default_factory=list)
    """What the run held for the call under way when each request reached the stand-in."""

    @property
    def store(self) -> str:
        return f"sqlite:///{self.root}/ratchet.db"

    def seen(self, request: RecordedRequest) -> None:
        # Read by a runtime of its own: the worker's thread is in the call.
        reader = LocalRuntime.open(LocalSettings(store=self.store), create=False)
        try:
            head = reader.store.load_head(RUN)
        finally:
            reader.close()
        assert head is not None
        assert head.budget is not None
        self.reserved_at_call.append(head.budget.reserved_usd)

    def open(self) -> None:
        self.api = BillingMessagesApi(on_request=self.seen).start()
        settings = LocalSettings(
            store=self.store,
            anthropic_api_key=SecretStr("test-key"),
            anthropic_base_url=self.api.url,
        )
        self.runtime = LocalRuntime.open(settings)

    def close(self) -> None:
        self.runtime.close()
        self.api.stop()

    def start(self, **request: object) -> None:
        state = new_run(
            RunRequest.model_validate({"run_id": RUN, "agent": AGENT, "model": MODEL, **request}),
            has_anthropic_key=True,
        )
        assert self.runtime.engine(worker_id="starter", logger=LOG).start(state)

    def work(self) -> RunState:
        engine = self.runtime.engine(worker_id="worker", logger=LOG)
        Worker(engine, self.runtime.leases, LOG).run(until_idle=True, run_id=RUN)
        return self.head()

    def head(self) -> RunState:
        state = self.runtime.store.load_head(RUN)
        assert state is not None
        return state

    def views(self) -> dict[str, Any]:
        """The run's budget as the client, the runs API, the dashboard's run page and
        `ratchet status` (its JSON and its text) show it."""
        runs = local_runs_services(self.runtime, worker_id="serve:test", logger=LOG)
        dashboard = local_app(runs.client, self.desk(), operator=OPERATOR)
        api = build_runs_app(lambda: runs)
        http = Client(wsgi_app([("/dashboard", dashboard), ("/runs", api)]))
        payload = status_payload(self.head().model_dump(mode="json"))
        return {
            "client": runs.client.get(RUN).budget,
            "api": json.loads(http.get(f"/runs/{RUN}").get_data(as_text=True)),
            "dashboard": html.unescape(http.get(f"/dashboard/runs/{RUN}").get_data(as_text=True)),
            "status": payload,
            "status text": status_text(payload),
            "feed": list(runs.client.follow(RUN, until={"waiting"}, timeout=30)),
        }

    def desk(self) -> ApprovalDesk:
        return self.runtime.approval_desk(worker_id="serve", logger=LOG)

    def page(self) -> tuple[Client, str]:
        """The page app, and the operator's link to the request the run waits on."""
        desk = self.desk()
        opened = desk.open(RUN, timeout_seconds=3600, operator=OPERATOR)
        app = build_app(lambda: ApprovalServices(desk=desk))
        url = urlsplit(desk.link(opened.approval, OPERATOR))
        return Client(wsgi_app([("/approvals/", app)])), f"{url.path}?{url.query}"


@pytest.fixture
def budgeted(tmp_path: Path) -> Iterator[Budgeted]:
    setup = Budgeted(tmp_path)
    setup.open()
    yield setup
    setup.close()


def budget_of(state: RunState) -> Budget:
    assert state.budget is not None
    return state.budget


def assert_parked_for_the_budget(state: RunState, usd: float) -> ApprovalRequest:
    assert state.status is RunStatus.WAITING
    assert state.waiting is not None
    request = state.waiting.request
    assert isinstance(request, ApprovalRequest)
    assert request.raises_budget
    assert ASKED.fullmatch(request.prompt), request.prompt
    assert request.details["budget_usd"] == usd
    return request


def decide_on_the_page(budgeted: Budgeted, form: dict[str, str]) -> str:
    client, link = budgeted.page()
    shown = client.get(link).get_data(as_text=True)
    assert "answer.raise_usd" in shown  # the page asks for the amount
    assert "Raise the budget?" in html.unescape(shown)
    response = client.post(
        link, data=urlencode(form), content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_data(as_text=True)


def test_a_run_stops_calling_the_model_at_its_budget_and_goes_on_once_a_person_raises_it(
    budgeted,
):
    budgeted.start(budget_usd=0.05, max_steps=100)

    # Given a run with a $0.05 budget, worked until it can go no further
    parked = budgeted.work()

    # Then it parked for a person before a call that might pass the bound, and never made one
    request = assert_parked_for_the_budget(parked, 0.05)
    calls = budgeted.api.received()
    spent = budget_of(parked)
    print(
        f"\nparked after {parked.step} steps and {calls} calls: billed "
        f"${budgeted.api.billed_usd:.6f}, spent ${spent.spent_usd:.6f} of $0.05, next step "
        f"up to ${request.details['next_step_usd']:.6f}; prompt: {request.prompt}"
    )
    assert calls == parked.step > 3
    assert budgeted.api.billed_usd <= 0.05
    assert spent.spent_usd + request.details["next_step_usd"] > 0.05
    # Every call was reserved on the run before it was made, at no less than it cost
    assert len(budgeted.reserved_at_call) == calls
    assert all(
        held >= cost
        for held, cost in zip(budgeted.reserved_at_call, budgeted.api.billed, strict=True)
    )
    # And the run's spending is what was billed, settled call by call, nothing held
    assert spent.spent_usd == pytest.approx(budgeted.api.billed_usd, abs=1e-6)
    assert spent.reserved_usd == 0
    # Its spend and budget show wherever the run is read
    shown = budgeted.views()
    assert shown["client"] == spent
    assert shown["api"]["budget"] == spent.model_dump(mode="json")
    assert f"${spent.spent_usd:.4f} spent of $0.05" in shown["dashboard"]
    assert shown["status"]["budget"]["spent_usd"] == spent.spent_usd
    assert f"${spent.spent_usd:.4f} spent of $0.05" in shown["status text"]
    assert shown["feed"][-1].type == "waiting"
    assert shown["feed"][-1].wait.prompt == request.prompt
    assert [e.type for e in shown["feed"]].count("step") == parked.step
    # A worker that finds it parked calls nothing
    assert budgeted.work().version == parked.version
    assert budgeted.api.received() == calls

    # When a person raises it by $0.02 through the approval page
    said = decide_on_the_page(budgeted, {"decision": "approve", "answer.raise_usd": "0.02"})
    assert "approved" in said.lower()
    raised = budgeted.head()
    assert raised.status is RunStatus.RUNNING
    assert budget_of(raised).usd == pytest.approx(0.07)

    # Then it goes on, and parks again at the new bound, never past it
    again = budgeted.work()
    assert_parked_for_the_budget(again, 0.07)
    assert again.step > parked.step
    assert budgeted.api.received() == again.step
    assert budgeted.api.billed_usd <= 0.07
    assert budget_of(again).spent_usd == pytest.approx(budgeted.api.billed_usd, abs=1e-6)

    # And a person who will not raise it again stops the run, with their reason
    decide_on_the_page(budgeted, {"decision": "reject", "comment": "enough notes"})
    stopped = budgeted.work()
    assert stopped.status is RunStatus.STOPPED
    assert stopped.summary == f"Budget not raised by {OPERATOR}: enough notes"
    assert budgeted.api.received() == again.step
    print(
        f"raised to $0.07: {again.step} steps, billed ${budgeted.api.billed_usd:.6f}; "
        f"overspent ${max(0.0, budgeted.api.billed_usd - 0.07):.6f}"
    )
