"""A daily budget that is no budget is refused with nothing written: an agent defined with a
negative, zero, absurd (over $10,000) or non-number `max_cost_usd_per_day`; a raise of the
day's budget by such an amount, or for a day that is not a date: one line and exit 2 from
`ratchet budget raise`, `InvalidInput` from the client."""

from __future__ import annotations

import re

import pytest

import ratchet
from ratchet.errors import InvalidInput
from ratchet.tools import Agent
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
    raised = cli.ok("budget", "raise", "daily", "--usd", "0.5", "--day", DAY)
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
