"""An agent's daily budget, held: runs of the daily agent on a SQLite store, driven by Claude
through the real SDK against a stand-in for the Messages API that bills every request, on an
injected clock (`FakeClock`) so the UTC day turns without sleeping. A run that finds the day's
budget spent calls nothing and waits, holding no lease, until midnight or a raise; the day's
counter settles to what was billed; the waiting moves no step's result."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import SecretStr

from ratchet.cli.readout import status_payload, status_text
from ratchet.client import Client
from ratchet.engine.spending import MICROS
from ratchet.runs import RunRequest, new_run
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunState, RunStatus, TimerWait
from ratchet.testing import FakeClock
from ratchet.worker import Worker
from tests.budget_support import MODEL, BillingMessagesApi

LOG = logging.getLogger("ratchet.tests.daily_budget")
AGENT = "tests.budget_agent:daily"
RUN = "daily-1"
DAY_ONE, DAY_TWO = "2026-12-06", "2026-12-07"


@dataclass
class Daily:
    root: Path
    clock: FakeClock = field(
        default_factory=lambda: FakeClock(datetime(2026, 12, 6, 23, 50, tzinfo=UTC))
    )
    spent_at_call: list[int] = field(default_factory=list)
    """The day's counter, holds included, as each request reached the stand-in."""

    def open(self) -> None:
        self.api = BillingMessagesApi(on_request=lambda _: self.seen()).start()
        settings = LocalSettings(
            store=f"sqlite:///{self.root}/ratchet.db",
            anthropic_api_key=SecretStr("test-key"),
            anthropic_base_url=self.api.url,
        )
        self.runtime = LocalRuntime.open(settings, clock=self.clock)

    def seen(self) -> None:
        self.spent_at_call.append(self.runtime.daily_spend.spent("daily", self.today()))

    def today(self) -> str:
        return self.clock().date().isoformat()

    def close(self) -> None:
        self.runtime.close()
        self.api.stop()

    def start(self) -> None:
        request = RunRequest.model_validate(
            {"run_id": RUN, "agent": AGENT, "model": MODEL, "max_steps": 100}
        )
        state = new_run(request, has_anthropic_key=True)
        assert self.runtime.engine(worker_id="starter", logger=LOG).start(state)

    def work(self) -> RunState:
        engine = self.runtime.engine(worker_id="worker", logger=LOG)
        Worker(engine, self.runtime.leases, LOG).run(until_idle=True, run_id=RUN)
        return self.head()

    def settle_due(self) -> list[str]:
        engine = self.runtime.engine(worker_id="worker", logger=LOG)
        return self.runtime.wait_settler(engine)(self.clock())

    def head(self) -> RunState:
        state = self.runtime.store.load_head(RUN)
        assert state is not None
        return state

    def spent(self, day: str) -> float:
        return self.runtime.daily_spend.spent("daily", day) / MICROS


@pytest.fixture
def daily(tmp_path: Path) -> Iterator[Daily]:
    setup = Daily(tmp_path)
    setup.open()
    yield setup
    setup.close()


def waits_for_the_day(state: RunState, until: str) -> TimerWait:
    assert state.status is RunStatus.WAITING, (state.status, state.error)
    assert state.waiting is not None
    wait = state.waiting.request
    assert isinstance(wait, TimerWait)
    assert wait.day_budget_of == "daily"
    assert wait.until == datetime.fromisoformat(until)
    return wait


def test_a_run_waits_for_the_next_day_when_its_agents_daily_budget_is_spent_and_for_a_raise(
    daily,
):
    daily.start()

    # Given a run of an agent with a $0.03 daily budget, worked at 23:50 UTC until it stops
    parked = daily.work()

    # Then it waits for the next day, calling nothing more, and says so
    wait = waits_for_the_day(parked, "2026-12-07T00:00:00+00:00")
    first_steps, first_calls = parked.step, daily.api.received()
    assert first_calls == first_steps >= 2
    billed_day_one = daily.api.billed_usd
    assert billed_day_one <= 0.03
    # the day's counter is what was billed, every hold settled, and never above the budget
    assert daily.spent(DAY_ONE) == pytest.approx(billed_day_one, abs=first_calls / MICROS)
    assert max(daily.spent_at_call) <= 0.03 * MICROS
    line = status_text(status_payload(parked.model_dump(mode="json")))
    said = (
        "agent daily's daily budget of $0.0300 is spent; resumes at 2026-12-07T00:00Z or "
        "when raised"
    )
    assert wait.prompt == said
    assert said in line, line
    # No lease is held and no worker finds anything to do while it waits
    assert daily.work().version == parked.version
    assert daily.api.received() == first_calls

    # When the injected clock passes midnight UTC, the wait is settled and the run goes on
    daily.clock.advance_to(datetime(2026, 12, 7, 0, 0, 1, tzinfo=UTC))
    assert daily.settle_due() == [RUN]
    resumed = daily.head()
    assert resumed.status is RunStatus.RUNNING
    # moving no step's result: the last step's result is still its own
    assert resumed.tool_results[-1].text == parked.tool_results[-1].text == "noted: a note"
    assert resumed.step == parked.step
    again = daily.work()
    waits_for_the_day(again, "2026-12-08T00:00:00+00:00")
    billed_day_two = round(daily.api.billed_usd - billed_day_one, 6)
    second_calls = daily.api.received() - first_calls
    assert again.step == first_steps + second_calls
    assert 0 < billed_day_two <= 0.03
    assert daily.spent(DAY_TWO) == pytest.approx(billed_day_two, abs=second_calls / MICROS)
    assert daily.spent(DAY_ONE) == pytest.approx(billed_day_one, abs=first_calls / MICROS)

    # When a person raises the day's budget by $0.02, the waiting run is woken and goes on
    client = Client(daily.runtime)
    raised = client.raise_day_budget("daily", 0.02, by="dana")
    assert raised.woken == [RUN]
    assert raised.raised_usd == 0.02
    assert raised.day == DAY_TWO
    woken = daily.head()
    assert woken.status is RunStatus.RUNNING
    assert woken.tool_results[-1].text == "noted: a note"
    final = daily.work()
    waits_for_the_day(final, "2026-12-08T00:00:00+00:00")
    third_calls = daily.api.received() - first_calls - second_calls
    assert third_calls >= 1
    billed_after_raise = round(daily.api.billed_usd - billed_day_one, 6)
    assert billed_after_raise <= 0.05
    assert daily.spent(DAY_TWO) == pytest.approx(
        billed_after_raise, abs=(second_calls + third_calls) / MICROS
    )
    assert max(daily.spent_at_call) <= 0.05 * MICROS
    print(
        f"\nday one: {first_calls} calls, billed ${billed_day_one:.6f}, counted "
        f"${daily.spent(DAY_ONE):.6f} of $0.03; after midnight: {second_calls} calls, billed "
        f"${billed_day_two:.6f}; after a $0.02 raise: {third_calls} more, day two billed "
        f"${billed_after_raise:.6f}, counted ${daily.spent(DAY_TWO):.6f} of $0.05; most "
        f"counted at a call ${max(daily.spent_at_call) / MICROS:.6f}; says: {wait.prompt}"
    )
