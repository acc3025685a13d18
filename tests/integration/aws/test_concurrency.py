"""The bound on a deployed agent's concurrent steps, with the state machine executing on moto:
five runs of an agent with `max_concurrent=2` started at once never have more than two steps
at work; a run that finds both slots taken waits in `Queued` (a Wait state) without using an
attempt, and every run finishes. The slots are given back: none is held at the end. The bound
is the agent's, however its runs name it: a deployment's override by the name it registers the
agent under bounds the runs started by that name, by its module:attr and by another name of it."""

from __future__ import annotations

import json
import time

import pytest

from ratchet.adapters.dynamodb.slots import DynamoDbSlots
from ratchet.client import Client
from ratchet.errors import InvalidInput
from ratchet.handlers import _wiring, step
from ratchet.state import RunStatus
from tests.integration.aws.agents import HELDOUT_IN_FLIGHT, IN_FLIGHT, WORLD
from tests.integration.aws.harness import AGENTS, TABLES, FakeContext, Stack, entered_states

RUNS = [f"bounded-{n}" for n in range(5)]
HELDOUT = "tests.integration.aws.agents:heldout"
REGISTERED = {
    **AGENTS,
    "heldout-override": HELDOUT,
    "heldout-alias": "tests.integration.aws.agents:heldout_alias",
}
"""The deployment registers `heldout` under a name of its own (not the agent's name), and under
a second name whose target is another import path of it."""
NAMINGS = {
    "registered name": "heldout-override",
    "module:attr": HELDOUT,
    "second registered name": "heldout-alias",
}
"""How a run may name the agent in `POST /runs`, each naming started twice."""


def _queued(stack: Stack, names: list[str]) -> bool:
    return any("Queued" in entered_states(stack.history(name)) for name in names)


def test_five_runs_bounded_at_two_never_have_more_than_two_steps_at_work(stack: Stack):
    stack.configure(queue_retry_seconds=1)
    IN_FLIGHT.open.clear()
    names = []
    for run_id in RUNS:
        status, started = stack.post_run(
            {"agent": "bounded", "run_id": run_id, "input": {"batches": 2}}
        )
        assert status == 201, started
        names.append(started["execution_name"])

    deadline = time.monotonic() + 60
    # Two runs hold the slots, in their tools, and a third found none.
    while not (IN_FLIGHT.now == 2 and _queued(stack, names)):
        assert IN_FLIGHT.now <= 2, f"{IN_FLIGHT.now} steps of a bound-2 agent at work"
        assert time.monotonic() < deadline, "no run waited for a slot"
        time.sleep(0.05)
    IN_FLIGHT.open.set()

    for name in names:
        assert stack.finished(name, timeout=120)["status"] == "SUCCEEDED"
    assert IN_FLIGHT.most == 2
    for run_id in RUNS:
        head = stack.head(run_id)
        assert head.status is RunStatus.DONE
        assert head.attempts <= 1, "a queued step used an attempt"
        assert sorted(WORLD.deliveries_of(run_id).values()) == [1, 1]  # each step applied once
    assert stack.head(RUNS[0]).agent == AGENTS["bounded"]
    slots = DynamoDbSlots(stack.dynamodb, TABLES["checkpoints"])
    assert slots.holders("bounded") == {}  # every step gave its slot back (the agent's name's)


def test_an_override_by_a_registered_name_bounds_the_agent_under_every_name_it_runs_by(
    stack: Stack,
):
    # Given `heldout` (no bound of its own) bounded at 2 by the name the deployment registers
    # it under, and two runs started by each of three namings of it.
    stack.configure(
        agents=json.dumps(REGISTERED),
        max_concurrent=json.dumps({"heldout-override": 2}),
        queue_retry_seconds=1,
    )
    HELDOUT_IN_FLIGHT.open.clear()
    runs = {naming: [f"{agent}-{n}" for n in range(2)] for naming, agent in NAMINGS.items()}
    names = []
    for naming, agent in NAMINGS.items():
        for run_id in runs[naming]:
            status, started = stack.post_run(
                {"agent": agent, "run_id": run_id, "input": {"batches": 2}}
            )
            assert status == 201, started
            names.append(started["execution_name"])
    assert {stack.head(run).agent for run in runs["registered name"]} == {HELDOUT}

    # When two hold the slots, in their tools, until another found none.
    deadline = time.monotonic() + 60
    try:
        while not (HELDOUT_IN_FLIGHT.now == 2 and _queued(stack, names)):
            at_work = HELDOUT_IN_FLIGHT.now
            assert at_work <= 2, f"{at_work} steps of an agent bounded at 2 at work"
            assert time.monotonic() < deadline, "no run waited for a slot"
            time.sleep(0.05)
    finally:
        HELDOUT_IN_FLIGHT.open.set()  # a failed check lets the held steps go at once

    # Then never more than 2 were at work, under any naming or all together.
    for name in names:
        assert stack.finished(name, timeout=120)["status"] == "SUCCEEDED"
    most = {naming: HELDOUT_IN_FLIGHT.most_of(ids) for naming, ids in runs.items()}
    most["together"] = HELDOUT_IN_FLIGHT.most
    print(f"most steps at work, bound 2 by 'heldout-override': {most}")
    assert most["together"] == 2, most
    for run_id in [run for ids in runs.values() for run in ids]:
        assert stack.head(run_id).status is RunStatus.DONE
        assert stack.head(run_id).attempts <= 1, "a queued step used an attempt"
    slots = DynamoDbSlots(stack.dynamodb, TABLES["checkpoints"])
    assert slots.holders("heldout") == {}  # the agent's slots, all given back


def test_the_step_function_refuses_to_step_under_a_bound_that_names_no_agent(stack: Stack):
    # Given a run of `heldout`, and a bound keyed by the agent's own name, which is not a name
    # the deployment registers it under (the synth refuses it too): it would bound nothing.
    stack.configure(agents=json.dumps(REGISTERED))
    client = Client(_wiring.runtime(), agents=_wiring.agents())
    client.start(run_id="unbounded", agent="heldout-override", input={"batches": 1})
    stack.configure(max_concurrent=json.dumps({"heldout": 2}))

    # When the step function is invoked for it (its cold start reads the bound).
    with pytest.raises(InvalidInput) as refused:
        step.handler({"run_id": "unbounded"}, FakeContext("ratchet-step", "arn:ratchet-step"))

    # Then it refuses in one line naming the key, and the run is as it was started.
    said = str(refused.value)
    assert said.startswith(
        "RATCHET_MAX_CONCURRENT: 'heldout' names no agent: use a name this deployment "
        "registers (bounded, "
    ), said
    assert "heldout-override" in said
    assert "\n" not in said
    stack.configure(max_concurrent="")  # the handlers that read the run (unset, as on AWS)
    head = stack.head("unbounded")
    assert (head.status, head.step, head.attempts) == (RunStatus.RUNNING, 0, 0)
