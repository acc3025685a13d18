"""A budget that is no budget is refused where a run starts, with nothing written: a negative
one, none at all ($0), one that is not a number, and an absurd one (over $10,000, the most a
run's budget may be: a larger one is a typo, or cents given as dollars). The CLI says one line
and exits 2 (on its quick path and its full one alike), the runs API answers 400 naming
`budget_usd`, the Python client raises `InvalidInput` naming it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import ratchet
from ratchet.errors import InvalidInput
from ratchet.runs import RunRequestInvalid
from ratchet.tools import Agent
from tests.integration.test_runs_api_local import Served, _served
from tests.processes import Cli

BAD = ["-1", "0", "10000.01", "1e9", "nan", "five"]


@pytest.mark.parametrize("given", BAD)
def test_the_cli_refuses_a_bad_budget_in_one_line_with_exit_2(tmp_path, given):
    cli = Cli(tmp_path)
    for typed in (["--budget", given], [f"--budget={given}"]):
        done = cli.run("start", "--scenario", "migration", "--run-id", "b", *typed)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith("ratchet: --budget: "), line
        assert done.stdout == ""
    assert not (tmp_path / "ratchet.db").exists() or "b" not in cli.run("list").stdout


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with _served(tmp_path) as serving:
        yield serving


@pytest.mark.parametrize("given", [-1, 0, 10_000.01, 1e9, "five"])
def test_the_runs_api_refuses_a_bad_budget_with_a_400_naming_the_field(served: Served, given):
    answered, answer = served.call(
        "POST", "/runs", {"scenario": "migration", "run_id": "b", "budget_usd": given}
    )

    assert answered == 400
    assert [p["field"] for p in answer["problems"]] == ["budget_usd"]
    assert served.runtime.store.load_head("b") is None


def test_the_runs_api_takes_a_budget_in_bounds_and_answers_it(served: Served):
    # (The refusals above hold only beside this: a runs API that knew no `budget_usd` would
    # refuse every budget as an unknown field, naming it just the same.)
    answered, started = served.call(
        "POST", "/runs", {"scenario": "migration", "run_id": "b", "budget_usd": 10_000}
    )
    assert answered == 201, started

    answered, run = served.call("GET", "/runs/b")

    assert answered == 200
    assert run["budget"]["usd"] == 10_000
    assert run["budget"]["spent_usd"] == 0


@pytest.mark.parametrize("given", [-1, 0, 10_000.01, float("nan"), float("inf")])
def test_the_client_refuses_a_bad_budget_as_invalid_input_naming_it(tmp_path, given):
    client = ratchet.connect(f"sqlite:///{tmp_path}/ratchet.db", environ={})
    try:
        with pytest.raises(InvalidInput) as refused:
            client.start(scenario="migration", run_id="b", budget_usd=given)
        assert isinstance(refused.value, RunRequestInvalid)
        assert refused.value.fields == ("budget_usd",)
        assert client.runtime.store.load_head("b") is None
    finally:
        client.close()


def test_a_budget_in_dollars_on_a_model_without_a_price_is_refused_naming_it(tmp_path):
    client = ratchet.connect(f"sqlite:///{tmp_path}/ratchet.db", environ={})
    try:
        with pytest.raises(RunRequestInvalid) as refused:
            client.start(agent="tests.budget_agent:agent", model="tests.fixtures.house_model:model")
        assert refused.value.fields == ("budget_usd",)
        assert "has no price" in str(refused.value)
    finally:
        client.close()


def test_a_budget_at_the_bound_is_taken_and_shown(tmp_path):
    cli = Cli(tmp_path)
    cli.ok("start", "--scenario", "migration", "--run-id", "b", "--budget", "10000")
    status = cli.json("status", "b")
    assert status["budget"] == {
        "usd": 10000.0,
        "tokens": None,
        "spent_usd": 0.0,
        "spent_tokens": 0,
        "reserved_usd": 0.0,
        "reserved_tokens": 0,
        "refused": None,
    }
    assert "$0.00 spent of $10,000.00" in cli.ok("status", "b")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"max_cost_usd": -1}, "max_cost_usd must be above $0 and at most $10,000, not -1"),
        ({"max_cost_usd": 10_001}, "max_cost_usd must be above $0 and at most $10,000"),
        ({"max_cost_usd": "5"}, "max_cost_usd must be a number of US dollars, not '5'"),
        ({"max_tokens_total": 0}, "max_tokens_total must be from 1 to 1,000,000,000, not 0"),
    ],
)
def test_an_agent_with_a_bad_budget_is_refused_when_it_is_defined(given, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        Agent(name="spender", tools=[], **given)
