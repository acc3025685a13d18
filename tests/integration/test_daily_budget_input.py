"""A daily budget that is no budget is refused with nothing written: an agent defined with a
negative, zero, absurd (over $10,000) or non-number `max_cost_usd_per_day`; a raise of the
day's budget by such an amount, or for a day that is not a date: one line and exit 2 from
`ratchet budget raise`, `InvalidInput` from the client."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

import ratchet
from ratchet.errors import InvalidInput
from ratchet.tools import Agent
from tests.fixtures import refund_agent
from tests.processes import Cli

DAY = "2026-12-06"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (-1, "max_cost_usd_per_day must be above $0 and at most $10,000, not -1"),
        (0, "max_cost_usd_per_day must be above $0 and at most $10,000, not 0"),
        (1e9, "max_cost_usd_per_day must be above $0 and at most $10,000, not 1000000000.0"),
        ("5", "max_cost_usd_per_day must be a number of US dollars, not '5'"),
        (float("nan"), "max_cost_usd_per_day must be a number of US dollars, not nan"),
    ],
)
def test_an_agent_with_a_bad_daily_budget_is_refused_when_it_is_defined(given, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        Agent(name="spender", tools=[], max_cost_usd_per_day=given)


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        (["--usd", "-1"], "ratchet: --usd must be above $0 and at most $10,000, not -1.0"),
        (["--usd", "0"], "ratchet: --usd must be above $0 and at most $10,000, not 0.0"),
        (["--usd", "1e9"], "ratchet: --usd must be above $0 and at most $10,000, not 1000000000.0"),
        (["--usd", "five"], "ratchet: --usd: 'five' is not a number of US dollars"),
        (["--usd", "inf"], "ratchet: --usd: 'inf' is not a number of US dollars"),
        (["--usd", "5", "--day", "2026-13-01"], "ratchet: --day: '2026-13-01' is not a day"),
    ],
)
def test_the_cli_refuses_a_bad_raise_in_one_line_with_exit_2_writing_nothing(tmp_path, typed, said):
    cli = Cli(tmp_path)
    cli.ok("start", "--scenario", "migration", "--run-id", "b")
    done = cli.run("budget", "raise", "daily", *typed)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(said), line
    assert done.stdout == ""
    raised = cli.ok("budget", "raise", "daily", "--usd", "0.5", "--day", DAY, "--force")
    assert "raised by $0.5000 ($0.5000 raised that day" in raised  # the refusals wrote nothing


@pytest.mark.parametrize(
    ("usd", "day"), [(-1, None), (0, None), (10_000.01, None), (float("nan"), None), (1, "today")]
)
def test_the_client_refuses_a_bad_raise_as_invalid_input_writing_nothing(tmp_path, usd, day):
    client = ratchet.connect(f"sqlite:///{tmp_path}/ratchet.db", environ={})
    try:
        with pytest.raises(InvalidInput):
            client.raise_day_budget("daily", usd, day=day)
        assert client.runtime.daily_spend.raised("daily", DAY) == 0
    finally:
        client.close()


def test_a_raise_for_an_agent_no_run_is_of_is_refused_unless_forced(tmp_path):
    # Given a store whose only runs are of the migration scenario
    cli = Cli(tmp_path)
    cli.ok("start", "--scenario", "migration", "--run-id", "b")

    # When a raise names an agent no run is of (a typo), then the agent of the run, then the
    # typo again with --force
    typo = cli.run("budget", "raise", "migratoin", "--usd", "5", "--day", DAY)
    meant = cli.ok("budget", "raise", "migration", "--usd", "5", "--day", DAY)
    forced = cli.ok("budget", "raise", "migratoin", "--usd", "5", "--day", DAY, "--force")

    # Then the typo is refused in one line naming the agents with runs, exit 2, nothing
    # written; the others are raised, the forced one saying that no run is of it yet
    assert typo.returncode == 2, typo.stderr
    assert typo.stdout == ""
    assert typo.stderr == (
        "ratchet: no run of agent 'migratoin' is in this store: check the name (the agents "
        "with runs: migration), or give --force to raise it before its first run\n"
    )
    assert "raised by $5.0000 ($5.0000 raised that day" in meant
    assert "(no run here is of agent" not in meant
    assert forced.rstrip().endswith(
        "no run waited for it (no run here is of agent 'migratoin' yet)"
    )
    assert "($5.0000 raised that day" in forced  # the refusal wrote nothing


def test_a_raise_where_a_runs_agent_cannot_be_loaded_here_goes_ahead_saying_so(tmp_path):
    # Given a run of an agent whose module this process no longer finds (a worker may)
    modules = tmp_path / "modules"
    modules.mkdir()
    shutil.copy(refund_agent.__file__, modules / "gone_agent.py")
    cli = Cli(tmp_path)
    env = cli.env(PYTHONPATH=os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")]))
    started = subprocess.run(
        cli.argv("start", "--agent", "gone_agent:agent", "--run-id", "g"),
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    shutil.rmtree(modules)

    # When its budget is raised by the name this process cannot check
    raised = cli.ok("budget", "raise", "refunds", "--usd", "5", "--day", DAY)

    # Then the raise stands, and says which agent it could not name
    assert "raised by $5.0000" in raised
    assert raised.rstrip().endswith(
        "(no run here is of an agent named 'refunds' that this process can load; it cannot "
        "load gone_agent:agent)"
    )
