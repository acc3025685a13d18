"""A run's budget holds when its worker is SIGKILLed in the middle of a model call: real
`ratchet worker` processes driving Claude through the real SDK against a stand-in for the
Messages API that holds each answer until the test has killed the worker waiting for it (a
condition: the request arrived), then bills it all the same, as the provider would. Every
step's first call is killed, its retry answered. The killed call's reservation counts in full,
the run parks before a call that might pass the bound, a person raises it (`ratchet approve
--answer`), it goes on, and what the stand-in billed never passes the budget."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from ratchet.state import ApprovalRequest, RunState, RunStatus
from tests.budget_support import MODEL, BillingMessagesApi
from tests.processes import Cli, clean_env

RUN = "killed-mid-call"
AGENT = "tests.budget_agent:agent"
PATIENCE_S = 120.0


class Killing:
    def __init__(self, cli: Cli, api: BillingMessagesApi) -> None:
        self.cli, self.api = cli, api
        self.env = clean_env(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url)
        self.spawned = 0
        self.killed = 0

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.cli.argv(*args), capture_output=True, text=True, env=self.env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done

    def worker(self) -> subprocess.Popen[str]:
        self.spawned += 1
        log = (self.cli.root / f"worker-{self.spawned}.log").open("a")
        argv = self.cli.argv(
            "worker", "--until-idle", "--worker-id", f"w{self.spawned}", "--lease-seconds", "0.5"
        )
        return subprocess.Popen(argv, stdout=log, stderr=log, text=True, env=self.env)

    def work_until_parked(self) -> RunState:
        """Workers take the run's steps, each step's first model call killed mid-call (the
        worker waiting for it SIGKILLed), its retry answered, until the run stops calling."""
        worker = self.worker()
        seen = self.api.received()
        while True:
            ends = time.monotonic() + PATIENCE_S
            while self.api.received() == seen and worker.poll() is None:
                assert time.monotonic() < ends, "neither a model call nor the worker's end"
                time.sleep(0.01)
            if self.api.received() == seen:
                assert worker.returncode == 0
                return self.cli.head(RUN)
            seen += 1
            if seen % 2:  # a step's first call: its worker dies waiting for the answer
                worker.kill()
                assert worker.wait(timeout=30) == -9
                self.killed += 1
                self.api.release_all()  # answered to no one; billed all the same
                worker = self.worker()
            else:
                self.api.release_all()


def parked_request(state: RunState) -> ApprovalRequest:
    assert state.status is RunStatus.WAITING, (state.status, state.error)
    assert state.waiting is not None
    request = state.waiting.request
    assert isinstance(request, ApprovalRequest)
    assert request.raises_budget
    return request


@pytest.mark.timeout(600)
def test_a_worker_killed_in_every_steps_model_call_never_lets_the_run_overspend(tmp_path):
    with BillingMessagesApi(hold=True) as api:
        killing = Killing(Cli(tmp_path), api)
        killing.command(
            "start", "--agent", AGENT, "--model", MODEL, "--run-id", RUN, "--budget", "0.05"
        )
        overspent: list[float] = []

        # Given workers killed in each step's first model call, until the run parks
        parked = killing.work_until_parked()
        request = parked_request(parked)
        budget = parked.budget
        assert budget is not None
        assert budget.usd is not None
        overspent.append(api.billed_usd - budget.usd)
        # Then every call it made was counted (the killed ones in full), and none passed $0.05
        # (a step whose killed call left too little for its retry parked instead of calling)
        assert parked.step >= 2
        assert killing.killed in (parked.step, parked.step + 1)
        assert api.received() == killing.killed + parked.step
        assert budget.spent_usd >= api.billed_usd - 1e-9
        assert api.billed_usd <= 0.05
        first = (parked.step, api.billed_usd, budget.spent_usd + budget.reserved_usd)

        # When a person raises it by $0.03, it goes on the same way and parks again
        killing.command("approve", RUN, "--by", "dana", "--answer", json.dumps({"raise_usd": 0.03}))
        again = killing.work_until_parked()
        parked_request(again)
        budget = again.budget
        assert budget is not None
        assert budget.usd is not None
        assert budget.usd == pytest.approx(0.08)
        overspent.append(api.billed_usd - budget.usd)
        assert again.step > parked.step
        assert api.received() == killing.killed + again.step
        assert budget.spent_usd >= api.billed_usd - 1e-9
        assert api.billed_usd <= 0.08

    most = max(0.0, *overspent)
    counted = budget.spent_usd + budget.reserved_usd
    print(
        f"\nkilled {killing.killed} calls of {api.received()}; at $0.05: {first[0]} steps, billed "
        f"${first[1]:.6f}, counted ${first[2]:.6f} ({request.prompt}); at $0.08: {again.step} "
        f"steps, billed ${api.billed_usd:.6f}, counted ${counted:.6f}; the most any run "
        f"overspent: ${most:.6f}"
    )
    assert most == 0
