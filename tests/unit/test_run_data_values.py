"""A run's data keeps text (issue 36): a value of another type is refused saying what to do."""

from __future__ import annotations

import pytest

from ratchet.adapters.run_data import checked_value
from ratchet.errors import InvalidInput


def test_a_value_that_is_not_text_is_refused_saying_how_to_keep_it():
    with pytest.raises(InvalidInput, match=r"^a run data value is text \(json\.dumps anything"):
        checked_value({"cents": 500})
