"""At-most-once tools with real worker processes: a worker SIGKILLed at each point of a step
that calls one, and another worker after it. Where the call may have run, the second worker
parks the run for a person instead of calling again, and `ratchet approve --answer` (what the
person saw at the bank) resumes it; every point ends with the wire sent exactly once (the
bank's own file, written across processes) and the run done."""

from __future__ import annotations

import json
import signal

import pytest

from ratchet.faults import FaultPoint
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.state import RunOptions, RunState, RunStatus
from tests.at_most_once_agent import AGENT, agent, wires
from tests.processes import Cli

MAY_HAVE_RUN = {FaultPoint.AFTER_CALL_STARTED, FaultPoint.AFTER_TOOL, FaultPoint.BEFORE_COMMIT}


@pytest.mark.parametrize(
    "point",
    [
        FaultPoint.AFTER_DECISION,
        FaultPoint.AFTER_CALL_STARTED,
        FaultPoint.AFTER_TOOL,
        FaultPoint.BEFORE_COMMIT,
        FaultPoint.AFTER_COMMIT,
    ],
)
def test_a_sigkill_at_any_point_of_the_call_sends_the_wire_once(tmp_path, point):
    cli = Cli(tmp_path)
    bank = tmp_path / "bank.log"
    runtime = LocalRuntime.open(LocalSettings(store=cli.store))
    options = RunOptions(params={**agent.default_params, "bank": str(bank)})
    runtime.engine(worker_id="test", logger=None).start(
        RunState(run_id="pay", agent=AGENT, goal="Pay ACME", options=options)
    )
    runtime.close()

    killed = cli.spawn_worker("killed", fault=f"kill:{point.value}@1")
    assert killed.wait(timeout=60) == -signal.SIGKILL
    cli.work_until_idle("second")
    asked = cli.head("pay").status is RunStatus.WAITING
    if asked:
        ran = len(wires(bank)) == 1
        cli.ok("approve", "pay", "--by", "dana", "--answer", json.dumps({"ran": ran}))
        cli.work_until_idle("third")

    assert asked is (point in MAY_HAVE_RUN)
    assert cli.head("pay").status is RunStatus.DONE
    assert len(wires(bank)) == 1
