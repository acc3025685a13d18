"""An agent's daily budget holds when its worker is SIGKILLed in the middle of a model call:
real `ratchet worker` processes drive a run of the daily agent ($0.03 a day) through the real
SDK against a stand-in for the Messages API that holds each answer until the test has killed the
worker waiting for it, then bills it all the same. Every step's first call is killed, its retry
answered. The killed calls' holds stay on the day's counter in full, so the run waits for the
next day before the agent's runs could pass the day's budget, and what was billed never does."""

from __future__ import annotations

import pytest

from ratchet.engine.spending import MICROS, day_of
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus, TimerWait, utcnow
from tests.budget_support import MODEL, BillingMessagesApi
from tests.e2e.test_budget_sigkill import Killing
from tests.processes import Cli

RUN = "killed-mid-call"
AGENT = "tests.budget_agent:daily"
DAY_BUDGET = 0.03


@pytest.mark.timeout(600)
def test_a_worker_killed_in_every_steps_model_call_leaves_the_days_hold_counted(tmp_path):
    day = day_of(utcnow())
    with BillingMessagesApi(hold=True) as api:
        killing = Killing(Cli(tmp_path), api)
        killing.command("start", "--agent", AGENT, "--model", MODEL, "--run-id", RUN)

        # Given workers killed in each step's first model call, until the run stops calling
        parked = killing.work_until_parked()
        billed, calls = api.billed_usd, api.received()

    reader = LocalRuntime.open(LocalSettings(store=killing.cli.store), create=False)
    try:
        counted = reader.daily_spend.spent("daily", day) / MICROS
    finally:
        reader.close()

    # Then it waits for the next day, having made no call that could pass the day's budget
    assert parked.status is RunStatus.WAITING, (parked.status, parked.error)
    assert parked.waiting is not None
    wait = parked.waiting.request
    assert isinstance(wait, TimerWait)
    assert wait.day_budget_of == "daily"
    assert parked.step >= 1
    assert killing.killed in (parked.step, parked.step + 1)
    assert calls == killing.killed + parked.step
    # every killed call's hold counted in full, every answered one settled: never less than billed
    assert counted >= billed - 1e-6
    assert counted <= DAY_BUDGET
    assert billed <= DAY_BUDGET
    print(
        f"\nkilled {killing.killed} calls of {calls}; {parked.step} steps, billed ${billed:.6f}, "
        f"counted ${counted:.6f} of ${DAY_BUDGET} on the day's counter; the most overspent: "
        f"${max(0.0, billed - DAY_BUDGET):.6f}"
    )
