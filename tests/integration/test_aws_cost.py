"""`bench.aws_cost` at a small scale: what it counts on moto for one step per invocation and for
several, exactly, and that several per invocation meets the cost target."""

from __future__ import annotations

from bench.aws_cost import TARGET_DOLLARS, count_run, report


def test_one_step_per_invocation_is_two_transitions_and_five_requests_a_step():
    counts = count_run(1, steps=6)

    # Begin, (Step, Route) for each step, Done.
    assert (counts.invocations, counts.transitions) == (6, 2 * 6 + 2)
    # Each step: the head, its window, the recorded decision, its attempt and its commit
    # (the run's creation is one more transaction and window read).
    assert counts.requests == {
        "GetItem": 6,
        "Query": 7,
        "PutItem": 6,
        "UpdateItem": 6,
        "TransactWriteItems": 7,
    }


def test_several_steps_per_invocation_count_each_attempt_as_it_begins_and_meet_the_target():
    counts = count_run(10, steps=20)

    assert (counts.invocations, counts.transitions) == (2, 2 * 2 + 2)
    # Every step counts its attempt by a write of its own as it begins, not in the commit of
    # the step before (an invocation dying between the two would leave a strike).
    assert counts.requests["UpdateItem"] == 20
    assert counts.requests["TransactWriteItems"] == 21
    assert sum(counts.dollars().values()) <= TARGET_DOLLARS
    shown = report([counts])
    assert " met" in shown
    assert "missed" not in shown
