"""`last_of`, the search `resume` finds a run's latest execution with: the last number of an
unbroken run, in about 2 log2(n) + 2 probes (each a DescribeExecution call on AWS)."""

from __future__ import annotations

import math

import pytest

from ratchet.adapters.stepfunctions import last_of


@pytest.mark.parametrize("first", [0, 1_000_000])
@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 7, 8, 9, 100, 999, 1000, 1001, 65_537])
def test_last_of_finds_the_last_number_of_the_run_in_few_probes(first: int, length: int):
    probed: list[int] = []

    def holds(number: int) -> bool:
        probed.append(number)
        return first <= number < first + length

    assert last_of(holds, first) == first + length - 1
    assert len(probed) <= 2 * math.ceil(math.log2(length + 1)) + 2, probed
    assert min(probed) == first


def test_last_of_is_none_when_the_first_does_not_hold():
    probed: list[int] = []

    def holds(number: int) -> bool:
        probed.append(number)
        return False

    assert last_of(holds, 5) is None
    assert probed == [5]
