"""An agent's daily budget holds across real worker processes: 20 runs of the daily agent
($0.03 a day, no budget per run), worked by 4 `ratchet worker` processes at once, each driving
Claude through the real SDK against a stand-in for the Messages API that bills every request.
At every request the stand-in reads the day's counter in the store (holds of the calls under
way included): it is never above the day's budget. Every run either reached its step cap or
waits for the next UTC day, and the counter is what was billed, every hold settled."""

from __future__ import annotations

import logging
import subprocess

import pytest

from ratchet.adapters.sqlite.daily_spend import SqliteDailySpend
from ratchet.adapters.sqlite.database import SqliteDatabase
from ratchet.engine.spending import MICROS, day_of
from ratchet.runs import RunRequest, new_run
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunStatus, TimerWait, utcnow
from tests.budget_support import MODEL, BillingMessagesApi
from tests.processes import Cli, clean_env

LOG = logging.getLogger("ratchet.tests.daily_workers")
AGENT = "tests.budget_agent:daily"
RUNS, WORKERS, STEPS = 20, 4, 3
DAY_BUDGET = 0.03
PATIENCE_S = 300


@pytest.mark.timeout(600)
def test_twenty_runs_on_four_workers_never_hold_more_than_their_agents_daily_budget(tmp_path):
    cli = Cli(tmp_path)
    day = day_of(utcnow())
    seen: list[int] = []
    db: list[SqliteDatabase] = []
    counters: list[SqliteDailySpend] = []

    def counted(_: object) -> None:
        # Read in the stand-in's thread, as the request arrives: the caller's hold is on it.
        if not counters:
            db.append(SqliteDatabase(tmp_path / "ratchet.db", create=False, any_thread=True))
            counters.append(SqliteDailySpend(db[0]))
        seen.append(counters[0].spent("daily", day))

    with BillingMessagesApi(on_request=counted) as api:
        runtime = LocalRuntime.open(LocalSettings(store=cli.store))
        try:
            engine = runtime.engine(worker_id="starter", logger=LOG)
            for n in range(RUNS):
                request = RunRequest.model_validate(
                    {"run_id": f"d{n}", "agent": AGENT, "model": MODEL, "max_steps": STEPS}
                )
                assert engine.start(new_run(request, has_anthropic_key=True))
        finally:
            runtime.close()

        # When 4 workers take the 20 runs' steps at once, until none is left to run
        env = clean_env(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url)
        workers = []
        for n in range(WORKERS):
            log = (tmp_path / f"w{n}.log").open("a")
            argv = cli.argv("worker", "--until-idle", "--worker-id", f"w{n}")
            workers.append(subprocess.Popen(argv, stdout=log, stderr=log, text=True, env=env))
        for n, worker in enumerate(workers):
            assert worker.wait(timeout=PATIENCE_S) == 0, (tmp_path / f"w{n}.log").read_text()
        billed, calls = api.billed_usd, api.received()

    heads = [cli.head(f"d{n}") for n in range(RUNS)]
    reader = LocalRuntime.open(LocalSettings(store=cli.store), create=False)
    try:
        spent = reader.daily_spend.spent("daily", day)
    finally:
        reader.close()
    for opened in db:
        opened.close()

    # Then the day's counter, holds of calls under way included, never passed $0.03
    assert len(seen) == calls
    assert max(seen) <= DAY_BUDGET * MICROS
    assert billed <= DAY_BUDGET
    # every run reached its step cap or waits for the next day, having called nothing more
    capped = [h for h in heads if h.status is RunStatus.STOPPED and h.step == STEPS]
    waiting = [h for h in heads if h.status is RunStatus.WAITING]
    assert len(capped) + len(waiting) == RUNS, [(h.run_id, h.status, h.error) for h in heads]
    assert waiting, "the day's budget was never spent"
    for head in waiting:
        assert head.waiting is not None
        wait = head.waiting.request
        assert isinstance(wait, TimerWait)
        assert wait.day_budget_of == "daily"
        assert wait.until is not None
        assert wait.until.date().isoformat() > day
    assert sum(h.step for h in heads) == calls
    # and the spend was counted: the counter is what was billed, every hold settled
    assert spent == pytest.approx(billed * MICROS, abs=calls)
    print(
        f"\n{RUNS} runs on {WORKERS} workers: {calls} calls, billed ${billed:.6f}, counted "
        f"${spent / MICROS:.6f} of ${DAY_BUDGET}; most on the counter at a call "
        f"${max(seen) / MICROS:.6f}; {len(capped)} runs at their step cap of {STEPS}, "
        f"{len(waiting)} waiting for the next day"
    )
